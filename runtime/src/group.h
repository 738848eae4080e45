// Groups: ncclGroupStart/ncclGroupEnd nest per thread; every call between them is recorded
// and handed to the cliques at the outermost ncclGroupEnd. A call outside any group is a
// group of one. An argument error inside a group is returned by the call and again by the
// outermost ncclGroupEnd, which then runs none of the group's calls (NCCL's behaviour).
//
// ncclCommInitRank* inside a group returns at once; the outermost ncclGroupEnd first completes
// the group's rendezvous (init_rank.h), waiting for missing ranks (other threads) until
// EFCCL_INIT_TIMEOUT_MS, then runs the recorded calls. A group that failed cancels them.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "api_status.h"
#include "call.h"

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

}  // namespace efccl::runtime
