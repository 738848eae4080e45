// Runs one matched collective: the registry's plan (one or more program pieces), each piece an
// executor run over every rank added to the submission's batch; or, where no program covers
// the call, the fallback. Every selection is logged (COLL, with the registry's reason).
#pragma once

#include <vector>

#include "base/api_status.h"
#include "launch/call.h"
#include "launch/launch_batch.h"
#include "launch/launch_context.h"

namespace efccl::runtime {

/// `set`: the calls of this process's ranks (ascending), already known to agree on the
/// collective, count, datatype, operator and root (enqueue/call_queue.h checks that). `alone`:
/// the submission holds no other call (a communicator of one rank then copies instead of
/// launching; in a group its calls stay in the group's fused launch).
ApiStatus run_collective(LaunchContext& ctx, const std::vector<Call>& set, LaunchBatch& batch,
                         bool alone);

}  // namespace efccl::runtime
