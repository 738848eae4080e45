// Groups: ncclGroupStart/ncclGroupEnd nest per thread; every call between them is recorded
// and handed to the cliques at the outermost ncclGroupEnd. A call outside any group is a
// group of one. An argument error inside a group is returned by the call and again by the
// outermost ncclGroupEnd, which then runs none of the group's calls (NCCL's behaviour).
//
// ncclCommInitRank* inside a group returns at once; the outermost ncclGroupEnd first completes
// the group's rendezvous (init_rank.h), waiting for missing ranks (other threads) until
// EFCCL_INIT_TIMEOUT_MS, then runs the recorded calls. A group that failed cancels them.
// ncclCommSplit / ncclCommShrink inside a group also return at once: the outermost
// ncclGroupEnd first offers every grouped split's color, then collects the others' (so one
// thread may split all its ranks), joins the children's rendezvous and completes them with the
// grouped inits; *newcomm is set there, as with NCCL. Splits of parents that span processes
// exchange colors through the parent's bootstrap, each on a thread of its own (all at once),
// each bounded by EFCCL_INIT_TIMEOUT_MS.
//
// Running: each clique gets its calls (Clique::submit); then the thread waits for collectives
// still queued for ranks other threads drive (call_queue.h), clique after clique, so that no
// wait on one clique holds back the calls of another.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/api_status.h"
#include "launch/call.h"

namespace efccl::runtime {

class Rendezvous;

ApiStatus group_start();
ApiStatus group_end();
/// ncclGroupSimulateEnd's end of a group: closes it as group_end does (nesting, the group's
/// error, the grouped inits' rendezvous) but moves the outermost group's calls to `*calls`
/// instead of running them. `check` runs only when the outermost group closes (NCCL reads
/// simInfo only there); its failure fails the group like a failed call. *outermost says
/// whether the outermost group closed.
ApiStatus group_end_without_running(const std::function<ApiStatus()>& check,
                                    std::vector<Call>* calls, bool* outermost);
/// Records a checked call (or runs it at once outside a group).
ApiStatus enqueue(Call call);
/// Marks the current group failed (no-op outside a group).
void fail_group(const ApiStatus& status);
/// True between ncclGroupStart and the outermost ncclGroupEnd on this thread.
bool in_group();
/// Leaves a grouped init's rendezvous to the outermost ncclGroupEnd (in a group only).
void defer_init(std::shared_ptr<Rendezvous> rendezvous);

/// A grouped ncclCommSplit/Shrink, finished at the outermost ncclGroupEnd in two steps:
/// `offer` publishes this rank's color without waiting; `finish` waits for the other ranks'
/// and joins the new communicator's rendezvous, returned in `*joined` (null: no communicator
/// for this rank), which the group completes with its inits.
/// `concurrent`: `finish` talks to other processes (a parent spanning processes) and runs on a
/// thread of its own, at the same time as the group's other concurrent finishes.
struct DeferredRegroup {
  std::function<ApiStatus()> offer;
  std::function<ApiStatus(std::shared_ptr<Rendezvous>* joined)> finish;
  bool concurrent = false;
};
/// Leaves a split/shrink to the outermost ncclGroupEnd (in a group only).
void defer_regroup(DeferredRegroup regroup);

}  // namespace efccl::runtime
