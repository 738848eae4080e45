// A process group's watchdog: a thread that follows every work until its GPU part finished,
// turns efccl's asynchronous errors and passed deadlines into failures of the group (with a
// report naming the ranks that never reached the collective), and revokes the group's
// communicators so that nothing waits forever. Like ProcessGroupNCCL's, but it does not end
// the process: the failure is raised by the works and by every later call on the group.
//
// Naming the missing ranks: a rank whose oldest unfinished work comes within `lead` of its
// deadline publishes "<seq> <op>" under efccl/pending/<rank> in the group's store. When the
// deadline passes (or efccl's own timeout fires around it), the failing rank reads the other
// ranks' keys: ranks that published the same collective are stuck in it too; ranks that
// published none have not called it (or hang elsewhere) — those are named.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "communicator.h"
#include "group_state.h"
#include "work_efccl.h"

namespace efccl::torch_backend {

/// A host call into efccl in progress (the calling thread may block inside it: an executor's
/// first exchange with the other processes); the watchdog fails it at its deadline.
struct CallInProgress {
  std::atomic<int64_t> started_ns{0};  ///< steady clock; 0: none
  std::atomic<int64_t> timeout_ms{0};
  std::atomic<uint64_t> seq{0};
  std::atomic<const char*> op{""};
};

class Watchdog {
 public:
  Watchdog(std::shared_ptr<GroupState> group, c10::intrusive_ptr<c10d::Store> store);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Starts the thread (once).
  void start();
  /// Stops and joins the thread; works still followed stay as they are.
  void stop();

  void add_communicator(std::shared_ptr<Communicator> comm);
  /// Follows `work` until it finished (drops its stash then) or failed.
  void track(c10::intrusive_ptr<WorkEfccl> work);
  /// Unfinished works followed.
  int pending() const;
  /// Waits until every followed work finished or failed, at most `limit`; whether they did.
  bool drain(std::chrono::milliseconds limit);

  CallInProgress& call() { return call_; }

  /// What the other ranks reported about collective #`seq` (`op`): ". Missing: rank 1 never
  /// reached ..." ("" when every rank is accounted for).
  std::string report_for(uint64_t seq, const char* op);

  /// Fails the group with `reason`, every followed work with it, and revokes the
  /// communicators (the first failure wins; later ones only fail their works).
  void fail_group(const std::string& reason);
  /// Fails the group because efccl reported `efccl_error` when `work` finished; returns the
  /// text `work` fails with (with the other ranks' report when near its deadline).
  std::string fail_for(const WorkEfccl& work, const std::string& efccl_error);

 private:
  void loop();
  /// One pass: errors, finished works, deadlines, reports.
  void check();
  /// efccl/pending/<rank> := "<seq> <op>" for `work` (once), or deleted when `work` is null.
  void publish_pending(const WorkEfccl* work);
  /// What the other ranks reported about collective #`seq` ("" when nothing useful).
  std::string missing_ranks_report(uint64_t seq, const char* op);
  c10d::Store& report_store();

  const std::shared_ptr<GroupState> group_;
  const c10::intrusive_ptr<c10d::Store> store_;
  std::mutex report_mutex_;  ///< report_store_'s creation (the loop and callers of report_for)
  c10::intrusive_ptr<c10d::Store> report_store_;  ///< a clone (own connection), or store_

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkEfccl>> works_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  bool stopping_ = false;
  std::thread thread_;
  CallInProgress call_;
  uint64_t published_seq_ = 0;  ///< the work whose pending key is set (0: none); loop thread only
};

/// Whether failures are logged to stderr (NCCL_DEBUG / EFCCL_DEBUG at WARN or INFO).
bool warnings_enabled();

}  // namespace efccl::torch_backend
