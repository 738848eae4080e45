// A clique: the communicators created together by one ncclCommInitAll (or one in-process
// ncclCommInitRank* rendezvous, comm/rendezvous.h), one per rank of this process, sharing one
// program registry, one executor store and the queue where the ranks' calls meet. Several ranks
// may live on one GPU.
//
// A submission (enqueue/group.h hands over the calls of one thread's group, or one ungrouped
// call) goes: the call queue admits the collectives and hands back the sets that became
// complete (call_queue.h: which calls wait for the others and which return at once); the
// runners (launch/collective_runner.h, launch/p2p_runner.h) add one executor run per program
// piece or send/receive round to the submission's LaunchBatch; the batch is flushed once (one
// fused launch per device and stream where the kernels allow); the queue learns how the sets
// went.
//
// Multi-process communicators (ncclCommInitRank* across processes): the clique holds the ranks
// of this process ("local"); the others run in their own processes, each with its own clique,
// and the kernels meet through connection memory shared by CUDA IPC (launch/executor_store.h).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "efccl/topology/cluster.h"
#include "enqueue/call_queue.h"
#include "launch/balancer.h"
#include "launch/call.h"
#include "launch/collective_fallback.h"
#include "launch/executor_store.h"
#include "launch/launch_batch.h"
#include "launch/launch_context.h"
#include "launch/process_map.h"
#include "launch/rank_streams.h"
#include "select/program_registry.h"

namespace efccl::runtime {

class ServedCalls;

class Clique {
 public:
  /// Creates the clique's events on every device; `rank_devices[r]` is rank r's GPU (for a
  /// rank of another process: its GPU there, used in messages only). `processes`: null when
  /// every rank is in this process.
  static StatusOr<std::shared_ptr<Clique>> create(std::vector<int> rank_devices,
                                                  std::unique_ptr<ProgramRegistry> registry,
                                                  std::unique_ptr<ProcessMap> processes = nullptr);
  ~Clique();
  Clique(const Clique&) = delete;
  Clique& operator=(const Clique&) = delete;

  int32_t nranks() const { return static_cast<int32_t>(launch_.rank_devices.size()); }
  int device(int32_t rank) const { return launch_.device(rank); }
  /// Whether rank `rank` runs in this process.
  bool is_local(int32_t rank) const { return launch_.is_local(rank); }
  /// Ranks of this process.
  int32_t nlocal() const { return nlocal_; }
  /// Null for a single-process clique.
  const ProcessMap* processes() const { return processes_.get(); }

  /// Rank `rank` is driven by the thread `thread` (this_thread_token() of the thread that
  /// initialised it; call_queue.h).
  void set_driver(int32_t rank, uint64_t thread);
  /// The calls of one outermost group that belong to this clique, in call order.
  /// `whole_clique`: the group holds calls of every local rank, so nothing may stay unmatched.
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
  /// After abort(): waits until the clique's kernels have ended (they give up within about a
  /// millisecond), without waiting for other work on the devices.
  ApiStatus wait_for_kernels();
  /// ncclCommDestroy (`abort` false) / ncclCommAbort of rank `rank`: drops the queued
  /// collectives, which can no longer run, and tells the other ranks (call_queue.h).
  void release(int32_t rank, bool abort);
  /// A peer process died (its bootstrap connection broke): running kernels give up and
  /// later calls fail with ncclRemoteError naming it.
  void peer_failed(int32_t peer, const std::string& why);
  /// A network connection to another host failed (launch/network_links.h: `code` is
  /// ncclRemoteError when the peer or the link is lost, ncclSystemError for a local failure):
  /// running kernels give up and later calls fail with `code`.
  void network_failed(ncclResult_t code, const std::string& why);
  /// Waits (bounded) until the rank's queued collectives have been launched, then until its
  /// device has finished the clique's work; reports async_error(rank).
  ApiStatus finalize(int32_t rank);

  /// EFCCL_FALLBACK=nccl (fallback/nccl_fallback.h): where collectives no program covers run.
  /// Set once, before the clique's communicators are handed out; null: such calls fail.
  void set_fallback(std::shared_ptr<CollectiveFallback> fallback);
  CollectiveFallback* fallback() const { return fallback_.get(); }
  /// A GPU served by one process (enqueue/served_calls.h), set once before the clique's
  /// communicators are handed out; null: every call runs the usual way.
  void set_served(std::shared_ptr<ServedCalls> served);
  /// Collectives served so far (tests; 0 without a served GPU).
  uint64_t served_calls() const;
  /// Whether one process serves the clique's GPU (set_served was given one).
  bool served() const { return served_ != nullptr; }
  /// The communicator's machine graph (comm/machine_graph.h), set once before the clique is
  /// used; every rank's GPU node in it. `every_process_sees_every_gpu`: across processes,
  /// whether each process sees every GPU of its host (agreed at init; relays as slot devices
  /// need it). Sets up the balancer (launch/balancer.h).
  void set_machine_graph(std::shared_ptr<const topo::ClusterGraph> graph,
                         bool every_process_sees_every_gpu = true);
  const topo::ClusterGraph* machine_graph() const { return machine_graph_.get(); }
  /// How long a call may wait without progress (EFCCL_TIMEOUT_MS).
  std::chrono::nanoseconds timeout() const { return launch_.timeout; }
  /// For tests: executors cached, and how many of them a CUDA graph pins.
  ExecutorStore::Stats executor_cache_stats();

 private:
  Clique(std::vector<int> rank_devices, std::unique_ptr<ProgramRegistry> registry,
         std::unique_ptr<ProcessMap> processes);

  std::unique_ptr<ProgramRegistry> registry_;
  std::unique_ptr<ProcessMap> processes_;  ///< null: single process
  int32_t nlocal_ = 0;
  bool fusion_ = true;  ///< EFCCL_GROUP_FUSION
  std::atomic<bool> aborted_{false};
  /// Another process of the communicator died, or a network connection to it failed.
  std::atomic<bool> peer_gone_{false};

  std::mutex mu_;  ///< guards the queue, the launch context and the executors
  std::unique_ptr<ExecutorStore> executors_;
  std::unique_ptr<RankStreams> streams_;
  std::unique_ptr<CallQueue> queue_;
  std::unique_ptr<LaunchBatch> batch_;  ///< the submission's launches (started per submission)
  LaunchContext launch_;
  std::shared_ptr<CollectiveFallback> fallback_;
  std::shared_ptr<ServedCalls> served_;
  std::shared_ptr<const topo::ClusterGraph> machine_graph_;
  /// EFCCL_RESIDENT=1: this process's GPUs of the clique, whose resident grids it holds
  /// (released after the executors, whose destruction waits for their last posted calls).
  std::vector<int> resident_devices_;
  std::unique_ptr<Balancer> balancer_;  ///< null until set_machine_graph

  /// Guards async_error_ and peer_failure_, never held across a blocking call, so that abort()
  /// and async_error() return at once even while another thread launches.
  std::mutex error_mu_;
  ApiStatus async_error_;   ///< sticky once set
  ApiStatus peer_failure_;  ///< a peer process died, or a network connection failed
};

}  // namespace efccl::runtime
