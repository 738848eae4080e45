// NCCL_TOPO_FILE on top of detection (host_detection.h, docs/topology-detect.md): as in NCCL,
// the file's content overrides detection, and detection completes what the file leaves out.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "efccl/topology/nccl_xml.h"
#include "efccl/topology/presets.h"
#include "graph_builder.h"
#include "host_detection.h"
#include "sysfs_pci.h"

namespace efccl::topo {
namespace {

/// Builds the overlaid graph; the first error sticks.
class Overlay : public GraphBuilder {
 public:
  /// The CPU of NUMA node `numa`, else the first CPU, else a new CPU with its memory.
  NodeIndex cpu_for(int numa) {
    std::optional<NodeIndex> first;
    for (NodeIndex c : t_.nodes_of(NodeKind::kCpu)) {
      if (t_.node(c).numa == numa) return c;
      if (!first) first = c;
    }
    if (first) return *first;
    Node cpu;
    cpu.kind = NodeKind::kCpu;
    cpu.id = unused_id("h0.cpu");
    cpu.numa = 0;
    Node mem = cpu;
    mem.kind = NodeKind::kHostMemory;
    mem.id = unused_id("h0.mem");
    const NodeIndex c = add(std::move(cpu));
    const NodeIndex m = add(std::move(mem));
    duplex(c, m, LinkKind::kHost, kDetectMemoryGbps, kDetectHostLatencyUs, 1);
    return c;
  }
  std::string unused_id(const std::string& prefix) const {
    for (int k = 0;; ++k)
      if (!t_.find(prefix + std::to_string(k))) return prefix + std::to_string(k);
  }
};

/// The PCIe link a detected device has toward its parent: capacity and lanes; Gen4 x16 when
/// it has none.
std::pair<double, int> detected_pcie(const Topology& t, NodeIndex device) {
  for (LinkIndex l : t.out_links(device))
    if (t.link(l).kind == LinkKind::kPcie) return {t.link(l).gbps, t.link(l).lanes};
  return {pcie_gbps(kAssumedPcieGts, kAssumedPcieWidth), kAssumedPcieWidth};
}

/// Copies detected device `d` (a GPU or NIC) under the overlay's CPU of its NUMA node.
void add_detected(Overlay& o, const Topology& detected, NodeIndex d, Node copy) {
  const auto [gbps, lanes] = detected_pcie(detected, d);
  const NodeIndex cpu = o.cpu_for(detected.node(d).numa);
  copy.numa = o.topology().node(cpu).numa;
  const NodeIndex n = o.add(std::move(copy));
  o.duplex(cpu, n, LinkKind::kPcie, gbps, kDetectPcieLatencyUs, lanes);
}

}  // namespace

StatusOr<Topology> overlay_topo_file(const Topology& file, const Topology& detected,
                                     std::vector<std::string>& notes) {
  const std::vector<NodeIndex> visible = detected.gpus();
  std::map<std::string, NodeIndex> visible_by_pci;
  for (NodeIndex g : visible)
    if (!detected.node(g).pci.empty()) visible_by_pci.emplace(detected.node(g).pci, g);
  const bool keep_file_gpus = visible.empty();

  Overlay o;
  std::vector<std::optional<NodeIndex>> mapped(file.nodes().size());
  std::set<NodeIndex> matched;
  std::string dropped;
  std::size_t other_hosts = 0;
  bool file_has_nic = false;
  for (NodeIndex i = 0; i < file.nodes().size(); ++i) {
    Node n = file.node(i);
    if (n.host != 0) {  // a one-host graph is expected; rail switches and other hosts go
      ++other_hosts;
      continue;
    }
    if (n.kind == NodeKind::kNic) file_has_nic = true;
    if (n.kind == NodeKind::kGpu && !keep_file_gpus) {
      const auto pci = sysfs::normalize_bus_id(n.pci);
      const auto it = pci ? visible_by_pci.find(*pci) : visible_by_pci.end();
      if (it == visible_by_pci.end() || !matched.insert(it->second).second) {
        dropped += (dropped.empty() ? "" : ", ") + n.id + (n.pci.empty() ? "" : " " + n.pci);
        continue;
      }
      const Node& v = detected.node(it->second);  // CUDA's view names and orders the GPU
      n.id = v.id;
      n.index = v.index;
      n.device = v.device;
      n.pci = v.pci;
      if (v.sm > 0) n.sm = v.sm;
      if (!v.name.empty()) n.name = v.name;
    }
    mapped[i] = o.add(std::move(n));
  }
  for (const Link& l : file.links())
    if (mapped[l.from] && mapped[l.to]) {
      Link copy = l;
      copy.from = *mapped[l.from];
      copy.to = *mapped[l.to];
      o.link(copy);
    }
  if (other_hosts > 0)
    notes.push_back("NCCL_TOPO_FILE: " + std::to_string(other_hosts) +
                    " nodes not of host 0 ignored");
  if (!dropped.empty())
    notes.push_back("NCCL_TOPO_FILE: GPUs CUDA does not see dropped: " + dropped);
  if (!keep_file_gpus)
    for (NodeIndex g : visible) {
      if (matched.count(g)) continue;
      const Node& v = detected.node(g);
      notes.push_back("NCCL_TOPO_FILE has no GPU " + (v.pci.empty() ? v.id : v.pci) +
                      " (CUDA device " + std::to_string(v.device) +
                      "): added under its CPU over PCIe as detected");
      add_detected(o, detected, g, v);
    }
  if (!file_has_nic && !detected.nics().empty()) {
    notes.push_back("NCCL_TOPO_FILE has no NIC: the " + std::to_string(detected.nics().size()) +
                    " detected NICs added under their CPUs");
    for (NodeIndex x : detected.nics()) {
      Node n = detected.node(x);
      n.id = o.unused_id("h0.nic");
      add_detected(o, detected, x, std::move(n));
    }
  }
  if (!o.status()) return o.status();
  if (Status s = o.topology().check(); !s) return s;
  return std::move(o.topology());
}

void apply_nccl_topo_file(const std::string& path, Detection& detection) {
  if (std::ifstream probe(path); !probe) {
    detection.notes.push_back("NCCL_TOPO_FILE '" + path + "' cannot be opened (" +
                              std::strerror(errno) + "): the detected topology is used");
    return;
  }
  auto file = load_nccl_xml(path);
  if (!file) {
    detection.notes.push_back("NCCL_TOPO_FILE '" + path + "': " + file.status().message() +
                              ": the detected topology is used");
    return;
  }
  auto merged = overlay_topo_file(*file, detection.topology, detection.notes);
  if (!merged) {
    detection.notes.push_back("NCCL_TOPO_FILE '" + path + "' does not fit this host (" +
                              merged.status().message() + "): the detected topology is used");
    return;
  }
  detection.topology = std::move(*merged);
  detection.notes.push_back("NCCL_TOPO_FILE '" + path + "' is this host's topology");
}

}  // namespace efccl::topo
