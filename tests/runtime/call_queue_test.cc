// The meeting of the local ranks' collectives (call_queue.h) without a GPU: which submissions
// wait for the others and which return at once, deadlines and abort, dropped sets reported to
// every rank of them, departed ranks, ncclCommFinalize's flush.
#include "enqueue/call_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace efccl::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

Call allreduce(int32_t rank, uint64_t count = 16) {
  Call c;
  c.kind = CallKind::kAllReduce;
  c.rank = rank;
  c.count = count;
  return c;
}

/// A queue over `n` local ranks with the clique's lock, and a run that records the sets the
/// queue made ready (`fail_runs` makes every run fail). The test's thread initialised every rank
/// (as with ncclCommInitAll), so it drives them all at first.
struct Harness {
  explicit Harness(int n, std::chrono::milliseconds timeout = 10s, std::vector<bool> local = {})
      : queue(local.empty() ? std::vector<bool>(static_cast<std::size_t>(n), true) : local, timeout,
              &abort) {
    for (int32_t r = 0; r < n; ++r) queue.set_driver(r, this_thread_token());
  }
  void set_driver(int32_t rank, uint64_t thread) {
    std::lock_guard<std::mutex> lock(mu);
    queue.set_driver(rank, thread);
  }

  /// What Clique::submit + Clique::wait do for one thread's calls.
  ApiStatus call(std::vector<Call> calls, bool whole = false) {
    std::unique_lock<std::mutex> lock(mu);
    std::shared_ptr<CallQueue::Submission> unfinished;
    CallQueue::Admission admission = queue.admit(std::move(calls), whole);
    std::vector<ApiStatus> ran;
    for (const std::vector<Call>& set : admission.ready()) ran.push_back(run(set));
    ApiStatus s = queue.settle(admission, ran, &unfinished);
    if (unfinished != nullptr) {
      ApiStatus w = queue.wait(unfinished, lock);
      if (s) s = w;
    }
    return s;
  }
  ApiStatus call(Call c) { return call(std::vector<Call>{c}); }

  std::size_t sets_run() {
    std::lock_guard<std::mutex> lock(mu);
    return runs.size();
  }

  std::atomic<bool> abort{false};
  std::mutex mu;
  CallQueue queue;
  std::vector<std::vector<int32_t>> runs;  ///< ranks of each set run, under mu
  bool fail_runs = false;
  ApiStatus run(const std::vector<Call>& set) {
    std::vector<int32_t> ranks;
    for (const Call& c : set) ranks.push_back(c.rank);
    runs.push_back(ranks);
    if (fail_runs) return ApiStatus::invalid_usage("first use during capture");
    return ApiStatus::ok();
  }
};

/// A live thread that drives a rank but never calls.
class Bystander {
 public:
  Bystander() {
    std::promise<uint64_t> token;
    std::future<uint64_t> got = token.get_future();
    thread_ = std::thread([&token, f = done_.get_future()]() mutable {
      token.set_value(this_thread_token());
      f.wait();
    });
    token_ = got.get();
  }
  ~Bystander() {
    done_.set_value();
    thread_.join();
  }
  uint64_t token() const { return token_; }

 private:
  std::promise<void> done_;
  std::thread thread_;
  uint64_t token_ = 0;
};

/// The token of a thread that has exited.
uint64_t exited_thread() {
  uint64_t token = 0;
  std::thread([&] { token = this_thread_token(); }).join();
  return token;
}

TEST(CallQueue, ThreadPerRankCallReturnsOnlyOnceItsSetRan) {
  Harness h(2);
  std::atomic<bool> first_returned{false};
  std::size_t sets_when_returned = 99;
  std::thread rank0([&] {
    EXPECT_TRUE(h.call(allreduce(0)).is_ok());
    sets_when_returned = h.sets_run();
    first_returned = true;
  });
  // Rank 0's thread drives it now; rank 1 is still driven by this thread, another one.
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(first_returned.load()) << "rank 0's call returned before rank 1 made its call";
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  rank0.join();
  EXPECT_EQ(sets_when_returned, 1u);  // the set had run when rank 0's call returned
}

TEST(CallQueue, OneThreadDrivingSeveralRanksQueuesInsteadOfWaiting) {
  Harness h(3);
  const auto start = Clock::now();
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  EXPECT_EQ(h.sets_run(), 0u);
  EXPECT_EQ(h.queue.queued(0), 1u);
  EXPECT_TRUE(h.call(allreduce(2)).is_ok());  // the last one runs the set
  EXPECT_EQ(h.sets_run(), 1u);
  EXPECT_EQ(h.queue.queued(0), 0u);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(CallQueue, ARankWhoseThreadExitedDoesNotMakeOthersWait) {
  // Worker threads initialised ranks 1 and 2 and exited; this thread drives all ranks now.
  Harness h(3);
  h.set_driver(1, exited_thread());
  h.set_driver(2, exited_thread());
  const auto start = Clock::now();
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  EXPECT_EQ(h.sets_run(), 0u);
  EXPECT_TRUE(h.call(allreduce(2)).is_ok());
  EXPECT_EQ(h.sets_run(), 1u);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(thread_exited(0));
  EXPECT_FALSE(thread_exited(this_thread_token()));
}

TEST(CallQueue, TwoThreadsDrivingTwoRanksEach) {
  // Thread A drives ranks 0 and 1, thread B ranks 2 and 3, without groups: A's call for rank 0
  // returns (A makes rank 1's next), its call for rank 1 waits for B's ranks.
  Harness h(4);
  std::atomic<int> a_done{0};
  std::thread a([&] {
    h.set_driver(1, this_thread_token());
    EXPECT_TRUE(h.call(allreduce(0)).is_ok());
    a_done = 1;
    EXPECT_TRUE(h.call(allreduce(1)).is_ok());
    a_done = 2;
  });
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(a_done.load(), 1);
  EXPECT_TRUE(h.call(allreduce(2)).is_ok());  // B: its rank 3 is missing, driven here
  EXPECT_TRUE(h.call(allreduce(3)).is_ok());
  a.join();
  EXPECT_EQ(a_done.load(), 2);
  EXPECT_EQ(h.sets_run(), 1u);
}

TEST(CallQueue, AMissingRankTimesOutWithAnErrorNamingIt) {
  Harness h(3, 300ms);
  Bystander bystander;
  h.set_driver(2, bystander.token());
  std::promise<void> registered;
  std::thread other([&] {
    h.set_driver(1, this_thread_token());
    registered.set_value();
    EXPECT_FALSE(h.call(allreduce(1)).is_ok());
  });
  registered.get_future().wait();  // rank 1 is driven by `other` whether or not it has called
  const auto start = Clock::now();
  const ApiStatus s = h.call(allreduce(0));
  other.join();
  const auto waited = Clock::now() - start;
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "timed out after 300 ms (EFCCL_TIMEOUT_MS)")) << s.message();
  EXPECT_TRUE(contains(s.message(), "rank(s) 2 never made it")) << s.message();
  EXPECT_TRUE(contains(s.message(), "ncclAllReduce(count 16")) << s.message();
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 5s);
  // Rank 2, whose thread was late, learns it through its asynchronous error.
  EXPECT_EQ(h.queue.error_of(2).code(), ncclInvalidUsage);
  EXPECT_EQ(h.queue.error_of(0).code(), ncclSuccess);  // its call returned the error
  EXPECT_EQ(h.sets_run(), 0u);
  // Realigned: the next calls meet again.
  std::thread again([&] { EXPECT_TRUE(h.call(allreduce(1)).is_ok()); });
  std::thread again2([&] { EXPECT_TRUE(h.call(allreduce(2)).is_ok()); });
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  again.join();
  again2.join();
  EXPECT_EQ(h.sets_run(), 1u);
}

TEST(CallQueue, AbortEndsAWaitAtOnce) {
  Harness h(2, 60s);
  Bystander bystander;
  h.set_driver(1, bystander.token());
  std::thread aborter([&] {
    std::this_thread::sleep_for(100ms);
    h.abort = true;
  });
  const auto start = Clock::now();
  const ApiStatus s = h.call(allreduce(0));
  aborter.join();
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "aborted")) << s.message();
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(CallQueue, AMismatchIsReturnedToEveryWaitingRank) {
  Harness h(2);
  ApiStatus s0;
  std::thread rank0([&] { s0 = h.call(allreduce(0, 16)); });
  std::this_thread::sleep_for(100ms);
  const ApiStatus s1 = h.call(allreduce(1, 32));
  rank0.join();
  EXPECT_EQ(s1.code(), ncclInvalidUsage);
  EXPECT_EQ(s0.code(), ncclInvalidUsage) << "the rank that queued first must see it too";
  EXPECT_TRUE(contains(s0.message(), "do not match across the ranks")) << s0.message();
  EXPECT_TRUE(contains(s0.message(), "count 16") && contains(s0.message(), "count 32"))
      << s0.message();
  EXPECT_EQ(h.sets_run(), 0u) << "a set whose calls disagree never reaches the runners";
  EXPECT_TRUE(h.queue.error_of(0).is_ok());  // seen as a return code: nothing asynchronous
}

TEST(CallQueue, AFailedRunIsReportedToCallsThatAlreadyReturned) {
  // One thread, ranks 0 and 1 without a group: rank 0's call returned before the set ran, so
  // it learns of the failure through error_of (ncclCommGetAsyncError).
  Harness h(2);
  h.fail_runs = true;
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  const ApiStatus s1 = h.call(allreduce(1));
  EXPECT_EQ(s1.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s1.message(), "first use during capture"));
  EXPECT_EQ(h.queue.error_of(0).code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(h.queue.error_of(0).message(), "first use during capture"));
  EXPECT_TRUE(h.queue.error_of(1).is_ok());
  // A failed set is consumed: the next calls still meet.
  h.fail_runs = false;
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  EXPECT_EQ(h.sets_run(), 2u);
}

TEST(CallQueue, AMismatchDropsEveryQueuedCallAndRealigns) {
  Harness h(2);
  EXPECT_TRUE(h.call(allreduce(0, 16)).is_ok());
  EXPECT_TRUE(h.call(allreduce(0, 16)).is_ok());
  EXPECT_EQ(h.call(allreduce(1, 32)).code(), ncclInvalidUsage);
  EXPECT_EQ(h.queue.queued(0), 0u);  // rank 0's second call went too
  EXPECT_EQ(h.queue.error_of(0).code(), ncclInvalidUsage);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  EXPECT_EQ(h.sets_run(), 1u);  // the realigned one; the mismatched set never ran
}

// The queue checks everything the ranks must agree on before a set runs: the collective, the
// count, the datatype, the root of rooted collectives and the operator of reducing ones.
TEST(CallQueue, EveryDisagreementIsAMismatch) {
  const auto variant = [](int what, int32_t rank) {
    Call c = allreduce(rank);
    if (rank == 0) return c;
    switch (what) {
      case 0: c.kind = CallKind::kAllGather; break;
      case 1: c.count = 17; break;
      case 2: c.dtype = ef::DataType::kFloat64; break;
      case 3: c.op = ef::RedOp::kMax; break;
      default: break;
    }
    return c;
  };
  for (int what = 0; what < 4; ++what) {
    SCOPED_TRACE(what);
    Harness h(2);
    const ApiStatus s = h.call({variant(what, 0), variant(what, 1)}, true);
    EXPECT_EQ(s.code(), ncclInvalidUsage);
    EXPECT_TRUE(contains(s.message(), "do not match across the ranks")) << s.message();
    EXPECT_EQ(h.sets_run(), 0u);
  }
  // Roots matter for rooted collectives only; operators for reducing ones only.
  Harness h(2);
  Call b0 = allreduce(0), b1 = allreduce(1);
  b0.kind = b1.kind = CallKind::kBroadcast;
  b1.root = 1;
  EXPECT_EQ(h.call({b0, b1}, true).code(), ncclInvalidUsage);
  Call a0 = allreduce(0), a1 = allreduce(1);
  a0.kind = a1.kind = CallKind::kAllGather;
  a1.root = 1;
  a1.op = ef::RedOp::kMax;
  EXPECT_TRUE(h.call({a0, a1}, true).is_ok());
  EXPECT_EQ(h.sets_run(), 1u);
}

TEST(CallQueue, AWholeCliqueGroupWithAnUnmatchedCallFailsAndStaysUsable) {
  Harness h(2);
  const ApiStatus s = h.call({allreduce(0), allreduce(1), allreduce(0)}, true);
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "rank 0 has 1 unmatched call(s)")) << s.message();
  EXPECT_TRUE(h.queue.error_of(0).is_ok());
  EXPECT_TRUE(h.queue.error_of(1).is_ok());
  EXPECT_TRUE(h.call({allreduce(0), allreduce(1)}, true).is_ok());
  EXPECT_EQ(h.sets_run(), 2u);
}

TEST(CallQueue, ADestroyedRankDropsTheQueuedCallsAndTellsTheOthers) {
  Harness h(3);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());  // queued: this thread drives ranks 1 and 2
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.queue.remove_rank(1, "destroyed (ncclCommDestroy)");
  }
  EXPECT_EQ(h.queue.queued(0), 0u);
  for (int32_t r : {0, 2}) {
    const ApiStatus e = h.queue.error_of(r);
    EXPECT_EQ(e.code(), ncclInvalidUsage) << "rank " << r;
    EXPECT_TRUE(contains(e.message(), "rank 1's communicator was destroyed (ncclCommDestroy)"))
        << e.message();
  }
  const ApiStatus next = h.call(allreduce(2));
  EXPECT_EQ(next.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(next.message(), "rank 1's communicator was destroyed")) << next.message();
  EXPECT_EQ(h.sets_run(), 0u);  // nothing ran with the destroyed rank's buffers
}

TEST(CallQueue, ADestroyedRankEndsTheOthersWaits) {
  Harness h(2, 60s);
  Bystander bystander;
  h.set_driver(1, bystander.token());
  std::thread destroyer([&] {
    std::this_thread::sleep_for(100ms);
    std::lock_guard<std::mutex> lock(h.mu);
    h.queue.remove_rank(1, "aborted (ncclCommAbort)");
  });
  const ApiStatus s = h.call(allreduce(0));
  destroyer.join();
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "rank 1's communicator was aborted (ncclCommAbort)"))
      << s.message();
}

TEST(CallQueue, ACleanDestroyTellsNobody) {
  Harness h(2);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.queue.remove_rank(1, "destroyed (ncclCommDestroy)");
  }
  EXPECT_TRUE(h.queue.error_of(0).is_ok());
}

TEST(CallQueue, FlushRefusesWhenThisThreadDrivesTheMissingRank) {
  Harness h(2);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  std::unique_lock<std::mutex> lock(h.mu);
  const ApiStatus s = h.queue.flush(0, lock);
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "queued for rank(s) 1, which this thread drives"))
      << s.message();
  EXPECT_EQ(h.queue.queued(0), 1u);  // still queued: the missing call may come
}

TEST(CallQueue, FlushWaitsForTheCallOfAnotherThread) {
  Harness h(2);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());  // queued; this thread drives rank 1
  ApiStatus flushed = ApiStatus::internal("not flushed");
  std::size_t sets_when_flushed = 99;
  std::thread finalizer([&] {
    std::unique_lock<std::mutex> lock(h.mu);
    flushed = h.queue.flush(0, lock);
    sets_when_flushed = h.runs.size();
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(h.call(allreduce(1)).is_ok());
  finalizer.join();
  EXPECT_TRUE(flushed.is_ok()) << flushed.message();
  EXPECT_EQ(sets_when_flushed, 1u);
}

TEST(CallQueue, AQueuedSetExpiresAtTheDeadline) {
  Harness h(2, 100ms);
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.queue.expire();
  }
  EXPECT_TRUE(h.queue.error_of(0).is_ok());  // not yet
  std::this_thread::sleep_for(150ms);
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.queue.expire();
  }
  EXPECT_EQ(h.queue.queued(0), 0u);
  const ApiStatus e = h.queue.error_of(0);
  EXPECT_EQ(e.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(e.message(), "rank(s) 1 never made it")) << e.message();
}

TEST(CallQueue, OnlyLocalRanksMeet) {
  // Multi-process: ranks 1 and 3 run elsewhere; a set is complete with ranks 0 and 2.
  Harness h(4, 10s, {true, false, true, false});
  EXPECT_TRUE(h.call(allreduce(0)).is_ok());
  EXPECT_TRUE(h.call(allreduce(2)).is_ok());
  ASSERT_EQ(h.sets_run(), 1u);
  EXPECT_EQ(h.runs[0], (std::vector<int32_t>{0, 2}));
}

}  // namespace
}  // namespace efccl::runtime
