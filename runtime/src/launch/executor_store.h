// The prepared programs (device executors) of one clique, by key: created on first use, shared
// with the other processes of a multi-process communicator through CUDA IPC, joined to the
// ranks of other hosts through network connections (launch/network_links.h), cached
// (launch/executor_cache.h), pinned to the CUDA graphs that captured them, and listed for the
// abort and asynchronous-error paths.
//
// Multi-process executors are created at the same call in every process and never evicted:
// each creation exchanges connection memory with the processes of the program's other ranks,
// named by an exchange tag that every process derives alike (the program's fingerprint, or the
// pair of ranks, and how many executors were created under that name before).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/api_status.h"
#include "efccl/device/device_executor.h"
#include "launch/executor_cache.h"
#include "launch/process_map.h"

namespace efccl::runtime {

class LaunchBatch;

/// What an executor's connection-memory exchange is named after (multi-process only; the name
/// is spelled out only when an executor is created).
struct ExchangeName {
  /// A registry program (named by its fingerprint). Send/receive rounds: the pair of ranks
  /// (a < b).
  const ef::Program* program = nullptr;
  int32_t a = -1, b = -1;
  static ExchangeName of_program(const ef::Program& p) { return {&p, -1, -1}; }
  static ExchangeName pair(int32_t a, int32_t b) { return {nullptr, a, b}; }
};

class ExecutorStore {
 public:
  /// `rank_devices[r]`: clique rank r's GPU. `processes`: null for a single-process clique.
  /// `timeout` bounds an exchange; `abort` and `peer_gone` (set when another process of the
  /// communicator died) make it give up.
  ExecutorStore(std::vector<int> rank_devices, const ProcessMap* processes, std::size_t capacity,
                std::chrono::nanoseconds timeout, const std::atomic<bool>* abort,
                const std::atomic<bool>* peer_gone);
  /// Destroys every executor (each waits for its own launches).
  ~ExecutorStore();
  ExecutorStore(const ExecutorStore&) = delete;
  ExecutorStore& operator=(const ExecutorStore&) = delete;

  /// The cache key of a program keyed `key` over clique ranks `ranks` (program rank i is clique
  /// rank ranks[i]).
  std::string cache_key(const std::string& key, const std::vector<int32_t>& ranks);
  /// The cached executor under a cache_key (marked as just used), or null.
  device::DeviceExecutor* find(const std::string& cache_key);

  /// The executor of `program` over `ranks` under `key` (`config` must be implied by `key`):
  /// cached, or created now. Creating one may evict another (unless `capturing` or shared with
  /// other processes) and, across processes, waits for them: the batch's pending launches are
  /// flushed first. Its scratch is sized for `count` elements of `dtype`.
  ApiStatus get(const ef::Program& program, const std::string& key,
                const std::vector<int32_t>& ranks, bool capturing, uint64_t count,
                ef::DataType dtype, const ExchangeName& exchange, LaunchBatch& batch,
                device::DeviceExecutor** out, const device::ExecutorConfig& config = {});

  /// Before a launch: fails when an earlier launch of `executor` failed; while `capturing`,
  /// pins it to every graph that `streams` are being captured into.
  ApiStatus ready_to_launch(const device::DeviceExecutor& executor,
                            const std::vector<cudaStream_t>& streams, bool capturing);

  /// A key naming the program's content, equal in every process for equal programs.
  const std::string& fingerprint(const ef::Program& program);

  /// Where a failed network connection is reported (from a proxy thread: must not block);
  /// set once, before the first executor with network connections is created.
  using NetworkFailureHandler = std::function<void(ncclResult_t code, const std::string& why)>;
  void set_network_failure_handler(NetworkFailureHandler handler) {
    network_failure_ = std::move(handler);
  }

  /// Thread-safe (not under the clique's lock): every executor's kernels give up.
  void abort_all();
  /// Waits for every executor's eager launches so far (only this clique's kernels, not the rest
  /// of the devices' work). Under the clique's lock, like get().
  Status wait_launches();
  /// A failure a kernel posted, and the program it ran.
  struct KernelFailure {
    std::string program;
    Status status;  ///< ok: no kernel has failed
  };
  /// Thread-safe: the first failure found among the executors' kernels.
  KernelFailure first_kernel_failure();
  /// The result code of a failure a kernel posted: a stall, an abort or a skip is
  /// ncclSystemError, anything else ncclInternalError.
  static ncclResult_t kernel_failure_code(const std::string& message);

  struct Stats {
    std::size_t size = 0, pinned = 0, capacity = 0;
  };
  Stats stats() const;
  bool multiprocess() const { return processes_ != nullptr; }

 private:
  /// The connection-memory exchange for an executor over `ranks` (null when all are local).
  std::unique_ptr<device::PeerProcesses> peers_for(const std::vector<int32_t>& ranks,
                                                   const std::string& key, uint64_t tag);
  uint64_t exchange_tag(const ExchangeName& name);
  ApiStatus pin_to_captures(const device::DeviceExecutor* executor,
                            const std::vector<cudaStream_t>& streams);

  const std::vector<int> rank_devices_;
  const ProcessMap* const processes_;
  const std::chrono::nanoseconds timeout_;
  const std::atomic<bool>* const abort_;
  const std::atomic<bool>* const peer_gone_;
  ExecutorCache<device::DeviceExecutor> cache_;
  std::string all_ranks_suffix_;  ///< cache keys of programs over every rank, in order
  std::map<std::string, uint64_t> program_exchanges_;               ///< per fingerprint
  std::map<std::pair<int32_t, int32_t>, uint64_t> pair_exchanges_;  ///< per pair of ranks
  std::map<const ef::Program*, std::string> fingerprints_;
  /// Guards only the list, never held across a blocking call, so that abort_all() and
  /// first_kernel_failure() return at once even while another thread launches.
  mutable std::mutex live_mu_;
  std::vector<device::DeviceExecutor*> live_;
  NetworkFailureHandler network_failure_;
};

}  // namespace efccl::runtime
