// Groups: ncclGroupStart/ncclGroupEnd nest per thread; every call between them is recorded and
// handed to the cliques at the outermost ncclGroupEnd. A call outside any group is a group of
// one. An argument error inside a group is returned by the call and again by the outermost
// ncclGroupEnd, which then runs none of the group's calls (NCCL's behaviour).
//
// This layer records the calls and runs them; the grouped ncclCommInitRank*, ncclCommSplit and
// ncclCommShrink of the same group are comm/'s (comm/grouped_init.h), which the entry point
// completes at the outermost ncclGroupEnd before the calls run (api/).
//
// Running: each clique gets its calls (Clique::submit); then the thread waits for collectives
// still queued for ranks other threads drive (call_queue.h), clique after clique, so that no
// wait on one clique holds back the calls of another.
#pragma once

#include <memory>
#include <vector>

#include "base/api_status.h"
#include "launch/call.h"

namespace efccl::runtime {

class Clique;

/// A call and the clique it belongs to (kept alive until the group has run).
struct GroupedCall {
  std::shared_ptr<Clique> clique;
  Call call;
};

/// What closing one level of the thread's group gave.
struct ClosedGroup {
  bool outermost = false;  ///< the outermost group closed
  /// The outermost group failed (a call in it failed, or there was no ncclGroupStart): its calls
  /// must not run. Ok otherwise.
  ApiStatus failure;
  std::vector<GroupedCall> calls;  ///< the outermost group's calls, when it did not fail
};

ApiStatus group_start();
/// Closes one level of the thread's group (`function` names the caller for messages).
ClosedGroup close_group(const char* function);
/// Hands each clique its calls and waits for those still queued; the first failure.
ApiStatus run_group(std::vector<GroupedCall> calls);
/// Records a checked call (or runs it at once outside a group).
ApiStatus enqueue(std::shared_ptr<Clique> clique, Call call);
/// Marks the current group failed (no-op outside a group).
void fail_group(const ApiStatus& status);
/// True between ncclGroupStart and the outermost ncclGroupEnd on this thread.
bool in_group();

}  // namespace efccl::runtime
