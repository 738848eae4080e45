// A clique: the communicators created together by one ncclCommInitAll (or one in-process
// ncclCommInitRank* rendezvous, init_rank.h), one per rank, sharing
// one registry, one executor cache and the rendezvous where the ranks' calls meet. Several
// ranks may live on one GPU.
//
// Collectives meet in per-rank queues (call_queue.h): a call runs once every rank has queued
// its call of the same sequence number (from one thread's group, or from one thread per rank),
// after checking that they agree; which calls wait for the others and which return at once is
// call_queue.h's rule (docs/runtime.md). Send/receive pairs are matched within one group
// (single process: the thread that ends the group has posted both sides).
//
// Multi-process communicators (ncclCommInitRank* across processes): the clique holds the
// ranks of this process ("local"); the others run in their own processes, each with its own
// clique, and the kernels meet through connection memory shared by CUDA IPC. A collective
// runs once every local rank has queued it; executors are created at the same call in every
// process (deterministically, never evicted) and exchange their arenas through the bootstrap
// of this process's lowest rank. Send/receive runs per pair of ranks in one global order.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "base/api_status.h"
#include "launch/call.h"
#include "enqueue/call_queue.h"
#include "efccl/device/device_executor.h"
#include "launch/executor_cache.h"
#include "select/program_registry.h"

namespace efccl::runtime {

class Bootstrap;
class CliqueFallback;

/// Where the ranks of a multi-process communicator run.
struct ProcessMap {
  std::vector<bool> local;        ///< per rank: runs in this process
  std::vector<int64_t> location;  ///< per rank: equal for ranks sharing a process and GPU
  std::vector<int32_t> leader;    ///< per rank: the lowest rank of its process
  std::vector<std::string> where; ///< per rank: "host pid N" for messages
  /// The bootstraps of this process's ranks; the first is the leader's (exchanges go there).
  std::vector<std::shared_ptr<Bootstrap>> bootstraps;
};

class Clique {
 public:
  /// Creates the clique's events on every device; `rank_devices[r]` is rank r's GPU (for a
  /// rank of another process: its GPU there, used in messages only). `processes`: null when
  /// every rank is in this process.
  static StatusOr<std::shared_ptr<Clique>> create(std::vector<int> rank_devices,
                                                  std::unique_ptr<Registry> registry,
                                                  std::unique_ptr<ProcessMap> processes = nullptr);
  ~Clique();
  Clique(const Clique&) = delete;
  Clique& operator=(const Clique&) = delete;

  int32_t nranks() const { return static_cast<int32_t>(rank_devices_.size()); }
  int device(int32_t rank) const { return rank_devices_[static_cast<std::size_t>(rank)]; }
  /// Whether rank `rank` runs in this process.
  bool is_local(int32_t rank) const {
    return processes_ == nullptr || processes_->local[static_cast<std::size_t>(rank)];
  }
  /// Ranks of this process.
  int32_t nlocal() const { return nlocal_; }

  /// Rank `rank` is driven by the thread `thread` (this_thread_token() of the thread that
  /// initialised it; call_queue.h).
  void set_driver(int32_t rank, uint64_t thread);
  /// The calls of one outermost group that belong to this clique, in call order.
  /// `whole_clique`: the group holds calls of every rank, so nothing may stay unmatched.
  /// Collectives still queued afterwards: `*unfinished` receives them, for wait().
  ApiStatus submit(std::vector<Call> calls, bool whole_clique,
                   std::shared_ptr<CallQueue::Submission>* unfinished);
  /// Waits for queued collectives of a submission as CallQueue::wait does.
  ApiStatus wait(const std::shared_ptr<CallQueue::Submission>& unfinished);

  /// The registry's plan for a call shape (what a collective of that shape would run).
  StatusOr<Plan> select(const CallShape& shape);
  /// The registry's protocol for point-to-point transfers of `bytes`.
  ef::Protocol p2p_protocol(uint64_t bytes) const { return registry_->p2p_protocol(bytes); }

  /// Non-blocking: the first failure a kernel reported (or the abort), else the failure of a
  /// call of rank `rank` dropped after it returned, as ncclCommGetAsyncError returns it.
  ApiStatus async_error(int32_t rank);
  /// Makes every kernel of the clique give up (DeviceExecutor::abort); later calls fail.
  void abort(int32_t rank);
  /// ncclCommDestroy (`abort` false) / ncclCommAbort of rank `rank`: drops the queued
  /// collectives, which can no longer run, and tells the other ranks (call_queue.h).
  void release(int32_t rank, bool abort);
  /// A peer process died (its bootstrap connection broke): running kernels give up and
  /// later calls fail with ncclRemoteError naming it.
  void peer_failed(int32_t peer, const std::string& why);
  /// Waits (bounded) until the rank's queued collectives have been launched, then until its
  /// device has finished the clique's work; reports async_error(rank).
  ApiStatus finalize(int32_t rank);

  /// EFCCL_FALLBACK=nccl (fallback.h): where collectives no program covers run. Set once,
  /// before the clique's communicators are handed out; null: such calls fail.
  void set_fallback(std::shared_ptr<CliqueFallback> fallback) { fallback_ = std::move(fallback); }
  CliqueFallback* fallback() const { return fallback_.get(); }
  /// How long a call may wait without progress (EFCCL_TIMEOUT_MS).
  std::chrono::nanoseconds timeout() const { return timeout_; }
  /// For tests: executors cached, and how many of them a CUDA graph pins.
  struct CacheStats {
    std::size_t size = 0, pinned = 0, capacity = 0;
  };
  CacheStats executor_cache_stats();

 private:
  Clique(std::vector<int> rank_devices, std::unique_ptr<Registry> registry);

  /// One executor run: `ranks[i]` is program rank i's clique rank, `streams[i]` its stream.
  struct Launch {
    device::DeviceExecutor* executor = nullptr;
    device::RunArgs args;
    std::vector<int32_t> ranks;
    std::vector<cudaStream_t> rank_streams;
    bool capturing = false;  ///< a stream is being captured: the graph pins the executor
    /// Set by prepare_launch: per program rank, the index of its device in the executor's
    /// devices(); per device, the program rank whose stream the launch uses.
    std::vector<std::size_t> device_index, launch_rank;
  };

  ApiStatus run_collective(std::vector<Call>& set, bool* mismatch);
  ApiStatus run_p2p(const std::vector<Call>& calls);
  /// Multi-process send/receive: per pair of ranks, in one global order.
  ApiStatus run_p2p_pairs(const std::vector<Call>& calls);
  /// Multi-process: the exchange for an executor over comm ranks `ranks`, or null when they
  /// are all local. `key` identifies the program; `tag` the exchange (equal in every process).
  std::unique_ptr<device::PeerProcesses> peers_for(const std::vector<int32_t>& ranks,
                                                   const std::string& key, uint64_t tag);
  /// Runs `l`, or (while a submission is being run) adds it to batch_.
  ApiStatus launch(Launch& l);
  /// Before a launch: checks the executor, pins it to captures, picks each device's launch
  /// stream and makes it wait for the other ranks' streams on that device.
  ApiStatus prepare_launch(Launch& l);
  /// After a launch: the other ranks' streams wait for it.
  ApiStatus join_after_launch(const Launch& l);
  /// Enqueues batch_ (DeviceExecutor::run_batch: one fused launch per device and stream
  /// where possible) and empties it; remembers the first failure in batch_failure_.
  void flush_batch();
  /// Pins `executor` to every CUDA graph that `streams` are being captured into.
  ApiStatus pin_to_captures(const device::DeviceExecutor* executor,
                            const std::vector<cudaStream_t>& streams);
  /// The executor cache's key of a program keyed `key` over clique ranks `ranks`.
  std::string executor_key(const std::string& key, const std::vector<int32_t>& ranks);
  /// `ranks`: program rank -> clique rank. `tag`: multi-process exchange tag, used only when
  /// the executor is created. Creation may happen during a capture (`capturing`: then nothing
  /// is evicted). `config` must be implied by `key` (it is not part of the cache key).
  ApiStatus executor_for(const ef::Program& program, const std::string& key,
                         const std::vector<int32_t>& ranks, bool capturing, uint64_t count,
                         ef::DataType dtype, const std::function<uint64_t()>& tag,
                         device::DeviceExecutor** out, const device::ExecutorConfig& config = {});
  /// A key naming the program's content (equal in every process for equal programs).
  const std::string& fingerprint(const ef::Program& program);
  StatusOr<bool> any_capturing(const std::vector<cudaStream_t>& streams) const;

  std::vector<int> rank_devices_;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<ProcessMap> processes_;  ///< null: single process
  int32_t nlocal_ = 0;
  /// Multi-process: executors prepared per collective program fingerprint (exchange tags).
  std::map<std::string, uint64_t> collective_exchanges_;
  std::map<std::pair<int32_t, int32_t>, uint64_t> pair_exchanges_;  ///< ... per p2p pair
  std::map<const ef::Program*, std::string> fingerprints_;
  /// Multi-process send/receive: prepared rounds per (a, b, bytes a->b, bytes b->a).
  using PairKey = std::tuple<int32_t, int32_t, uint64_t, uint64_t>;
  struct PairRound {
    device::DeviceExecutor* executor = nullptr;  ///< owned by executors_ (never evicted here)
    uint64_t chunk_bytes = 0;
    std::vector<int32_t> ranks;  ///< program rank -> clique rank
    /// Per program rank: which of the pair's four buffers (a's send, b's receive, b's send,
    /// a's receive) is its input / output, or -1.
    std::vector<int> input_slot, output_slot;
  };
  std::map<PairKey, std::vector<PairRound>> pair_rounds_;
  std::chrono::nanoseconds timeout_;

  std::mutex mu_;
  std::unique_ptr<CallQueue> queue_;  ///< collectives per rank, waiting for the others (under mu_)
  /// While submit() runs (under mu_): the launches of the submission's calls, enqueued together
  /// at its end (before a call runs through the fallback, and before an executor is created
  /// outside a single-process capture, which may evict one of them, the batch so far is
  /// enqueued first).
  bool batching_ = false;
  /// Per program: its runs in the batch so far. Runs of one executor in one fused launch take
  /// turns on the same CTAs; batch_instance() gives later runs of a program other executors
  /// (copies with their own connections), so that up to kMaxBatchInstances of them overlap,
  /// within kBatchInstanceBytes of connection memory per program and device. Single process
  /// only (processes create executors in lockstep, and their batches may differ).
  std::map<const ef::Program*, int> batch_uses_;
  static constexpr int kMaxBatchInstances = 8;
  static constexpr std::size_t kBatchInstanceBytes = std::size_t{64} << 20;
  /// Which copy of `program`'s executor (key `key`) the batch's next run of it uses: 0 for
  /// the first (and outside batches), then 1, 2, ... round robin within the budget.
  int batch_instance(const ef::Program& program, const char* key);
  bool fusion_ = true;  ///< EFCCL_GROUP_FUSION
  std::deque<Launch> batch_;
  ApiStatus batch_failure_;
  uint64_t launches_ = 0;             ///< calls run, for the logs (NCCL's opCount)
  std::string all_ranks_suffix_;      ///< executor keys of programs over every rank (mu_)
  /// all_ranks_suffix_, built on first use.
  const std::string& all_ranks_suffix();
  ExecutorCache<device::DeviceExecutor> executors_;  ///< under mu_
  std::vector<cudaEvent_t> ready_;  ///< per rank: recorded on its stream before a launch
  std::vector<cudaEvent_t> done_;   ///< per rank: recorded on the launch stream after it
  std::atomic<bool> aborted_{false};
  /// Guards only the list below and async_error_, never held across a blocking call, so that
  /// abort() and async_error() return at once even while another thread launches.
  std::mutex exec_list_mu_;
  std::vector<device::DeviceExecutor*> live_executors_;
  ApiStatus async_error_;  ///< sticky once set
  ApiStatus peer_failure_;  ///< a peer process died (under exec_list_mu_)
  std::shared_ptr<CliqueFallback> fallback_;
};

}  // namespace efccl::runtime
