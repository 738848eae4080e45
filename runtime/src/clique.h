// A clique: the communicators created together by one ncclCommInitAll (or one in-process
// ncclCommInitRank* rendezvous, init_rank.h), one per rank, sharing
// one registry, one executor cache and the rendezvous where the ranks' calls meet. Several
// ranks may live on one GPU.
//
// Collectives meet in per-rank queues: a call runs once every rank has queued its call of the
// same sequence number (from one thread's group, or from one thread per rank), after checking
// that they agree. Send/receive pairs are matched within one group (single process: the thread
// that ends the group has posted both sides).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api_status.h"
#include "call.h"
#include "efccl/device/device_executor.h"
#include "registry.h"

namespace efccl::runtime {

class Clique {
 public:
  /// Creates the clique's events on every device; `rank_devices[r]` is rank r's GPU.
  static StatusOr<std::shared_ptr<Clique>> create(std::vector<int> rank_devices,
                                                  std::unique_ptr<Registry> registry);
  ~Clique();
  Clique(const Clique&) = delete;
  Clique& operator=(const Clique&) = delete;

  int32_t nranks() const { return static_cast<int32_t>(rank_devices_.size()); }
  int device(int32_t rank) const { return rank_devices_[static_cast<std::size_t>(rank)]; }

  /// The calls of one outermost group that belong to this clique, in call order.
  /// `whole_clique`: the group holds calls of every rank, so nothing may stay unmatched.
  ApiStatus submit(std::vector<Call> calls, bool whole_clique);

  /// Non-blocking: the first failure a kernel reported (or the abort), as ncclCommGetAsyncError
  /// returns it.
  ApiStatus async_error();
  /// Makes every kernel of the clique give up (DeviceExecutor::abort); later calls fail.
  void abort(int32_t rank);
  /// Waits until the rank's device has finished the clique's work, then reports async_error().
  ApiStatus finalize(int32_t rank);

 private:
  Clique(std::vector<int> rank_devices, std::unique_ptr<Registry> registry);

  /// One executor run: `ranks[i]` is program rank i's clique rank, `streams[i]` its stream.
  struct Launch {
    device::DeviceExecutor* executor = nullptr;
    device::RunArgs args;
    std::vector<int32_t> ranks;
    std::vector<cudaStream_t> rank_streams;
  };

  ApiStatus run_collective(std::vector<Call>& set, bool* mismatch);
  ApiStatus run_p2p(const std::vector<Call>& calls);
  ApiStatus launch(Launch& l);
  ApiStatus executor_for(const ef::Program& program, const std::string& key,
                         const std::vector<int>& devices, bool capturing, uint64_t count,
                         ef::DataType dtype, device::DeviceExecutor** out);
  StatusOr<bool> any_capturing(const std::vector<cudaStream_t>& streams) const;

  std::vector<int> rank_devices_;
  std::unique_ptr<Registry> registry_;
  std::chrono::nanoseconds timeout_;

  std::mutex mu_;
  std::vector<std::deque<Call>> pending_;  ///< collectives per rank, waiting for the others
  std::vector<uint64_t> next_sequence_;    ///< per rank
  uint64_t launches_ = 0;                  ///< calls run, for the logs (NCCL's opCount)
  struct CachedExecutor {
    std::unique_ptr<device::DeviceExecutor> executor;
    uint64_t last_use = 0;
  };
  std::map<std::string, CachedExecutor> executors_;
  uint64_t use_clock_ = 0;
  std::vector<cudaEvent_t> ready_;  ///< per rank: recorded on its stream before a launch
  std::vector<cudaEvent_t> done_;   ///< per rank: recorded on the launch stream after it
  std::atomic<bool> aborted_{false};
  /// Guards only the list below and async_error_, never held across a blocking call, so that
  /// abort() and async_error() return at once even while another thread launches.
  std::mutex exec_list_mu_;
  std::vector<device::DeviceExecutor*> live_executors_;
  ApiStatus async_error_;  ///< sticky once set
};

}  // namespace efccl::runtime
