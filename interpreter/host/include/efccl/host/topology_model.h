// The timing model on a machine graph (docs/timing-model.md, "On a topology"): the links of a
// topo::Topology become the model's ports, so a prediction on a preset and `efccl topo` agree
// on every capacity.
//
//   auto t = topo::preset("h200-nv18-x2");
//   host::LinkCostModel model = *host::model_for_topology(*t);  // rank r on t->gpus()[r]
//   host::TimingResult r = host::predict_time(program, call, model);
#pragma once

#include <optional>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/host/timing.h"
#include "efccl/topology/topology.h"

namespace efccl::host {

/// `base` (latencies, responses, memory, threadblock and launch parameters, transports) on
/// machine `t`: program rank r runs on GPU node rank_gpus[r], or on t.gpus()[r] when
/// rank_gpus is empty (then the program must have one rank per GPU of t). Ranks given the same
/// GPU share it (kSameDevice). Slot device k of a program (connection placement) is GPU node
/// slot_device_gpus[k] (empty: base's). An error names an entry that is not a GPU of t.
StatusOr<LinkCostModel> model_for_topology(const topo::Topology& t,
                                           std::vector<topo::NodeIndex> rank_gpus = {},
                                           const LinkCostModel& base = {},
                                           std::vector<topo::NodeIndex> slot_device_gpus = {});

/// The walk a transfer from GPU `a` to GPU `b` takes over `transport` on `t`: kNvlink the
/// default route (t.route: NVLink where there is one, else PCIe), kPcieHostStaged the
/// host-staged walk (t.host_route); an error when there is none or for kSameDevice (no link).
StatusOr<topo::Path> transfer_route(const topo::Topology& t, topo::NodeIndex a, topo::NodeIndex b,
                                    Transport transport);

/// The link carrying traffic opposite to `link` (from its end to its start: one of the same
/// kind first, then any, in the order they were added), if any: where responses go.
std::optional<topo::LinkIndex> reverse_link(const topo::Topology& t, topo::LinkIndex link);

}  // namespace efccl::host
