// Runs the ncclSend/ncclRecv calls of one submission, in one or across several processes:
// matches each sender's k-th send to a receiver with that receiver's k-th receive from it,
// copies to self on the rank's stream, plans rounds (select/p2p_plan.h) and adds one executor
// run per round to the batch. Logged like a collective selection (P2P).
//
// One process: the calls hold both sides of every transfer, and rounds may span many pairs.
// Across processes: each process holds only its ranks' side, so rounds are planned per pair
// of ranks from the sizes alone, and every process runs the pairs in one global order (pairs
// (a, b), a < b, ascending; messages in call order): each launch involves both ranks of its
// pair, so no cycle can form.
#pragma once

#include <vector>

#include "base/api_status.h"
#include "launch/call.h"
#include "launch/launch_batch.h"
#include "launch/launch_context.h"

namespace efccl::runtime {

ApiStatus run_send_recv(LaunchContext& ctx, const std::vector<Call>& calls, LaunchBatch& batch,
                        uint64_t alltoall_bytes = 0);

}  // namespace efccl::runtime
