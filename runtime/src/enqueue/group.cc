#include "enqueue/group.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "enqueue/clique.h"
#include "comm/rendezvous.h"

namespace efccl::runtime {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<Call> calls;
  std::vector<std::shared_ptr<Rendezvous>> inits;  ///< grouped ncclCommInitRank*, deduplicated
  std::vector<DeferredRegroup> regroups;           ///< grouped ncclCommSplit/Shrink, in call order
  ApiStatus error;
};

GroupState& state() {
  thread_local GroupState s;
  return s;
}

/// Hands each clique its calls, in call order, then waits for those still queued (group.h);
/// the first failure is returned.
ApiStatus run_group(std::vector<Call> calls) {
  std::vector<std::shared_ptr<Clique>> order;
  for (const Call& c : calls)
    if (std::find(order.begin(), order.end(), c.clique) == order.end()) order.push_back(c.clique);
  ApiStatus first;
  std::vector<std::pair<Clique*, std::shared_ptr<CallQueue::Submission>>> unfinished;
  for (const auto& clique : order) {
    std::vector<Call> mine;
    std::set<int32_t> ranks;
    for (const Call& c : calls) {
      if (c.clique != clique) continue;
      mine.push_back(c);
      ranks.insert(c.rank);
    }
    const bool whole = static_cast<int32_t>(ranks.size()) == clique->nlocal();
    std::shared_ptr<CallQueue::Submission> queued;
    ApiStatus s = clique->submit(std::move(mine), whole, &queued);
    if (!s && first) first = s;
    if (queued != nullptr) unfinished.emplace_back(clique.get(), std::move(queued));
  }
  for (const auto& [clique, queued] : unfinished) {
    ApiStatus s = clique->wait(queued);
    if (!s && first) first = s;
  }
  return first;
}

/// One level of the thread's group closed.
struct ClosedGroup {
  bool outermost = false;
  bool runnable = false;    ///< the outermost group did not fail: its calls may run
  std::vector<Call> calls;  ///< the outermost group's calls, when runnable
  ApiStatus status;         ///< why it failed, or the first grouped init that failed
};

/// Closes one level; at the outermost, takes the group's calls and completes its grouped
/// inits' rendezvous, or cancels them when the group failed or `check` (if any) refuses.
ClosedGroup close_group(const char* function, const std::function<ApiStatus()>& check) {
  ClosedGroup closed;
  GroupState& g = state();
  if (g.depth == 0) {
    closed.status =
        ApiStatus::invalid_usage(std::string(function) + " without a matching ncclGroupStart");
    return closed;
  }
  if (--g.depth > 0) return closed;
  closed.outermost = true;
  std::vector<Call> calls = std::move(g.calls);
  g.calls.clear();
  g.calls.reserve(calls.size());  // the next group is likely the same size: no regrowth per call
  std::vector<std::shared_ptr<Rendezvous>> inits = std::move(g.inits);
  g.inits.clear();
  std::vector<DeferredRegroup> regroups = std::move(g.regroups);
  g.regroups.clear();
  ApiStatus error = std::move(g.error);
  g.error = ApiStatus::ok();
  if (!error) {
    error = ApiStatus(error.code(),
                      "the group was not run because a call in it failed: " + error.message());
  } else if (check) {
    error = check();
  }
  if (!error) {
    for (const auto& r : inits) cancel_rendezvous(r, error);
    closed.status = std::move(error);
    return closed;
  }
  // Every split offers its color before any waits for the others' (one thread may hold all).
  std::vector<bool> offered(regroups.size(), false);
  for (std::size_t i = 0; i < regroups.size(); ++i) {
    ApiStatus s = regroups[i].offer();
    offered[i] = s.is_ok();
    if (!s && closed.status) closed.status = s;
  }
  // Splits across processes all at once, each on its own thread (their exchanges may need
  // each other: this thread can hold several ranks of one parent); the others here.
  std::vector<ApiStatus> finished(regroups.size());
  std::vector<std::shared_ptr<Rendezvous>> joins(regroups.size());
  const auto finish = [&regroups, &finished, &joins](std::size_t i) {
    try {
      finished[i] = regroups[i].finish(&joins[i]);
    } catch (const std::exception& e) {
      finished[i] = ApiStatus::system(std::string("ncclGroupEnd: a grouped split failed: ") + e.what());
    }
  };
  {
    std::vector<std::jthread> workers;  // joined on every way out of this block
    workers.reserve(regroups.size());
    for (std::size_t i = 0; i < regroups.size(); ++i) {
      if (!offered[i] || !regroups[i].concurrent) continue;
      try {
        workers.emplace_back(finish, i);
      } catch (const std::system_error& e) {
        finished[i] = ApiStatus::system(std::string("ncclGroupEnd: could not start a thread for a "
                                                    "grouped split: ") + e.what());
      }
    }
    for (std::size_t i = 0; i < regroups.size(); ++i)
      if (offered[i] && !regroups[i].concurrent) finish(i);
  }
  for (std::size_t i = 0; i < regroups.size(); ++i) {
    if (!offered[i]) continue;
    if (!finished[i] && closed.status) closed.status = finished[i];
    if (joins[i] != nullptr && std::find(inits.begin(), inits.end(), joins[i]) == inits.end())
      inits.push_back(std::move(joins[i]));
  }
  if (!inits.empty()) {
    const auto timeout = init_timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& r : inits) {
      ApiStatus s = complete_rendezvous(r, deadline, timeout);
      if (!s && closed.status) closed.status = s;
    }
  }
  closed.runnable = true;
  closed.calls = std::move(calls);
  return closed;
}

}  // namespace

ApiStatus group_start() {
  ++state().depth;
  return ApiStatus::ok();
}

ApiStatus group_end() {
  ClosedGroup closed = close_group("ncclGroupEnd", nullptr);
  if (!closed.runnable) return closed.status;
  ApiStatus s = run_group(std::move(closed.calls));
  return !closed.status ? closed.status : s;
}

ApiStatus group_end_without_running(const std::function<ApiStatus()>& check,
                                    std::vector<Call>* calls, bool* outermost) {
  ClosedGroup closed = close_group("ncclGroupSimulateEnd", check);
  *outermost = closed.outermost;
  if (closed.runnable) *calls = std::move(closed.calls);
  return closed.status;
}

ApiStatus enqueue(Call call) {
  GroupState& g = state();
  if (g.depth == 0) {
    std::vector<Call> one;
    one.push_back(std::move(call));
    return run_group(std::move(one));
  }
  g.calls.push_back(std::move(call));
  return ApiStatus::ok();
}

bool in_group() { return state().depth > 0; }

void defer_init(std::shared_ptr<Rendezvous> rendezvous) {
  GroupState& g = state();
  if (std::find(g.inits.begin(), g.inits.end(), rendezvous) == g.inits.end())
    g.inits.push_back(std::move(rendezvous));
}

void defer_regroup(DeferredRegroup regroup) { state().regroups.push_back(std::move(regroup)); }

void fail_group(const ApiStatus& status) {
  GroupState& g = state();
  if (g.depth > 0 && g.error) g.error = status;
}

}  // namespace efccl::runtime
