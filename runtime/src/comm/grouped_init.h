// ncclCommInitRank*, ncclCommSplit and ncclCommShrink inside a group, as NCCL has them: the
// calls return at once and the outermost ncclGroupEnd completes them (api/ calls
// finish_grouped_inits) before the group's calls run.
//
// ncclCommInitRank* in a group joins its rendezvous at once; ncclGroupEnd waits for the missing
// ranks (other threads) until EFCCL_INIT_TIMEOUT_MS. ncclCommSplit / ncclCommShrink in a group:
// ncclGroupEnd first offers every grouped split's color, then collects the others' (so one thread
// may split all its ranks), joins the children's rendezvous and completes them with the grouped
// inits; *newcomm is set there. Splits of parents that span processes exchange colors through
// the parent's bootstrap, each on a thread of its own (all at once), each bounded by
// EFCCL_INIT_TIMEOUT_MS. A group that failed cancels them all.
#pragma once

#include <functional>
#include <memory>

#include "base/api_status.h"

namespace efccl::runtime {

class Rendezvous;

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

/// At the outermost ncclGroupEnd: with `group_failure` ok, finishes this thread's grouped splits
/// and completes every grouped init's rendezvous, returning the first failure; otherwise cancels
/// them with it and returns it.
ApiStatus finish_grouped_inits(const ApiStatus& group_failure);

}  // namespace efccl::runtime
