// Detection of the running host (detect.h, docs/topology-detect.md): sysfs for the PCI tree,
// NUMA nodes and NICs, an NVLink source (NVML) for NVLinks, CUDA's view (the caller's) for the
// GPUs and their order. Whatever cannot be read is noted and assumed; it never throws.
#include "efccl/topology/detect.h"

#include <algorithm>
#include <exception>
#include <map>
#include <memory>

#include "efccl/topology/presets.h"
#include "graph_builder.h"
#include "host_detection.h"
#include "sysfs_nics.h"
#include "sysfs_pci.h"

namespace efccl::topo {
namespace {

namespace fs = std::filesystem;
using sysfs::PciDevice;
using sysfs::PciLink;

/// A GPU as the caller (CUDA) or sysfs gave it.
struct GpuEntry {
  std::string pci;  ///< normalised when `pci_ok`, else as given
  bool pci_ok = false;
  int sm = 0;
  std::string name;
};

std::string gpu_label(std::size_t ordinal, const GpuEntry& g) {
  return "GPU " + std::to_string(ordinal) + " (" + (g.pci.empty() ? "no bus id" : g.pci) + ")";
}

/// A PCIe hop's capacity: the lower of the two ends' capabilities where each is readable.
struct Hop {
  double gbps = 0;
  int width = 0;
};
std::optional<Hop> hop_between(const PciLink& lower, const PciLink* upper) {
  PciLink l;
  if (lower.known()) l = lower;
  if (upper && upper->known())
    l = l.known() ? PciLink{std::min(l.gts, upper->gts), std::min(l.width, upper->width)} : *upper;
  if (!l.known()) return std::nullopt;
  return Hop{pcie_gbps(l.gts, l.width), l.width};
}

Hop assumed_hop() { return {pcie_gbps(kAssumedPcieGts, kAssumedPcieWidth), kAssumedPcieWidth}; }

const std::string kAssumedText = "PCIe Gen4 x16 assumed";

/// The host graph under construction: CPUs with their memory, PCIe switches met on the way to
/// devices, devices, NVLinks. The first error sticks; finish() reports it.
class Assembly : public GraphBuilder {
 public:
  explicit Assembly(const std::vector<int>& numas) {
    for (std::size_t k = 0; k < numas.size(); ++k) {
      Node cpu;
      cpu.kind = NodeKind::kCpu;
      cpu.id = "h0.cpu" + std::to_string(k);
      cpu.index = static_cast<int32_t>(k);
      cpu.numa = numas[k];
      Node mem = cpu;
      mem.kind = NodeKind::kHostMemory;
      mem.id = "h0.mem" + std::to_string(k);
      const NodeIndex c = add(std::move(cpu));
      const NodeIndex m = add(std::move(mem));
      duplex(c, m, LinkKind::kHost, kDetectMemoryGbps, kDetectHostLatencyUs, 1);
      cpus_.push_back(c);
    }
    // Every pair of CPUs joined: sockets (and a socket's sub-NUMA nodes) reach each other
    // directly; the capacity is an estimate (host_detection.h).
    for (std::size_t a = 0; a < cpus_.size(); ++a)
      for (std::size_t b = a + 1; b < cpus_.size(); ++b)
        duplex(cpus_[a], cpus_[b], LinkKind::kSmp, kDetectSmpGbps, kDetectSmpLatencyUs, 1);
  }

  /// The CPU of NUMA node `numa`; the first CPU for -1 or a node without CPUs.
  NodeIndex cpu_for(int numa) const {
    for (NodeIndex c : cpus_)
      if (t_.node(c).numa == numa) return c;
    return cpus_.front();
  }

  /// Hangs `node` under its CPU through the PCIe switches above `pci` (nullptr: right under
  /// the first CPU over an assumed link; the caller has said why). Notes assumed links.
  NodeIndex attach(Node node, const PciDevice* pci, std::vector<std::string>& notes,
                   const std::string& label) {
    NodeIndex parent = cpu_for(pci ? pci->numa : -1);
    const PciLink* parent_port = nullptr;  // the bridge port the next hop plugs into
    if (pci && !pci->bridges.empty()) {
      const auto& b = pci->bridges;
      parent_port = &b[0].link;  // the root port
      // Below the root port, bridges come as a switch's upstream port then a downstream port;
      // one switch node per upstream port, shared by every device below it.
      for (std::size_t i = 1; i < b.size(); i += 2) {
        const sysfs::PciBridge& up = b[i];
        const sysfs::PciBridge& down = i + 1 < b.size() ? b[i + 1] : b[i];
        auto it = switches_.find(up.bus_id);
        if (it == switches_.end()) {
          std::optional<Hop> h = hop_between(up.link, parent_port);
          if (!h) {
            notes.push_back("PCIe switch at " + up.bus_id +
                            ": link speed/width unreadable: " + kAssumedText);
            h = assumed_hop();
          }
          Node sw;
          sw.kind = NodeKind::kPcieSwitch;
          sw.id = "h0.pcisw" + std::to_string(switches_.size());
          sw.index = static_cast<int32_t>(switches_.size());
          sw.pci = up.bus_id;
          sw.numa = t_.node(parent).numa;
          const NodeIndex s = add(std::move(sw));
          duplex(parent, s, LinkKind::kPcie, h->gbps, kDetectPcieLatencyUs, h->width);
          it = switches_.emplace(up.bus_id, s).first;
        }
        parent = it->second;
        parent_port = &down.link;
      }
    }
    std::optional<Hop> h;
    if (pci) {
      h = hop_between(pci->link, parent_port);
      if (!h)
        notes.push_back(label + ": PCIe link speed/width unreadable (max_link_speed, " +
                        "max_link_width): " + kAssumedText);
    }
    if (!h) h = assumed_hop();
    node.numa = t_.node(parent).numa;
    const NodeIndex n = add(std::move(node));
    duplex(parent, n, LinkKind::kPcie, h->gbps, kDetectPcieLatencyUs, h->width);
    return n;
  }

  NodeIndex nvswitch() {
    if (!nvswitch_) {
      Node n;
      n.kind = NodeKind::kNvSwitch;
      n.id = "h0.nvs0";
      nvswitch_ = add(std::move(n));
    }
    return *nvswitch_;
  }

  StatusOr<Topology> finish() { return GraphBuilder::finish(/*check=*/true); }

 private:
  std::vector<NodeIndex> cpus_;
  std::map<std::string, NodeIndex> switches_;  // by the switch's upstream port
  std::optional<NodeIndex> nvswitch_;
};

Node gpu_node(std::size_t ordinal, const GpuEntry& g) {
  Node n;
  n.kind = NodeKind::kGpu;
  n.id = "h0.gpu" + std::to_string(ordinal);
  n.index = static_cast<int32_t>(ordinal);
  n.device = static_cast<int32_t>(ordinal);
  n.pci = g.pci;
  n.sm = g.sm;
  n.name = g.name;
  return n;
}

/// The GPUs detection works on: the caller's (CUDA order), else every NVIDIA GPU sysfs lists.
std::vector<GpuEntry> visible_gpus(const DetectOptions& options, const sysfs::SysfsTree& tree,
                                   std::vector<std::string>& notes) {
  std::vector<GpuEntry> gpus;
  if (options.gpus.empty() || options.whole_host) {
    for (const std::string& pci : tree.nvidia_gpus()) {
      if (gpus.size() >= kMaxDetectedGpus) break;
      gpus.push_back({pci, true, 0, ""});
    }
    if (options.gpus.empty()) return gpus;
    for (const DetectedGpu& g : options.gpus) {
      const auto id = sysfs::normalize_bus_id(g.pci);
      auto it = std::find_if(gpus.begin(), gpus.end(),
                             [&](const GpuEntry& e) { return id && e.pci == *id; });
      if (it != gpus.end()) {
        it->sm = g.sm;
        it->name = g.name;
      } else if (gpus.size() < kMaxDetectedGpus) {
        gpus.push_back({id ? *id : g.pci, id.has_value(), g.sm, g.name});
      }
    }
    return gpus;
  }
  if (options.gpus.size() > kMaxDetectedGpus)
    notes.push_back(std::to_string(options.gpus.size()) + " GPUs given: only the first " +
                    std::to_string(kMaxDetectedGpus) + " are placed");
  for (const DetectedGpu& g : options.gpus) {
    if (gpus.size() >= kMaxDetectedGpus) break;
    GpuEntry e{g.pci, false, g.sm, g.name};
    if (auto id = sysfs::normalize_bus_id(g.pci)) {
      e.pci = *id;
      e.pci_ok = true;
    }
    gpus.push_back(std::move(e));
  }
  return gpus;
}

/// Adds the NVLinks `source` reports: direct GPU-GPU links (the larger of the two ends'
/// counts) and links into one NVSwitch node per host.
void add_nvlinks(Assembly& a, const std::vector<GpuEntry>& gpus,
                 const std::vector<NodeIndex>& nodes, NvlinkSource& source,
                 const sysfs::SysfsTree& tree, std::vector<std::string>& notes) {
  std::map<std::string, std::size_t> by_pci;
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (gpus[i].pci_ok) by_pci.emplace(gpus[i].pci, i);
  std::map<std::pair<std::size_t, std::size_t>, int> direct;
  std::vector<int> to_switch(gpus.size(), 0);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (!gpus[i].pci_ok) continue;
    auto report = source.query(gpus[i].pci);
    if (!report) {
      notes.push_back(gpu_label(i, gpus[i]) + ": NVLinks unreadable (" + report.status().message() +
                      "): none assumed");
      continue;
    }
    Node& node = a.topology().mutable_node(nodes[i]);
    if (node.name.empty()) node.name = report->name;
    for (const NvlinkRemote& r : report->remotes) {
      if (r.links <= 0) continue;
      const auto seen = by_pci.find(r.pci);
      NvlinkRemoteKind kind = r.kind;
      if (kind == NvlinkRemoteKind::kUnknown)  // an old driver: tell by the bus id
        kind = seen != by_pci.end() || tree.is_nvidia_gpu(r.pci) ? NvlinkRemoteKind::kGpu
                                                                 : NvlinkRemoteKind::kSwitch;
      const std::string links = std::to_string(r.links) + " NVLink" + (r.links > 1 ? "s" : "");
      if (kind == NvlinkRemoteKind::kSwitch) {
        to_switch[i] += r.links;
      } else if (kind == NvlinkRemoteKind::kGpu && seen != by_pci.end()) {
        if (seen->second == i) continue;
        int& count = direct[std::minmax(i, seen->second)];
        count = std::max(count, r.links);
      } else {
        notes.push_back(gpu_label(i, gpus[i]) + ": " + links + " to " + r.pci +
                        (kind == NvlinkRemoteKind::kGpu ? ", a GPU CUDA does not see"
                                                        : ", neither a GPU nor an NVSwitch") +
                        ": not used");
      }
    }
  }
  std::vector<double> lane(gpus.size(), 0);
  auto lane_gbps = [&](std::size_t i) {
    if (lane[i] > 0) return lane[i];
    lane[i] = nvlink_lane_gbps(gpus[i].sm);
    if (lane[i] <= 0) {
      notes.push_back(gpu_label(i, gpus[i]) + ": NVLink generation unknown (sm " +
                      std::to_string(gpus[i].sm) +
                      "): " + std::to_string(static_cast<int>(kAssumedNvlinkLaneGbps)) +
                      " GB/s per link and direction assumed");
      lane[i] = kAssumedNvlinkLaneGbps;
    }
    return lane[i];
  };
  for (const auto& [pair, count] : direct)
    a.duplex(nodes[pair.first], nodes[pair.second], LinkKind::kNvlink,
             count * std::min(lane_gbps(pair.first), lane_gbps(pair.second)),
             kDetectNvlinkLatencyUs, count);
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (to_switch[i] > 0)
      a.duplex(nodes[i], a.nvswitch(), LinkKind::kNvlink, to_switch[i] * lane_gbps(i),
               kDetectNvlinkLatencyUs, to_switch[i]);
}

/// GPUs under one CPU over assumed PCIe links: what is left when nothing else can be built.
Topology fallback_graph(const std::vector<GpuEntry>& gpus) {
  Assembly a({0});
  std::vector<std::string> ignored;
  for (std::size_t i = 0; i < gpus.size(); ++i)
    a.attach(gpu_node(i, gpus[i]), nullptr, ignored, "");
  auto t = a.finish();
  return t ? std::move(*t) : Topology{};
}

Detection assemble(const DetectOptions& options, NvlinkSource* nvlinks,
                   std::vector<GpuEntry>& gpus) {
  Detection d;
  const sysfs::SysfsTree tree(options.sysfs_root);
  const fs::path pci_dir = tree.root() / "bus" / "pci" / "devices";
  std::error_code ec;
  const bool have_pci = fs::is_directory(pci_dir, ec);
  if (!have_pci)
    d.notes.push_back("no PCI devices under " + pci_dir.string() + ": GPUs placed under one CPU, " +
                      kAssumedText);
  gpus = visible_gpus(options, tree, d.notes);

  std::vector<int> numas = tree.cpu_numa_nodes();
  if (numas.empty()) {
    d.notes.push_back("no NUMA node with CPUs under " +
                      (tree.root() / "devices" / "system" / "node").string() +
                      ": one CPU (NUMA node 0) assumed");
    numas = {0};
  }
  Assembly a(numas);

  std::vector<NodeIndex> gpu_nodes;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const std::string label = gpu_label(i, gpus[i]);
    std::optional<PciDevice> pci;
    if (!gpus[i].pci_ok) {
      d.notes.push_back(label + ": not a PCI bus id: placed under the first CPU, " + kAssumedText);
    } else if (have_pci) {
      auto dev = tree.device(gpus[i].pci);
      if (dev)
        pci = std::move(*dev);
      else
        d.notes.push_back(label + ": " + dev.status().message() + ": placed under the first CPU, " +
                          kAssumedText);
    }
    gpu_nodes.push_back(a.attach(gpu_node(i, gpus[i]), pci ? &*pci : nullptr, d.notes, label));
  }

  const std::vector<sysfs::DetectedNic> nics = sysfs::list_nics(tree, d.notes);
  for (std::size_t k = 0; k < nics.size(); ++k) {
    Node n;
    n.kind = NodeKind::kNic;
    n.id = "h0.nic" + std::to_string(k);
    n.index = n.device = n.rail = static_cast<int32_t>(k);
    n.name = nics[k].name;
    n.gbps = nics[k].gbps;
    if (nics[k].pci) n.pci = nics[k].pci->bus_id;
    const std::string label = "NIC " + n.name + (n.pci.empty() ? "" : " (" + n.pci + ")");
    a.attach(std::move(n), nics[k].pci ? &*nics[k].pci : nullptr, d.notes, label);
  }

  if (nvlinks) add_nvlinks(a, gpus, gpu_nodes, *nvlinks, tree, d.notes);

  auto t = a.finish();
  if (t) {
    d.topology = std::move(*t);
  } else {
    d.notes.push_back("the detected graph is not valid (" + t.status().message() +
                      "): GPUs placed under one CPU, " + kAssumedText);
    d.topology = fallback_graph(gpus);
  }
  return d;
}

}  // namespace

Detection detect_host_with(const DetectOptions& options, NvlinkSource* nvlinks) {
  Detection d;
  std::vector<GpuEntry> gpus;
  try {
    d = assemble(options, nvlinks, gpus);
    if (!options.nccl_topo_file.empty()) apply_nccl_topo_file(options.nccl_topo_file, d);
  } catch (const std::exception& e) {
    d.notes.push_back(std::string("detection stopped (") + e.what() + "): GPUs placed under " +
                      "one CPU, " + kAssumedText);
    d.topology = fallback_graph(gpus);
  }
  return d;
}

Detection detect_host(const DetectOptions& options) {
  try {
    std::unique_ptr<NvlinkSource> nvml;
    std::string why;
    if (options.use_nvml) {
      auto opened = open_nvml();
      if (opened)
        nvml = std::move(*opened);
      else
        why = opened.status().message() + ": no NVLink detected";
    }
    Detection d = detect_host_with(options, nvml.get());
    if (!why.empty()) d.notes.insert(d.notes.begin(), why);
    return d;
  } catch (...) {  // memory exhausted while building the notes: an empty graph, said once
    Detection d;
    d.notes.push_back("detection failed: an empty graph");
    return d;
  }
}

}  // namespace efccl::topo
