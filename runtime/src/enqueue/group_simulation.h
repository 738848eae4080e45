// ncclGroupSimulateEnd's estimate: instead of launching a group's calls, predicts how long they
// take with the host executor's link-cost model (efccl/host/timing.h, docs/timing-model.md);
// the entry point (api/) ends the group as ncclGroupEnd does and discards the calls, as NCCL
// does. Collectives are timed through the programs the registry selects for
// them, send/receive through the rounds a clique would launch.
//
// estimatedTime is in microseconds (NCCL's unit: its tuning model's latency in us plus
// bytes / (1000 * GB/s)). NCCL reports the model time of the last collective batch it planned
// and nothing for send/receive; efccl reports the whole group: every launch it would make,
// one after another.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "efccl/common/status.h"
#include "efccl/host/timing.h"
#include "enqueue/group.h"
#include "launch/call.h"
#include "select/p2p_plan.h"
#include "select/program_registry.h"

namespace efccl::runtime {

/// Checks that `sim_info` was set up by NCCL_SIM_INFO_INITIALIZER: not null, a size that
/// covers the magic, and the magic. The version is not checked (NCCL does not either).
ApiStatus check_sim_info(const ncclSimInfo_t* sim_info);

/// Predicted time (us) of one collective call run through the programs `registry` selects:
/// one launch per plan piece. `model.rank_devices` is indexed by communicator rank.
StatusOr<double> estimate_collective(ProgramRegistry& registry, const CallShape& call,
                                     const host::LinkCostModel& model);
/// The same for a plan already selected (the clique's registry chose it).
StatusOr<double> estimate_plan(const Plan& plan, const CallShape& call,
                               const host::LinkCostModel& model);

/// Predicted time (us) of one group's send/receive transfers on one communicator: the rounds
/// plan_p2p_rounds makes (one launch each, in `protocol_for`'s protocol; Simple when not given)
/// and copies to self. `model.rank_devices` is indexed by communicator rank.
StatusOr<double> estimate_transfers(
    std::vector<Transfer> transfers, const host::LinkCostModel& model,
    const std::function<ef::Protocol(uint64_t bytes)>& protocol_for = {});

/// Predicted time (us) of a group's calls: each communicator's collectives (matched across
/// ranks by their order, as the clique matches them) and its send/receive rounds, summed.
StatusOr<double> estimate_group(const std::vector<GroupedCall>& calls);

}  // namespace efccl::runtime
