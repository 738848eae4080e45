#include "enqueue/group.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "enqueue/clique.h"

namespace efccl::runtime {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<GroupedCall> calls;
  ApiStatus first_failure;  ///< of the calls recorded so far (ok: none failed)
};

GroupState& state() {
  thread_local GroupState s;
  return s;
}

}  // namespace

ApiStatus run_group(std::vector<GroupedCall> calls) {
  std::vector<std::shared_ptr<Clique>> order;
  for (const GroupedCall& c : calls)
    if (std::find(order.begin(), order.end(), c.clique) == order.end()) order.push_back(c.clique);
  ApiStatus first;
  std::vector<std::pair<Clique*, std::shared_ptr<CallQueue::Submission>>> unfinished;
  for (const auto& clique : order) {
    std::vector<Call> mine;
    std::set<int32_t> ranks;
    for (GroupedCall& c : calls) {
      if (c.clique != clique) continue;
      ranks.insert(c.call.rank);
      mine.push_back(std::move(c.call));
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

ClosedGroup close_group(const char* function) {
  ClosedGroup closed;
  GroupState& g = state();
  if (g.depth == 0) {
    closed.failure =
        ApiStatus::invalid_usage(std::string(function) + " without a matching ncclGroupStart");
    return closed;
  }
  if (--g.depth > 0) return closed;
  closed.outermost = true;
  std::vector<GroupedCall> calls = std::move(g.calls);
  g.calls.clear();
  g.calls.reserve(calls.size());  // the next group is likely the same size: no regrowth per call
  const ApiStatus first_failure = std::move(g.first_failure);
  g.first_failure = ApiStatus::ok();
  if (!first_failure) {
    closed.failure =
        ApiStatus(first_failure.code(),
                  "the group was not run because a call in it failed: " + first_failure.message());
    return closed;
  }
  closed.calls = std::move(calls);
  return closed;
}

ApiStatus group_start() {
  ++state().depth;
  return ApiStatus::ok();
}

ApiStatus enqueue(std::shared_ptr<Clique> clique, Call call) {
  GroupState& g = state();
  if (g.depth == 0) {
    std::vector<GroupedCall> one;
    one.push_back({std::move(clique), std::move(call)});
    return run_group(std::move(one));
  }
  g.calls.push_back({std::move(clique), std::move(call)});
  return ApiStatus::ok();
}

bool in_group() { return state().depth > 0; }

void fail_group(const ApiStatus& status) {
  GroupState& g = state();
  if (g.depth > 0 && g.first_failure) g.first_failure = status;
}

}  // namespace efccl::runtime
