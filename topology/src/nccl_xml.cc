// NCCL's topology XML as a graph (efccl/topology/nccl_xml.h). docs/topology-nccl-xml.md lists
// what is read, what is ignored, and the figures assumed where a file gives none.
//
// Two passes over the parsed document: the first walks <cpu> and the <pci> trees under them and
// records every CPU, PCIe switch, GPU and NIC with its parent and its upstream link; the second
// numbers GPUs and NICs (device ordinals, rails), adds the nodes and their PCIe links, then the
// NVLink and C2C links the <gpu> elements list (their targets are only known once every GPU is).
#include "efccl/topology/nccl_xml.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "efccl/ef/xml_reader.h"
#include "efccl/topology/presets.h"
#include "link_estimates.h"

namespace efccl::topo {
namespace {

using ef::XmlDocument;
using ef::XmlElement;

constexpr std::size_t kMaxFileBytes = 16u << 20;
// The XML reader's limits. NCCL's trees are about 8 deep (system/cpu/pci/pci/pci/gpu/nvlink)
// and a dump of a large machine has a few thousand elements; these leave ample room while
// keeping hostile input cheap to reject.
constexpr int kMaxDepth = 32;
constexpr std::size_t kMaxElements = 1u << 18;
constexpr std::size_t kMaxMemoryBytes = 64u << 20;
// More NUMA nodes than any machine has; bounds the inter-CPU links (one per pair).
constexpr std::size_t kMaxCpus = 256;
// Bounds on numbers a file may give; beyond them the file is wrong, not the machine.
constexpr int64_t kMaxLanes = 64;           // NVLink / C2C links of one GPU to one peer
constexpr int64_t kMaxPcieWidth = 64;       // link_width
constexpr int64_t kMaxNicMbps = 100000000;  // 100 Tb/s
constexpr int64_t kMaxC2cMBps = 100000000;  // per C2C link, MB/s
constexpr int64_t kMaxOrdinal = 1 << 20;    // dev, numaid
constexpr int64_t kMaxSm = 1000;
constexpr std::size_t kMaxNameBytes = 64;  // <net name>

// Defaults where a file says nothing (docs/topology-nccl-xml.md says why each).
constexpr double kUnknownPcieGts = 8.0;  // as NCCL: PCIe Gen3 when sysfs gave no speed
constexpr int kUnknownPcieWidth = 16;    // as NCCL: link_width 0 or absent is x16
// A NIC with no speed directly under a <cpu> (no PCIe link to bound it): NCCL's 10 Gb/s.
constexpr double kUnknownNicGbps = 10.0 / 8.0;

/// The parent of a device: a CPU or a PCIe switch (an index into the matching record list).
struct Parent {
  bool is_switch = false;
  uint32_t index = 0;
};

struct PcieLink {
  double gbps = 0;
  int width = 0;
};

struct CpuRecord {
  const XmlElement* element = nullptr;
  int numa = -1;
};

struct SwitchRecord {
  Parent parent;
  int numa = -1;
  PcieLink up;
  std::string pci;
};

struct GpuRecord {
  const XmlElement* element = nullptr;  ///< the <pci>
  const XmlElement* gpu = nullptr;      ///< its <gpu>, absent for a PCI hint
  Parent parent;
  int numa = -1;
  PcieLink up;
  std::string pci;
  uint64_t bus = 0;
  int sm = 0;
  std::optional<int> dev;
  NodeIndex node = 0;
};

struct NicRecord {
  const XmlElement* element = nullptr;  ///< the <net>, or the <pci> of a hint
  Parent parent;
  int numa = -1;
  std::optional<PcieLink> up;  ///< absent for a <nic> directly under a <cpu>
  std::string pci;
  std::optional<uint64_t> bus;  ///< absent for a <nic> directly under a <cpu>
  std::string name;
  std::optional<int> dev;
  double gbps = 0;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

/// A PCI bus id as NCCL reads one: its hex digits, ':' and '.' ignored ("0000:1b:00.0" ->
/// 0x1b000); nullopt for anything else or more than 16 digits.
std::optional<uint64_t> parse_bus_id(std::string_view s) {
  if (s.empty() || s.size() > 32) return std::nullopt;
  uint64_t value = 0;
  int digits = 0;
  for (char c : s) {
    if (c == ':' || c == '.') continue;
    int d = 0;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return std::nullopt;
    if (++digits > 16) return std::nullopt;
    value = (value << 4) | static_cast<uint64_t>(d);
  }
  if (digits == 0) return std::nullopt;
  return value;
}

/// "16.0 GT/s PCIe" (kernels from 5.7), "16 GT/s" (older): the rate in GT/s; nullopt for
/// anything else ("Unknown", empty).
std::optional<double> parse_link_speed(std::string_view s) {
  double gts = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), gts);
  if (ec != std::errc() || !(gts > 0 && gts <= 1024)) return std::nullopt;
  const std::string_view rest(end, static_cast<std::size_t>(s.data() + s.size() - end));
  if (rest != " GT/s" && rest != " GT/s PCIe") return std::nullopt;
  return gts;
}

/// Walks one document; the first error stops it.
class Reader {
 public:
  Reader(const XmlDocument& doc, std::string_view where) : doc_(doc), where_(where) {}

  StatusOr<Topology> read() {
    const XmlElement& root = doc_.root();
    if (root.name != "system")
      return fail(root, "the root element must be <system> (NCCL's topology XML)");
    for (uint32_t c : doc_.children(root)) {
      const XmlElement& e = doc_.element(c);
      if (e.name != "cpu") continue;  // NCCL reads only <cpu> under <system>
      if (Status s = walk_cpu(e); !s) return s;
    }
    if (cpus_.empty()) return fail(root, "no <cpu>: the file describes no machine");
    if (Status s = number_devices(); !s) return s;
    if (Status s = build(); !s) return s;
    if (Status s = add_gpu_links(); !s) return s;
    if (Status s = t_.check(); !s) return Status::error(std::string(where_) + ": " + s.message());
    return std::move(t_);
  }

 private:
  // --- errors and attributes -------------------------------------------------------------

  Status fail(const XmlElement& e, const std::string& what) const {
    return Status::error(std::string(where_) + ":" + std::to_string(e.line) + ": <" +
                         std::string(e.name) + "> " + what);
  }

  StatusOr<std::string_view> required(const XmlElement& e, std::string_view name) const {
    auto v = doc_.attribute(e, name);
    if (!v) return fail(e, "has no attribute '" + std::string(name) + "'");
    return *v;
  }

  /// A decimal integer attribute within [min, max]; nullopt when absent.
  StatusOr<std::optional<int64_t>> integer(const XmlElement& e, std::string_view name, int64_t min,
                                           int64_t max) const {
    auto v = doc_.attribute(e, name);
    if (!v) return std::optional<int64_t>();
    int64_t x = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
    if (ec != std::errc() || end != v->data() + v->size() || v->empty())
      return fail(
          e, std::string(name) + "=" + ef::quoted_for_message(*v) + " is not a decimal integer");
    if (x < min || x > max)
      return fail(e, std::string(name) + "=" + std::to_string(x) + " is outside " +
                         std::to_string(min) + " ... " + std::to_string(max));
    return std::optional<int64_t>(x);
  }

  StatusOr<int64_t> required_integer(const XmlElement& e, std::string_view name, int64_t min,
                                     int64_t max) const {
    auto v = integer(e, name, min, max);
    if (!v) return v.status();
    if (!*v) return fail(e, "has no attribute '" + std::string(name) + "'");
    return **v;
  }

  /// A PCI class ("0x030200"): "0x" and 1 ... 6 hex digits.
  StatusOr<uint32_t> pci_class(const XmlElement& e, std::string_view name) const {
    auto v = required(e, name);
    if (!v) return v.status();
    const std::string_view s = *v;
    uint32_t x = 0;
    const bool prefixed = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    const char* begin = s.data() + 2;
    const char* stop = s.data() + s.size();
    if (prefixed && s.size() <= 8) {
      const auto [end, ec] = std::from_chars(begin, stop, x, 16);
      if (ec == std::errc() && end == stop) return x;
    }
    return fail(e, std::string(name) + "=" + ef::quoted_for_message(s) +
                       " is not a PCI class (0x and up to 6 hex digits)");
  }

  StatusOr<uint64_t> bus_id(const XmlElement& e, std::string_view name) const {
    auto v = required(e, name);
    if (!v) return v.status();
    auto bus = parse_bus_id(*v);
    if (!bus)
      return fail(e, std::string(name) + "=" + ef::quoted_for_message(*v) +
                         " is not a PCI bus id (like 0000:1b:00.0)");
    return *bus;
  }

  /// The link a <pci> element has to its parent: pcie_gbps(link_speed, link_width).
  StatusOr<PcieLink> pcie_link(const XmlElement& e) const {
    auto width = integer(e, "link_width", 0, kMaxPcieWidth);
    if (!width) return width.status();
    PcieLink link;
    link.width = (*width && **width > 0) ? static_cast<int>(**width) : kUnknownPcieWidth;
    std::optional<double> gts;
    if (auto speed = doc_.attribute(e, "link_speed")) gts = parse_link_speed(*speed);
    link.gbps = pcie_gbps(gts.value_or(kUnknownPcieGts), link.width);
    return link;
  }

  std::vector<const XmlElement*> children_named(const XmlElement& e, std::string_view n) const {
    std::vector<const XmlElement*> out;
    for (uint32_t c : doc_.children(e))
      if (doc_.element(c).name == n) out.push_back(&doc_.element(c));
    return out;
  }

  Status count_node(const XmlElement& e) {
    // Every record becomes one node (a CPU two); the NVSwitch fabric adds one.
    if (++nodes_ + 1 > kMaxNodes)
      return fail(e, "the graph would have more than " + std::to_string(kMaxNodes) + " nodes");
    return Status::ok();
  }

  // --- first pass: records ----------------------------------------------------------------

  Status walk_cpu(const XmlElement& e) {
    auto numa = required_integer(e, "numaid", -1, kMaxOrdinal);
    if (!numa) return numa.status();
    if (cpus_.size() >= kMaxCpus)
      return fail(e, "more than " + std::to_string(kMaxCpus) + " <cpu> elements");
    for (const CpuRecord& c : cpus_)
      if (*numa >= 0 && c.numa == *numa)
        return fail(e, "numaid " + std::to_string(*numa) + " is given twice (first on line " +
                           std::to_string(c.element->line) + ")");
    if (Status s = count_node(e); !s) return s;
    if (Status s = count_node(e); !s) return s;  // its host memory
    cpus_.push_back({&e, static_cast<int>(*numa)});
    const Parent self{false, static_cast<uint32_t>(cpus_.size() - 1)};
    for (uint32_t c : doc_.children(e)) {
      const XmlElement& child = doc_.element(c);
      Status s = Status::ok();
      if (child.name == "pci")
        s = walk_pci(child, self, static_cast<int>(*numa));
      else if (child.name == "nic")
        s = walk_nic(child, self, static_cast<int>(*numa), std::nullopt, "", std::nullopt);
      if (!s) return s;
    }
    return Status::ok();
  }

  Status walk_pci(const XmlElement& e, Parent parent, int numa) {
    auto bus = bus_id(e, "busid");
    if (!bus) return bus.status();
    auto cls = pci_class(e, "class");
    if (!cls) return cls.status();
    auto link = pcie_link(e);
    if (!link) return link.status();
    if (auto [it, fresh] = bus_lines_.emplace(*bus, e.line); !fresh)
      return fail(e, "busid " + ef::quoted_for_message(*doc_.attribute(e, "busid")) +
                         " is given twice (first on line " + std::to_string(it->second) + ")");
    const std::string pci = lower(*doc_.attribute(e, "busid"));
    const auto gpus = children_named(e, "gpu");
    const auto nics = children_named(e, "nic");
    if (gpus.size() > 1) return fail(*gpus[1], "a second <gpu> in one <pci>");
    if (!gpus.empty() && !nics.empty()) return fail(*nics[0], "a <nic> beside a <gpu>");
    if (!gpus.empty()) return add_gpu(e, gpus[0], parent, numa, *link, pci, *bus);
    bool has_ports = false;
    for (const XmlElement* nic : nics) {
      has_ports = has_ports || !children_named(*nic, "net").empty();
      if (Status s = walk_nic(*nic, parent, numa, *link, pci, *bus); !s) return s;
    }
    if (has_ports) return Status::ok();
    // No <net> (or no <nic>): the device is known by its class alone, a hint.
    const uint32_t base = *cls >> 8;  // class and subclass
    if (base == 0x0604) return add_switch(e, parent, numa, *link, pci);
    if (*cls == 0x068000 || *cls == 0x068001) return Status::ok();  // NVSwitch / NPU itself
    if (base >> 8 == 0x03) return add_gpu(e, nullptr, parent, numa, *link, pci, *bus);
    if (base >> 8 == 0x02) {
      if (Status s = count_node(e); !s) return s;
      NicRecord n;
      n.element = &e;
      n.parent = parent;
      n.numa = numa;
      n.up = *link;
      n.pci = pci;
      n.bus = *bus;
      n.gbps = link->gbps;  // a hint gives no speed: the NIC's PCIe link bounds it
      nics_.push_back(std::move(n));
      return Status::ok();
    }
    // Another class: as NCCL, a bridge when devices hang under it; otherwise not ours.
    if (!children_named(e, "pci").empty()) return add_switch(e, parent, numa, *link, pci);
    return Status::ok();
  }

  Status add_switch(const XmlElement& e, Parent parent, int numa, PcieLink link,
                    const std::string& pci) {
    if (Status s = count_node(e); !s) return s;
    switches_.push_back({parent, numa, link, pci});
    const Parent self{true, static_cast<uint32_t>(switches_.size() - 1)};
    for (const XmlElement* child : children_named(e, "pci"))
      if (Status s = walk_pci(*child, self, numa); !s) return s;
    return Status::ok();
  }

  Status add_gpu(const XmlElement& e, const XmlElement* gpu, Parent parent, int numa, PcieLink link,
                 const std::string& pci, uint64_t bus) {
    if (Status s = count_node(e); !s) return s;
    GpuRecord g;
    g.element = &e;
    g.gpu = gpu;
    g.parent = parent;
    g.numa = numa;
    g.up = link;
    g.pci = pci;
    g.bus = bus;
    if (gpu) {
      auto sm = required_integer(*gpu, "sm", 0, kMaxSm);
      if (!sm) return sm.status();
      g.sm = static_cast<int>(*sm);
      auto dev = integer(*gpu, "dev", 0, kMaxOrdinal);
      if (!dev) return dev.status();
      if (*dev) g.dev = static_cast<int>(**dev);
    }
    gpus_.push_back(std::move(g));
    return Status::ok();
  }

  /// The <net> ports of a <nic>; `link` is the NIC's PCIe link, absent under a <cpu>.
  Status walk_nic(const XmlElement& e, Parent parent, int numa, std::optional<PcieLink> link,
                  const std::string& pci, std::optional<uint64_t> bus) {
    for (const XmlElement* net : children_named(e, "net")) {
      auto dev = integer(*net, "dev", -1, kMaxOrdinal);
      if (!dev) return dev.status();
      auto mbps = integer(*net, "speed", -1, kMaxNicMbps);
      if (!mbps) return mbps.status();
      const std::string name(doc_.attribute(*net, "name").value_or(""));
      // Device names ("mlx5_0", "eth0") are short printable ASCII; the graph's JSON needs
      // valid UTF-8 at least.
      if (name.size() > kMaxNameBytes ||
          !std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 0x7f; }))
        return fail(*net, "name=" + ef::quoted_for_message(name) + " is not a device name (" +
                              std::to_string(kMaxNameBytes) + " printable ASCII bytes at most)");
      // The same port listed under each <cpu> (a socket NIC): the first listing wins.
      if (!name.empty() && !net_names_.emplace(name, net->line).second) continue;
      if (Status s = count_node(*net); !s) return s;
      NicRecord n;
      n.element = net;
      n.parent = parent;
      n.numa = numa;
      n.up = link;
      n.pci = pci;
      n.bus = bus;
      n.name = name;
      if (*dev && **dev >= 0) n.dev = static_cast<int>(**dev);
      if (*mbps && **mbps > 0)
        n.gbps = static_cast<double>(**mbps) / 8000.0;  // Mb/s -> GB/s
      else
        n.gbps = link ? link->gbps : kUnknownNicGbps;
      nics_.push_back(std::move(n));
    }
    return Status::ok();
  }

  // --- second pass: numbering, nodes, links -------------------------------------------------

  /// GPUs: those with <gpu dev> in dev order, then the others in bus id order. NICs: those
  /// with <net dev> in dev order, then the others in bus id order, then those under a <cpu>.
  Status number_devices() {
    std::vector<uint32_t> order(gpus_.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const GpuRecord& x = gpus_[a];
      const GpuRecord& y = gpus_[b];
      if (x.dev.has_value() != y.dev.has_value()) return x.dev.has_value();
      if (x.dev) return *x.dev < *y.dev;
      return x.bus < y.bus;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
      const GpuRecord& prev = gpus_[order[i - 1]];
      const GpuRecord& g = gpus_[order[i]];
      if (g.dev && prev.dev && *g.dev == *prev.dev)
        return fail(*g.gpu, "dev " + std::to_string(*g.dev) + " is given twice (first on line " +
                                std::to_string(prev.gpu->line) + ")");
    }
    gpu_order_ = std::move(order);
    std::vector<uint32_t> nic_order(nics_.size());
    for (uint32_t i = 0; i < nic_order.size(); ++i) nic_order[i] = i;
    std::stable_sort(nic_order.begin(), nic_order.end(), [&](uint32_t a, uint32_t b) {
      const NicRecord& x = nics_[a];
      const NicRecord& y = nics_[b];
      if (x.dev.has_value() != y.dev.has_value()) return x.dev.has_value();
      if (x.dev) return *x.dev < *y.dev;
      if (x.bus.has_value() != y.bus.has_value()) return x.bus.has_value();
      return x.bus && *x.bus < *y.bus;
    });
    for (std::size_t i = 1; i < nic_order.size(); ++i) {
      const NicRecord& prev = nics_[nic_order[i - 1]];
      const NicRecord& n = nics_[nic_order[i]];
      if (n.dev && prev.dev && *n.dev == *prev.dev)
        return fail(*n.element, "dev " + std::to_string(*n.dev) +
                                    " is given twice (first on line " +
                                    std::to_string(prev.element->line) + ")");
    }
    nic_order_ = std::move(nic_order);
    return Status::ok();
  }

  static Node make(NodeKind kind, std::string id, std::size_t index, int numa) {
    Node n;
    n.kind = kind;
    n.id = std::move(id);
    n.index = static_cast<int32_t>(index);
    n.numa = numa;
    return n;
  }

  NodeIndex parent_node(Parent p) const {
    return p.is_switch ? switch_nodes_[p.index] : cpu_nodes_[p.index];
  }

  Status build() {
    for (std::size_t i = 0; i < cpus_.size(); ++i) {
      const std::string n = std::to_string(i);
      auto cpu = t_.add_node(make(NodeKind::kCpu, "h0.cpu" + n, i, cpus_[i].numa));
      if (!cpu) return cpu.status();
      auto mem = t_.add_node(make(NodeKind::kHostMemory, "h0.mem" + n, i, cpus_[i].numa));
      if (!mem) return mem.status();
      // The file names no memory: the estimate of docs/topology-nccl-xml.md.
      if (Status s = t_.add_duplex(*cpu, *mem, LinkKind::kHost, kSprMemoryGbps, kHostLatencyUs); !s)
        return s;
      for (NodeIndex other : cpu_nodes_)  // NCCL joins every pair of CPUs
        if (Status s = t_.add_duplex(other, *cpu, LinkKind::kSmp, kSprUpiGbps, kSmpLatencyUs); !s)
          return s;
      cpu_nodes_.push_back(*cpu);
    }
    // Switches were recorded parent first, so each parent exists before its children.
    for (std::size_t i = 0; i < switches_.size(); ++i) {
      const SwitchRecord& r = switches_[i];
      Node n = make(NodeKind::kPcieSwitch, "h0.pcisw" + std::to_string(i), i, r.numa);
      n.pci = r.pci;
      auto sw = t_.add_node(std::move(n));
      if (!sw) return sw.status();
      switch_nodes_.push_back(*sw);
      if (Status s = t_.add_duplex(parent_node(r.parent), *sw, LinkKind::kPcie, r.up.gbps,
                                   kPcieLatencyUs, r.up.width);
          !s)
        return s;
    }
    int next_device = 0;
    for (const GpuRecord& g : gpus_)
      if (g.dev) next_device = std::max(next_device, *g.dev + 1);
    for (std::size_t i = 0; i < gpu_order_.size(); ++i) {
      GpuRecord& r = gpus_[gpu_order_[i]];
      Node n = make(NodeKind::kGpu, "h0.gpu" + std::to_string(i), i, r.numa);
      n.pci = r.pci;
      n.sm = r.sm;
      n.device = r.dev ? *r.dev : next_device++;
      auto gpu = t_.add_node(std::move(n));
      if (!gpu) return gpu.status();
      r.node = *gpu;
      gpu_by_bus_.emplace(r.bus, gpu_order_[i]);
      if (Status s = t_.add_duplex(parent_node(r.parent), *gpu, LinkKind::kPcie, r.up.gbps,
                                   kPcieLatencyUs, r.up.width);
          !s)
        return s;
    }
    for (std::size_t i = 0; i < nic_order_.size(); ++i) {
      const NicRecord& r = nics_[nic_order_[i]];
      Node n = make(NodeKind::kNic, "h0.nic" + std::to_string(i), i, r.numa);
      n.pci = r.pci;
      n.name = r.name;
      n.device = r.dev.value_or(-1);
      n.rail = static_cast<int32_t>(i);
      n.gbps = r.gbps;
      auto nic = t_.add_node(std::move(n));
      if (!nic) return nic.status();
      // Under a <cpu> directly there is no PCIe link to read: the port's own speed.
      const PcieLink up = r.up.value_or(PcieLink{r.gbps, 1});
      if (Status s = t_.add_duplex(parent_node(r.parent), *nic, LinkKind::kPcie, up.gbps,
                                   kPcieLatencyUs, up.width);
          !s)
        return s;
    }
    return Status::ok();
  }

  /// NVLink lanes from one GPU to one peer, summed over its <nvlink> elements.
  struct Lanes {
    int64_t count = 0;
    double lane_gbps = 0;
  };

  Status add_gpu_links() {
    std::map<std::pair<uint32_t, uint32_t>, Lanes> peer;  // (from, to) GPU records
    std::map<uint32_t, Lanes> to_nvswitch, to_cpu;
    std::map<uint32_t, std::pair<int64_t, double>> c2c;  // lanes, GB/s
    for (uint32_t gi : gpu_order_) {
      const GpuRecord& g = gpus_[gi];
      if (!g.gpu) continue;
      for (uint32_t c : doc_.children(*g.gpu)) {
        const XmlElement& e = doc_.element(c);
        if (e.name == "c2c") {
          auto bw = required_integer(e, "bw", 1, kMaxC2cMBps);
          if (!bw) return bw.status();
          auto count = required_integer(e, "count", 1, kMaxLanes);
          if (!count) return count.status();
          auto& [lanes, gbps] = c2c[gi];
          lanes += *count;
          gbps += static_cast<double>(*bw) * static_cast<double>(*count) / 1000.0;  // MB/s
          continue;
        }
        if (e.name != "nvlink") continue;
        auto target = bus_id(e, "target");
        if (!target) return target.status();
        auto count = required_integer(e, "count", 1, kMaxLanes);
        if (!count) return count.status();
        auto tclass = pci_class(e, "tclass");
        if (!tclass) return tclass.status();
        const double lane = nvlink_lane_gbps(g.sm);
        if (lane <= 0)
          return fail(
              e, "the GPU's sm " + std::to_string(g.sm) + " has no known NVLink rate per link");
        Lanes* sum = nullptr;
        if (*tclass >> 16 == 0x03) {
          auto it = gpu_by_bus_.find(*target);
          if (it == gpu_by_bus_.end())
            return fail(e, "target " + ef::quoted_for_message(*doc_.attribute(e, "target")) +
                               " is no GPU of this file");
          if (it->second == gi) return fail(e, "an NVLink from a GPU to itself");
          sum = &peer[{gi, it->second}];
        } else if (*tclass == 0x068000) {
          // Every NVSwitch (the collapsed "fffffff:ff:ff.0", a listed switch, or one NVML
          // named that the dump does not list) is the host's one fabric, as in NCCL.
          sum = &to_nvswitch[gi];
        } else if (*tclass == 0x068001) {
          sum = &to_cpu[gi];  // NVLink to the local CPU (POWER9)
        } else {
          return fail(e, "tclass=" + ef::quoted_for_message(*doc_.attribute(e, "tclass")) +
                             " is no GPU (0x03xxxx), NVSwitch (0x068000) or CPU (0x068001)");
        }
        if (sum->count + *count > kMaxLanes)
          return fail(e, "more than " + std::to_string(kMaxLanes) + " NVLinks to one peer");
        sum->count += *count;
        sum->lane_gbps = lane;
      }
    }
    // A pair listed from both sides is one set of links: the larger count of the two listings.
    std::map<std::pair<uint32_t, uint32_t>, Lanes> pairs;
    for (const auto& [key, lanes] : peer) {
      Lanes& p = pairs[{std::min(key.first, key.second), std::max(key.first, key.second)}];
      if (lanes.count > p.count) p = lanes;
    }
    for (const auto& [key, lanes] : pairs)
      if (Status s = nvlink(gpus_[key.first].node, gpus_[key.second].node, lanes); !s) return s;
    if (!to_nvswitch.empty()) {
      auto nvs = t_.add_node(make(NodeKind::kNvSwitch, "h0.nvs0", 0, -1));
      if (!nvs) return nvs.status();
      for (const auto& [gi, lanes] : to_nvswitch)
        if (Status s = nvlink(gpus_[gi].node, *nvs, lanes); !s) return s;
    }
    for (const auto& [gi, lanes] : to_cpu)
      if (Status s = nvlink(gpus_[gi].node, local_cpu(gpus_[gi]), lanes); !s) return s;
    for (const auto& [gi, c] : c2c)
      if (Status s = t_.add_duplex(gpus_[gi].node, local_cpu(gpus_[gi]), LinkKind::kC2c, c.second,
                                   kC2cLatencyUs, static_cast<int32_t>(c.first));
          !s)
        return s;
    return Status::ok();
  }

  Status nvlink(NodeIndex a, NodeIndex b, const Lanes& lanes) {
    return t_.add_duplex(a, b, LinkKind::kNvlink,
                         static_cast<double>(lanes.count) * lanes.lane_gbps, kNvlinkLatencyUs,
                         static_cast<int32_t>(lanes.count));
  }

  NodeIndex local_cpu(const GpuRecord& g) const {
    Parent p = g.parent;
    while (p.is_switch) p = switches_[p.index].parent;
    return cpu_nodes_[p.index];
  }

  const XmlDocument& doc_;
  std::string_view where_;
  std::vector<CpuRecord> cpus_;
  std::vector<SwitchRecord> switches_;
  std::vector<GpuRecord> gpus_;
  std::vector<NicRecord> nics_;
  std::unordered_map<uint64_t, int> bus_lines_;        // bus id -> line
  std::unordered_map<std::string, int> net_names_;     // NIC port name -> line
  std::unordered_map<uint64_t, uint32_t> gpu_by_bus_;  // bus id -> GPU record
  std::vector<uint32_t> gpu_order_, nic_order_;        // records in index order
  std::vector<NodeIndex> cpu_nodes_, switch_nodes_;
  std::size_t nodes_ = 0;
  Topology t_;
};

}  // namespace

StatusOr<Topology> from_nccl_xml(std::string_view text, std::string_view where) {
  try {
    ef::XmlLimits limits;
    limits.max_bytes = kMaxFileBytes;
    limits.max_depth = kMaxDepth;
    limits.max_elements = kMaxElements;
    limits.max_memory_bytes = kMaxMemoryBytes;
    ef::XmlParseResult parsed = ef::parse_xml(text, limits);
    if (!parsed.document)
      return Status::error(std::string(where) + ":" + std::to_string(parsed.error.line) + ": " +
                           parsed.error.message + " (byte " + std::to_string(parsed.error.offset) +
                           ")");
    return Reader(*parsed.document, where).read();
  } catch (const std::exception& e) {  // allocation failure
    return Status::error(std::string(where) + ": cannot read the topology: " + e.what());
  }
}

StatusOr<Topology> load_nccl_xml(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return Status::error(path + ": not a regular file" + (ec ? " (" + ec.message() + ")" : ""));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path + ": cannot open for reading");
  try {
    // Chunk by chunk up to one byte past the limit: the size on disk may change meanwhile.
    std::string text;
    std::vector<char> chunk(64u << 10);
    while (in && text.size() <= kMaxFileBytes) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
    }
    if (text.size() > kMaxFileBytes)
      return Status::error(path + ": more than " + std::to_string(kMaxFileBytes >> 20) +
                           " MiB; NCCL topology files are a few KiB");
    if (in.bad()) return Status::error(path + ": read error");
    return from_nccl_xml(text, path);
  } catch (const std::exception& e) {
    return Status::error(path + ": cannot read: " + e.what());
  }
}

}  // namespace efccl::topo
