// Where the collective calls of one clique's local ranks meet (clique.h). Each local rank's
// collectives queue in call order; the k-th call of every local rank forms set k, which is
// ready as soon as its last call is queued: admit() hands the ready sets back to the thread that
// queued it, which runs them (the clique's runners) and then reports how they went (settle()).
// The queue checks that the calls of a set agree (collective, count, datatype, operator, root);
// running them is not its business.
//
// Threads and ranks (docs/runtime.md). NCCL returns from a collective once its work is on the
// caller's stream, so whatever the caller enqueues next on that stream (or captures) comes
// after it. A call whose set is still incomplete therefore waits for the set to run, unless
// that would deadlock: every rank has a driver, the thread that last submitted a call for it
// (at first the thread that initialised it: ncclCommInitAll, or ncclCommInitRank* /
// ncclCommSplit from one thread in a group, make that thread the driver of all those ranks;
// one thread per rank makes one driver each). A submission (an ungrouped call, or one thread's
// outermost ncclGroupEnd) whose incomplete sets miss only ranks driven by other live threads
// waits until they ran. If a missing rank is driven by the submitting thread itself (one thread
// driving several ranks without a group, legal in NCCL) or by a thread that has exited (whose
// ranks some thread, maybe this one, has taken over), the submission returns at once and its
// calls stay queued until the missing calls come. Every wait ends at the
// deadline (EFCCL_TIMEOUT_MS) or the communicator's abort; a set that stays incomplete that
// long, waited for or not, is dropped with an error naming the ranks that never made their call.
//
// Dropped sets. When a set cannot run (the ranks' calls disagree, its run failed, a deadline
// passed, a rank was destroyed or aborted), every rank of it sees the error: as the return code
// where its call is still in flight (its submission has not returned), else through
// ncclCommGetAsyncError, which reports it from then on. A failed set is consumed; a
// disagreement, a deadline or a departed rank drops every queued call, since the ranks no
// longer agree on what comes next, and realigns their call numbers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "enqueue/thread_token.h"
#include "launch/call.h"

namespace efccl::runtime {

class CallQueue {
 public:
  /// The calls of one submission; opaque to callers, who only hand it back to wait().
  struct Submission;

 private:
  struct Entry {
    Call call;
    std::shared_ptr<Submission> from;
    std::chrono::steady_clock::time_point queued_at;
  };

 public:
  /// The sets one admit() made ready, to be run by the caller and then passed to settle().
  class Admission {
   public:
    /// The local ranks' calls of each ready set, by ascending rank.
    const std::vector<std::vector<Call>>& ready() const { return ready_; }

   private:
    friend class CallQueue;
    std::shared_ptr<Submission> submission;
    std::vector<std::vector<Call>> ready_;
    std::vector<std::vector<Entry>> entries;  ///< per ready set
    ApiStatus refused;                        ///< the queue refused the calls (nothing queued)
    ApiStatus mismatch;                       ///< the set after the ready ones disagrees
    std::vector<Entry> mismatched;
    bool whole_clique = false;
  };

  /// `local[r]`: rank r runs in this process (only local ranks queue calls). `timeout`: the
  /// longest a set may stay incomplete. `abort`: the communicator's abort flag (may be null).
  CallQueue(std::vector<bool> local, std::chrono::nanoseconds timeout,
            const std::atomic<bool>* abort);

  // The owner serialises every member function below except error_of() with one mutex (the
  // clique's), held by the caller; wait() and flush() release it while they wait. Between
  // admit() and settle() the owner keeps holding it.

  /// Rank `rank` is driven by the thread `thread` (this_thread_token() of its initialising thread).
  void set_driver(int32_t rank, uint64_t thread);
  /// Queues `calls` (collectives of ranks of this process, in call order) for the calling
  /// thread and takes out every set that is now complete and whose calls agree. A set whose
  /// calls disagree stops the admission: it and every other queued call are dropped at settle().
  /// `whole_clique`: the calls cover every local rank, so nothing may stay queued (an unmatched
  /// call is a mismatch).
  Admission admit(std::vector<Call> calls, bool whole_clique);
  /// Reports how the admission's ready sets went (`ran[i]` for ready()[i]) and applies what
  /// admit() found; returns the first failure among the submission's calls so far. When some of
  /// them are still queued, `*unfinished` receives the submission (pass it to wait()).
  ApiStatus settle(Admission& admission, const std::vector<ApiStatus>& ran,
                   std::shared_ptr<Submission>* unfinished);
  /// Waits until the submission's queued calls ran or were dropped, unless a rank they wait
  /// for is driven by the calling thread (then it returns at once; see above). Returns the
  /// first failure among the submission's calls.
  ApiStatus wait(const std::shared_ptr<Submission>& submission, std::unique_lock<std::mutex>& lock);
  /// ncclCommFinalize: waits until rank `rank` has no queued call. Refused at once when a rank
  /// they wait for is driven by the calling thread (it could never come).
  ApiStatus flush(int32_t rank, std::unique_lock<std::mutex>& lock);
  /// ncclCommDestroy / ncclCommAbort of rank `rank` (`how`: e.g. "destroyed (ncclCommDestroy)"):
  /// its calls will never come, so every queued call is dropped and every other local rank
  /// is told; later submissions fail at once.
  void remove_rank(int32_t rank, const std::string& how);
  /// Drops the incomplete sets when the oldest has waited past the deadline.
  void expire();
  /// The error of a call of rank `rank` that was dropped after its submission returned (ok
  /// when none). Thread-safe without the owner's mutex.
  ApiStatus error_of(int32_t rank) const;
  /// Calls of rank `rank` still queued (tests and logs).
  std::size_t queued(int32_t rank) const { return queues_[static_cast<std::size_t>(rank)].size(); }

 private:
  bool all_ready() const;
  /// Why the calls of one set disagree ("" when they agree).
  static std::string disagreement(const std::vector<Entry>& set);
  /// The local ranks that have not yet queued the call of some set holding one of the given
  /// entries (`of` says which entries count).
  std::set<int32_t> missing_for(const std::function<bool(const Entry&)>& of) const;
  /// Whether one of `ranks` may be driven by the calling thread: it drives it, or its driver
  /// has exited.
  bool maybe_driven_here(const std::set<int32_t>& ranks) const;
  /// The oldest incomplete set, as an error: who waited, since when, for whom.
  ApiStatus incomplete_error(const std::string& why) const;
  std::string timed_out() const;
  void deliver(Entry& e, const ApiStatus& status);
  /// Drops every queued call with `status`. Local ranks that had not queued their call of a
  /// dropped set are told too (through error_of) when they are driven by another thread or
  /// when `tell_everyone`; call numbers are realigned.
  void drop_all(const ApiStatus& status, bool tell_everyone);
  void set_error(int32_t rank, const ApiStatus& status);
  /// A failure that makes waiting pointless: the communicator was aborted.
  bool aborted() const { return abort_ != nullptr && abort_->load(); }

  const std::vector<bool> local_;
  const std::chrono::nanoseconds timeout_;
  const std::atomic<bool>* const abort_;
  std::vector<std::deque<Entry>> queues_;  ///< per rank
  std::vector<uint64_t> next_sequence_;    ///< per rank
  std::vector<uint64_t> drivers_;          ///< per rank: this_thread_token() of its driver
  std::vector<std::string> gone_;          ///< per rank: how it left ("" while it is here)
  std::condition_variable cv_;             ///< a queued call ran or was dropped

  mutable std::mutex errors_mu_;
  std::vector<ApiStatus> errors_;  ///< per rank, under errors_mu_: sticky once set
};

}  // namespace efccl::runtime
