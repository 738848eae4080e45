// What the runners of one clique share: its ranks and where they run, its program registry, its
// executors and its fallback. Owned by the clique (enqueue/clique.h) and used under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "launch/balancer.h"
#include "launch/collective_fallback.h"
#include "launch/executor_store.h"
#include "launch/process_map.h"
#include "select/p2p_plan.h"
#include "select/program_registry.h"

namespace efccl::runtime {

struct LaunchContext {
  std::vector<int> rank_devices;          ///< per clique rank: its GPU (in its own process)
  const ProcessMap* processes = nullptr;  ///< null: every rank runs in this process
  ProgramRegistry* registry = nullptr;
  ExecutorStore* executors = nullptr;
  CollectiveFallback* fallback = nullptr;  ///< EFCCL_FALLBACK=nccl; null: none
  std::chrono::nanoseconds timeout{};      ///< for kernels' waits and the fallback
  bool direct = true;                      ///< RunArgs::direct (EFCCL_DIRECT)
  uint64_t launches = 0;                   ///< runs so far, for the logs (NCCL's opCount)
  Balancer* balancer = nullptr;            ///< null: no balancing (EFCCL_BALANCE=0)
  /// Across processes: the pair messages planned so far, by (a, b, bytes a->b, bytes b->a,
  /// the all-to-all's bytes per pair or 0), with their executors once prepared
  /// (multi-process executors are never evicted).
  struct PreparedPair {
    /// The balanced part of each direction (a -> b, b -> a), or null.
    std::shared_ptr<const Balancer::Prepared> balanced;
    device::DeviceExecutor* balanced_executors[2] = {nullptr, nullptr};
    uint64_t main_bytes[2] = {0, 0};  ///< per direction: the bytes its balanced program moves
    PairRounds plan;                  ///< rounds of the rest (all of it when not balanced)
    std::vector<device::DeviceExecutor*> executors;  ///< per round; null until prepared
  };
  std::map<std::tuple<int32_t, int32_t, uint64_t, uint64_t, uint64_t>, PreparedPair> pair_rounds;

  int32_t nranks() const { return static_cast<int32_t>(rank_devices.size()); }
  int device(int32_t rank) const { return rank_devices[static_cast<std::size_t>(rank)]; }
  bool is_local(int32_t rank) const {
    return processes == nullptr || processes->local[static_cast<std::size_t>(rank)];
  }
};

/// Whether any of `streams` is being captured into a CUDA graph (an invalidated capture is an
/// error).
StatusOr<bool> any_capturing(const std::vector<cudaStream_t>& streams);

}  // namespace efccl::runtime
