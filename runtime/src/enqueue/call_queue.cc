#include "enqueue/call_queue.h"

#include <algorithm>
#include <sstream>
#include <utility>

namespace efccl::runtime {
namespace {

/// How often a waiting thread looks at the abort flag (abort() does not take the owner's mutex,
/// so it cannot wake the waiters itself).
constexpr std::chrono::milliseconds kAbortPoll{20};

}  // namespace

struct CallQueue::Submission {
  std::size_t queued = 0;  ///< its calls still queued
  bool returned = false;   ///< its caller went on while calls were still queued
  ApiStatus status;        ///< the first failure among its calls
};

CallQueue::CallQueue(std::vector<bool> local, std::chrono::nanoseconds timeout,
                     const std::atomic<bool>* abort)
    : local_(std::move(local)),
      timeout_(timeout),
      abort_(abort),
      queues_(local_.size()),
      next_sequence_(local_.size(), 0),
      drivers_(local_.size(), 0),
      gone_(local_.size()),
      errors_(local_.size()) {}

void CallQueue::set_driver(int32_t rank, uint64_t thread) {
  drivers_[static_cast<std::size_t>(rank)] = thread;
}

bool CallQueue::all_ready() const {
  for (std::size_t r = 0; r < queues_.size(); ++r)
    if (local_[r] && queues_[r].empty()) return false;
  return true;
}

std::set<int32_t> CallQueue::missing_for(const std::function<bool(const Entry&)>& of) const {
  std::set<std::size_t> positions;
  for (const auto& q : queues_)
    for (std::size_t i = 0; i < q.size(); ++i)
      if (of(q[i])) positions.insert(i);
  std::set<int32_t> missing;
  for (std::size_t i : positions)
    for (std::size_t r = 0; r < queues_.size(); ++r)
      if (local_[r] && gone_[r].empty() && queues_[r].size() <= i)
        missing.insert(static_cast<int32_t>(r));
  return missing;
}

bool CallQueue::maybe_driven_here(const std::set<int32_t>& ranks) const {
  const uint64_t me = this_thread_token();
  return std::any_of(ranks.begin(), ranks.end(), [&](int32_t r) {
    const uint64_t driver = drivers_[static_cast<std::size_t>(r)];
    return driver == me || thread_exited(driver);
  });
}

ApiStatus CallQueue::incomplete_error(const std::string& why) const {
  std::vector<int32_t> present, missing;
  const Entry* first = nullptr;
  auto oldest = std::chrono::steady_clock::time_point::max();
  for (std::size_t r = 0; r < queues_.size(); ++r) {
    if (!local_[r] || !gone_[r].empty()) continue;
    if (queues_[r].empty()) {
      missing.push_back(static_cast<int32_t>(r));
      continue;
    }
    present.push_back(static_cast<int32_t>(r));
    if (first == nullptr) first = &queues_[r].front();
    oldest = std::min(oldest, queues_[r].front().queued_at);
  }
  std::ostringstream m;
  m << why;
  if (first != nullptr) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - oldest);
    m << ": rank(s) " << rank_list(present) << " queued collective call #" << first->call.sequence
      << " (" << describe(first->call) << ") " << waited.count() << " ms ago and rank(s) "
      << rank_list(missing) << " never made it";
  }
  m << "; the queued collective calls of the communicator were dropped (every rank must make "
       "the same collective calls in the same order; docs/runtime.md says which calls wait)";
  return ApiStatus::invalid_usage(m.str());
}

std::string CallQueue::timed_out() const {
  return "timed out after " +
         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count()) +
         " ms (EFCCL_TIMEOUT_MS) waiting for the other ranks' calls";
}

void CallQueue::set_error(int32_t rank, const ApiStatus& status) {
  std::lock_guard<std::mutex> lock(errors_mu_);
  ApiStatus& e = errors_[static_cast<std::size_t>(rank)];
  if (e) e = status;
}

ApiStatus CallQueue::error_of(int32_t rank) const {
  std::lock_guard<std::mutex> lock(errors_mu_);
  return errors_[static_cast<std::size_t>(rank)];
}

void CallQueue::deliver(Entry& e, const ApiStatus& status) {
  Submission& s = *e.from;
  --s.queued;
  if (status) return;
  if (s.returned)
    set_error(e.call.rank, status);
  else if (s.status)
    s.status = status;
}

void CallQueue::drop_all(const ApiStatus& status, bool tell_everyone) {
  std::size_t longest = 0;
  for (const auto& q : queues_) longest = std::max(longest, q.size());
  const uint64_t me = this_thread_token();
  for (std::size_t r = 0; r < queues_.size(); ++r) {
    if (!local_[r]) continue;
    const bool missed = queues_[r].size() < longest;
    for (Entry& e : queues_[r]) deliver(e, status);
    queues_[r].clear();
    // A rank that had not made its call yet learns why its late call will not meet the others'
    // (its driver may not be the thread that gets this error).
    if (gone_[r].empty() && (tell_everyone || (missed && drivers_[r] != me)))
      set_error(static_cast<int32_t>(r), status);
  }
  const uint64_t next = *std::max_element(next_sequence_.begin(), next_sequence_.end());
  std::fill(next_sequence_.begin(), next_sequence_.end(), next);
  cv_.notify_all();
}

std::string CallQueue::disagreement(const std::vector<Entry>& set) {
  const Call& ref = set.front().call;
  for (const Entry& e : set) {
    const Call& c = e.call;
    const bool same = c.kind == ref.kind && c.count == ref.count && c.dtype == ref.dtype &&
                      (!is_rooted(c.kind) || c.root == ref.root) &&
                      (!reduces(c.kind) || c.op == ref.op);
    if (!same)
      return "collective calls do not match across the ranks of the communicator: rank " +
             std::to_string(ref.rank) + "'s call #" + std::to_string(ref.sequence) + " is " +
             describe(ref) + " but rank " + std::to_string(c.rank) + "'s call #" +
             std::to_string(c.sequence) + " is " + describe(c);
  }
  return {};
}

CallQueue::Admission CallQueue::admit(std::vector<Call> calls, bool whole_clique) {
  Admission a;
  a.whole_clique = whole_clique;
  expire();
  for (std::size_t r = 0; r < gone_.size(); ++r)
    if (!gone_[r].empty()) {
      a.refused =
          ApiStatus::invalid_usage("rank " + std::to_string(r) + "'s communicator was " + gone_[r] +
                                   ", so the collectives of the communicator can no "
                                   "longer run");
      return a;
    }
  a.submission = std::make_shared<Submission>();
  const uint64_t me = this_thread_token();
  const auto now = std::chrono::steady_clock::now();
  for (Call& c : calls) {
    const auto r = static_cast<std::size_t>(c.rank);
    drivers_[r] = me;
    c.sequence = next_sequence_[r]++;
    queues_[r].push_back({std::move(c), a.submission, now});
    ++a.submission->queued;
  }
  while (all_ready()) {
    std::vector<Entry> entries;
    for (auto& q : queues_) {
      if (q.empty()) continue;
      entries.push_back(std::move(q.front()));
      q.pop_front();
    }
    if (std::string why = disagreement(entries); !why.empty()) {
      a.mismatch = ApiStatus::invalid_usage(std::move(why));
      a.mismatched = std::move(entries);
      break;
    }
    std::vector<Call> set;
    set.reserve(entries.size());
    for (const Entry& e : entries) set.push_back(e.call);
    a.ready_.push_back(std::move(set));
    a.entries.push_back(std::move(entries));
  }
  return a;
}

ApiStatus CallQueue::settle(Admission& a, const std::vector<ApiStatus>& ran,
                            std::shared_ptr<Submission>* unfinished) {
  unfinished->reset();
  if (!a.refused) return a.refused;
  for (std::size_t i = 0; i < a.entries.size(); ++i)
    for (Entry& e : a.entries[i]) deliver(e, i < ran.size() ? ran[i] : ApiStatus::ok());
  if (!a.mismatch) {
    for (Entry& e : a.mismatched) deliver(e, a.mismatch);
    drop_all(a.mismatch, false);
  }
  if (a.whole_clique &&
      std::any_of(queues_.begin(), queues_.end(), [](const auto& q) { return !q.empty(); })) {
    std::ostringstream m;
    m << "collective calls do not match across the ranks of the communicator (every rank must "
         "make the same collective calls in the same order):";
    for (std::size_t r = 0; r < queues_.size(); ++r) {
      if (!local_[r]) continue;
      m << " rank " << r << " has " << queues_[r].size() << " unmatched call(s)";
      if (!queues_[r].empty())
        m << " starting with call #" << queues_[r].front().call.sequence << " "
          << describe(queues_[r].front().call);
      m << (r + 1 < queues_.size() ? ";" : "");
    }
    drop_all(ApiStatus::invalid_usage(m.str()), false);
  }
  cv_.notify_all();
  if (a.submission->queued > 0) *unfinished = a.submission;
  return a.submission->status;
}

ApiStatus CallQueue::wait(const std::shared_ptr<Submission>& sub,
                          std::unique_lock<std::mutex>& lock) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (sub->queued > 0) {
    if (aborted()) {
      drop_all(incomplete_error("the communicator was aborted while a call waited"), false);
      break;
    }
    const std::set<int32_t> missing = missing_for([&](const Entry& e) { return e.from == sub; });
    if (missing.empty() || maybe_driven_here(missing)) {
      sub->returned = true;  // this thread may have to make the missing calls itself
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      drop_all(incomplete_error(timed_out()), false);
      break;
    }
    cv_.wait_until(lock, std::min(deadline, now + kAbortPoll));
  }
  return sub->status;
}

ApiStatus CallQueue::flush(int32_t rank, std::unique_lock<std::mutex>& lock) {
  const auto& mine = queues_[static_cast<std::size_t>(rank)];
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!mine.empty()) {
    if (aborted()) {
      const ApiStatus s = incomplete_error("the communicator was aborted while a call waited");
      drop_all(s, false);
      return s;
    }
    std::set<int32_t> missing = missing_for([&](const Entry& e) { return e.call.rank == rank; });
    if (missing.empty() || maybe_driven_here(missing))
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(rank) + " has " + std::to_string(mine.size()) +
          " collective call(s) queued for rank(s) " +
          rank_list(std::vector<int32_t>(missing.begin(), missing.end())) +
          ", which this thread drives (or whose thread has exited): make their calls first");
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const ApiStatus s = incomplete_error(timed_out());
      drop_all(s, false);
      return s;
    }
    cv_.wait_until(lock, std::min(deadline, now + kAbortPoll));
  }
  return ApiStatus::ok();
}

void CallQueue::remove_rank(int32_t rank, const std::string& how) {
  const bool queued_any =
      std::any_of(queues_.begin(), queues_.end(), [](const auto& q) { return !q.empty(); });
  if (queued_any) {
    const ApiStatus s = incomplete_error("rank " + std::to_string(rank) + "'s communicator was " +
                                         how + " while collective calls were queued");
    gone_[static_cast<std::size_t>(rank)] = how;
    drop_all(s, true);
  } else {
    gone_[static_cast<std::size_t>(rank)] = how;
  }
}

void CallQueue::expire() {
  auto oldest = std::chrono::steady_clock::time_point::max();
  for (const auto& q : queues_)
    if (!q.empty()) oldest = std::min(oldest, q.front().queued_at);
  if (oldest == std::chrono::steady_clock::time_point::max() ||
      std::chrono::steady_clock::now() - oldest < timeout_)
    return;
  drop_all(incomplete_error(timed_out()), false);
}

}  // namespace efccl::runtime
