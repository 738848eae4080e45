// The machine as a graph (docs/topology.md): hosts, GPUs, NVSwitch fabrics, PCIe switches,
// CPUs (NUMA nodes) with their host memory, NICs and the rail switches that join NICs of one
// index across hosts; directed links with a capacity per direction and a latency. CUDA-free:
// the planner, the timing model, the CLI and the tests use it without a GPU.
//
//   topo::Topology t = *topo::preset("dgx-h100", /*nodes=*/2);
//   for (topo::NodeIndex g : t.gpus())                    // rank order: host by host
//     std::printf("%s rail %s\n", t.node(g).id.c_str(),
//                 t.rail_nic(g) ? t.node(*t.rail_nic(g)).id.c_str() : "-");
//   topo::Path p = *t.route(t.gpus()[0], t.gpus()[9]);      // GPU -> NIC -> rail -> NIC -> GPU
//
// Where graphs come from: presets (presets.h), NCCL's topology XML (nccl_xml.h), detection on
// the running machine (detect.h), and to_json/from_json (what ranks exchange).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::topo {

using NodeIndex = uint32_t;
using LinkIndex = uint32_t;

enum class NodeKind : uint8_t {
  kGpu,
  kNvSwitch,     ///< an NVSwitch fabric of a host (its switch chips collapsed into one node)
  kPcieSwitch,   ///< a PCIe switch (or bridge) between a root port and its devices
  kCpu,          ///< a CPU socket / NUMA node: the PCIe root complex
  kHostMemory,   ///< the DRAM of one NUMA node (where pinned host buffers live)
  kNic,          ///< a network port
  kRailSwitch,   ///< joins the NICs of one rail (one index) across hosts; host = -1
};
std::string_view to_string(NodeKind kind);

enum class LinkKind : uint8_t {
  kNvlink,  ///< NVLink lanes: count x the generation's rate per lane and direction
  kPcie,    ///< PCIe: generation x width
  kHost,    ///< a CPU to its memory: what the host-staged path crosses
  kSmp,     ///< between CPU sockets (UPI, xGMI)
  kNet,     ///< a NIC to its rail switch: the NIC's speed
  kC2c,     ///< chip-to-chip (Grace Hopper): GPU to CPU
};
std::string_view to_string(LinkKind kind);
/// "nvlink" -> kNvlink, ...; nullopt for anything else.
std::optional<LinkKind> link_kind_from_string(std::string_view text);
std::optional<NodeKind> node_kind_from_string(std::string_view text);

struct Node {
  NodeKind kind = NodeKind::kGpu;
  std::string id;     ///< unique: "h0.gpu3", "h1.nic0", "h0.nvs0", "rail2"
  int32_t host = 0;   ///< -1 for rail switches
  int32_t index = 0;  ///< index among the nodes of this kind on its host (gpu3: 3)
  std::string pci;    ///< PCI bus id "0000:1b:00.0" where known
  int32_t numa = -1;  ///< NUMA node (CPU and host memory: their own; devices: their CPU's)
  std::string name;   ///< NIC: "mlx5_0"; GPU: its model where known
  int32_t sm = 0;     ///< GPU: compute capability x 10 (90 for Hopper); 0 unknown
  int32_t device = -1;  ///< GPU: its CUDA device ordinal on its host; NIC: NCCL's net dev
  int32_t rail = -1;    ///< NIC: its rail (index on the host); rail switch: the rail
  double gbps = 0;      ///< NIC: its port speed in GB/s (NDR400: 50)
};

struct Link {
  NodeIndex from = 0;
  NodeIndex to = 0;
  LinkKind kind = LinkKind::kPcie;
  double gbps = 0;        ///< capacity in this direction, GB/s (1e9 bytes per second)
  double latency_us = 0;  ///< one-way latency
  int32_t lanes = 1;      ///< NVLink links or PCIe width
};

/// A walk through the graph: its links in order, its bottleneck and summed latency.
struct Path {
  std::vector<LinkIndex> links;
  double gbps = 0;        ///< min over links (0 for an empty path: a node to itself)
  double latency_us = 0;  ///< sum over links
  /// A relay GPU the walk passes through (gpu_walks), if any.
  std::optional<NodeIndex> relay;
  /// Whether the walk is staged through host memory (gpu_walks' host path).
  bool host_staged = false;
};

/// Limits that keep a graph from a file or a peer bounded.
inline constexpr std::size_t kMaxNodes = 1u << 16;
inline constexpr std::size_t kMaxLinks = 1u << 20;
inline constexpr int32_t kMaxHosts = 1 << 14;
inline constexpr std::size_t kMaxGpusPerHost = 1024;
inline constexpr std::size_t kMaxNicsPerHost = 1024;

class Topology {
 public:
  /// Adds a node; its id must be new and non-empty (else an error naming it).
  StatusOr<NodeIndex> add_node(Node node);
  /// Adds a directed link; nodes must exist, gbps finite > 0, latency finite >= 0.
  StatusOr<LinkIndex> add_link(Link link);
  /// Adds `a -> b` and `b -> a` with the same kind, capacity, latency and lanes.
  Status add_duplex(NodeIndex a, NodeIndex b, LinkKind kind, double gbps, double latency_us,
                    int32_t lanes = 1);

  const Node& node(NodeIndex i) const { return nodes_[i]; }
  /// The node to fill in after adding it; its id must stay as added (find() indexes ids).
  Node& mutable_node(NodeIndex i) { return nodes_[i]; }
  const Link& link(LinkIndex i) const { return links_[i]; }
  std::span<const Node> nodes() const { return nodes_; }
  std::span<const Link> links() const { return links_; }
  /// Links leaving `n`, in the order they were added.
  std::span<const LinkIndex> out_links(NodeIndex n) const { return out_[n]; }
  std::optional<NodeIndex> find(std::string_view id) const;

  /// Number of hosts: 1 + the largest host index of any node (0 for an empty graph).
  int32_t hosts() const;
  /// GPUs in rank order: host by host, then by index. Ranks map to GPUs in this order.
  std::vector<NodeIndex> gpus() const;
  /// GPUs of one host, by index.
  std::vector<NodeIndex> gpus_of_host(int32_t host) const;
  /// NICs, host by host, then by index.
  std::vector<NodeIndex> nics() const;
  /// Every node of `kind`, in id order of insertion.
  std::vector<NodeIndex> nodes_of(NodeKind kind) const;

  /// The GPU's rail NIC: the NIC of its host closest over PCIe (fewest PCIe hops, then the
  /// lowest index; under the same PCIe switch when the machine has one per GPU). nullopt when
  /// the host has no NIC.
  std::optional<NodeIndex> rail_nic(NodeIndex gpu) const;
  /// The CPU (NUMA node) a device hangs under over PCIe; nullopt when none is reachable.
  std::optional<NodeIndex> local_cpu(NodeIndex device) const;
  /// The host memory of `cpu`.
  std::optional<NodeIndex> memory_of(NodeIndex cpu) const;
  /// Whether two GPUs reach each other over NVLink only (directly or through an NVSwitch).
  bool nvlink_peers(NodeIndex a, NodeIndex b) const;
  /// The NVLink capacity leaving a GPU: the sum over its NVLink links, GB/s.
  double nvlink_gbps(NodeIndex gpu) const;

  /// The default route between two nodes: the widest path (largest bottleneck), then the one
  /// of least latency, then fewest links; ties broken by link index, so deterministic. It never
  /// passes through a GPU or host memory other than its ends. nullopt when none exists.
  std::optional<Path> route(NodeIndex from, NodeIndex to) const;
  /// The route over NVLink only (links of kind nvlink through NVSwitches), if any.
  std::optional<Path> nvlink_route(NodeIndex from, NodeIndex to) const;
  /// The host-staged walk: from GPU `a` over PCIe to its CPU's memory, then from that memory
  /// to GPU `b` (through the inter-CPU link when b hangs under another CPU).
  std::optional<Path> host_route(NodeIndex a, NodeIndex b) const;
  /// Every walk of at most one relay GPU between two GPUs of one host: the direct route,
  /// then through each other GPU r of the host (route(a, r) + route(r, b), r in index order),
  /// then the host-staged walk. Walks through a relay are listed only when both legs exist.
  std::vector<Path> gpu_walks(NodeIndex a, NodeIndex b) const;
  /// The path made of `links` (bottleneck and latency filled in).
  Path path_of(std::vector<LinkIndex> links) const;

  /// Structural checks: endpoints exist, capacities positive, every GPU has a link, rail
  /// switches have host -1 and every other node a host >= 0, and sizes within the limits
  /// (nodes, links, GPUs and NICs per host).
  Status check() const;
  /// The graph's canonical JSON (to_json) hashed: equal graphs give equal hashes on every
  /// machine.
  uint64_t hash() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<std::vector<LinkIndex>> out_;
  std::unordered_map<std::string, NodeIndex> by_id_;  ///< find() in constant time
};

/// The graph in the JSON shape `efccl topo --json` prints and other tools read:
///   {"hosts": H,
///    "gpus": [{"id", "host", "rail": nic id or null, "pci", "numa", "sm", "device", "name"}],
///    "nics": [{"id", "host", "name", "gbps", "rail", "pci", "numa"}],
///    "nodes": [{"id", "kind", "host", ...}]   (every other node)
///    "links": [{"from", "to", "kind", "gbps", "latency_us", "lanes"}]}
/// Numbers print with up to 6 significant digits; output is deterministic.
std::string to_json(const Topology& t, int indent = 2);
/// Parses what to_json wrote (from a file or a peer): bounded (kMaxNodes, kMaxLinks, 64 MiB
/// of text) and checked; errors name `where` and the offending entry.
StatusOr<Topology> from_json(std::string_view text, std::string_view where);

/// Joins hosts: host h of the result is `hosts[h]` (its nodes renamed "h<h>.<name>" from
/// "h0.<name>"), and one rail switch per NIC index joins the NICs of that index over links
/// of kind net at each NIC's speed. Each input must be a one-host graph (host 0).
StatusOr<Topology> merge_hosts(std::span<const Topology> hosts);
/// `nodes` copies of the one-host graph `host` joined by merge_hosts (`--nodes N`). `what`
/// names the graph in errors: one that already spans hosts, or copies beyond the size limits
/// (checked before anything is copied).
StatusOr<Topology> repeat_host(const Topology& host, int nodes, std::string_view what);

}  // namespace efccl::topo
