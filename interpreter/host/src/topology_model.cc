// A LinkCostModel on a machine graph (efccl/host/topology_model.h); timing.cc walks the routes
// chosen here.
#include "efccl/host/topology_model.h"

#include <memory>
#include <string>
#include <utility>

namespace efccl::host {

StatusOr<LinkCostModel> model_for_topology(const topo::Topology& t,
                                           std::vector<topo::NodeIndex> rank_gpus,
                                           const LinkCostModel& base,
                                           std::vector<topo::NodeIndex> slot_device_gpus) {
  if (Status s = t.check(); !s) return Status::error("the topology: " + s.message());
  if (rank_gpus.empty()) rank_gpus = t.gpus();
  if (rank_gpus.empty()) return Status::error("the topology has no GPU to place ranks on");
  for (std::size_t r = 0; r < rank_gpus.size(); ++r) {
    const topo::NodeIndex g = rank_gpus[r];
    if (g >= t.nodes().size() || t.node(g).kind != topo::NodeKind::kGpu)
      return Status::error(
          "rank " + std::to_string(r) + ": node " + std::to_string(g) +
          (g >= t.nodes().size() ? " does not exist" : " ('" + t.node(g).id + "') is not a GPU"));
  }
  LinkCostModel model = base;
  if (!slot_device_gpus.empty())
    model.slot_device_gpus.assign(slot_device_gpus.begin(), slot_device_gpus.end());
  for (std::size_t k = 0; k < model.slot_device_gpus.size(); ++k) {
    const int64_t g = model.slot_device_gpus[k];
    if (g < 0 || static_cast<std::size_t>(g) >= t.nodes().size() ||
        t.node(static_cast<topo::NodeIndex>(g)).kind != topo::NodeKind::kGpu)
      return Status::error("slot device " + std::to_string(k) + ": node " + std::to_string(g) +
                           " is not a GPU of the topology");
  }
  model.rank_devices.assign(rank_gpus.begin(), rank_gpus.end());
  model.topology = std::make_shared<const topo::Topology>(t);
  return model;
}

StatusOr<topo::Path> transfer_route(const topo::Topology& t, topo::NodeIndex a, topo::NodeIndex b,
                                    Transport transport) {
  std::optional<topo::Path> path;
  switch (transport) {
    case Transport::kNvlink:
      path = t.route(a, b);
      break;
    case Transport::kPcieHostStaged:
      path = t.host_route(a, b);
      break;
    case Transport::kSameDevice:
      return Status::error("a same-device transfer crosses no link");
  }
  if (!path || path->links.empty())
    return Status::error("no " + std::string(to_string(transport)) + " route from '" +
                         t.node(a).id + "' to '" + t.node(b).id + "'");
  return std::move(*path);
}

std::optional<topo::LinkIndex> reverse_link(const topo::Topology& t, topo::LinkIndex link) {
  const topo::Link& l = t.link(link);
  std::optional<topo::LinkIndex> any;
  for (topo::LinkIndex back : t.out_links(l.to)) {
    if (t.link(back).to != l.from) continue;
    if (t.link(back).kind == l.kind) return back;  // the other direction of the same lanes
    if (!any) any = back;
  }
  return any;
}

}  // namespace efccl::host
