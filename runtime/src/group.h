// Groups: ncclGroupStart/ncclGroupEnd nest per thread; every call between them is recorded
// and handed to the cliques at the outermost ncclGroupEnd. A call outside any group is a
// group of one. An argument error inside a group is returned by the call and again by the
// outermost ncclGroupEnd, which then runs none of the group's calls (NCCL's behaviour).
#pragma once

#include "api_status.h"
#include "call.h"

namespace efccl::runtime {

ApiStatus group_start();
ApiStatus group_end();
/// Records a checked call (or runs it at once outside a group).
ApiStatus enqueue(Call call);
/// Marks the current group failed (no-op outside a group).
void fail_group(const ApiStatus& status);

}  // namespace efccl::runtime
