// The graph, its queries and routes (efccl/topology/topology.h).
#include "efccl/topology/topology.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "efccl/common/hash.h"

namespace efccl::topo {

std::string_view to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::kGpu:
      return "gpu";
    case NodeKind::kNvSwitch:
      return "nvswitch";
    case NodeKind::kPcieSwitch:
      return "pcie_switch";
    case NodeKind::kCpu:
      return "cpu";
    case NodeKind::kHostMemory:
      return "host_memory";
    case NodeKind::kNic:
      return "nic";
    case NodeKind::kRailSwitch:
      return "rail_switch";
  }
  return "unknown";
}

std::string_view to_string(LinkKind kind) {
  switch (kind) {
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kHost:
      return "host";
    case LinkKind::kSmp:
      return "smp";
    case LinkKind::kNet:
      return "net";
    case LinkKind::kC2c:
      return "c2c";
  }
  return "unknown";
}

std::optional<LinkKind> link_kind_from_string(std::string_view text) {
  for (LinkKind k : {LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kHost, LinkKind::kSmp,
                     LinkKind::kNet, LinkKind::kC2c})
    if (to_string(k) == text) return k;
  return std::nullopt;
}

std::optional<NodeKind> node_kind_from_string(std::string_view text) {
  for (NodeKind k : {NodeKind::kGpu, NodeKind::kNvSwitch, NodeKind::kPcieSwitch, NodeKind::kCpu,
                     NodeKind::kHostMemory, NodeKind::kNic, NodeKind::kRailSwitch})
    if (to_string(k) == text) return k;
  return std::nullopt;
}

StatusOr<NodeIndex> Topology::add_node(Node node) {
  if (node.id.empty()) return Status::error("a " + std::string(to_string(node.kind)) +
                                            " node without an id");
  if (find(node.id)) return Status::error("node id '" + node.id + "' is used twice");
  if (nodes_.size() >= kMaxNodes)
    return Status::error("more than " + std::to_string(kMaxNodes) + " nodes");
  const auto index = static_cast<NodeIndex>(nodes_.size());
  by_id_.emplace(node.id, index);
  nodes_.push_back(std::move(node));
  out_.emplace_back();
  return index;
}

StatusOr<LinkIndex> Topology::add_link(Link link) {
  if (link.from >= nodes_.size() || link.to >= nodes_.size())
    return Status::error("a link between nodes that do not exist");
  if (link.from == link.to) return Status::error("a link from '" + nodes_[link.from].id +
                                                 "' to itself");
  const std::string what = "link " + nodes_[link.from].id + " -> " + nodes_[link.to].id;
  if (!std::isfinite(link.gbps) || link.gbps <= 0)
    return Status::error(what + ": capacity must be a finite number > 0 GB/s");
  if (!std::isfinite(link.latency_us) || link.latency_us < 0)
    return Status::error(what + ": latency must be a finite number >= 0 us");
  if (link.lanes < 1) return Status::error(what + ": lanes must be at least 1");
  if (links_.size() >= kMaxLinks)
    return Status::error("more than " + std::to_string(kMaxLinks) + " links");
  links_.push_back(link);
  const auto index = static_cast<LinkIndex>(links_.size() - 1);
  out_[link.from].push_back(index);
  return index;
}

Status Topology::add_duplex(NodeIndex a, NodeIndex b, LinkKind kind, double gbps,
                            double latency_us, int32_t lanes) {
  if (auto l = add_link({a, b, kind, gbps, latency_us, lanes}); !l) return l.status();
  if (auto l = add_link({b, a, kind, gbps, latency_us, lanes}); !l) return l.status();
  return Status::ok();
}

std::optional<NodeIndex> Topology::find(std::string_view id) const {
  // A linear scan made adding n nodes (from a file or a peer) take n^2 / 2 comparisons.
  auto it = by_id_.find(std::string(id));
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

int32_t Topology::hosts() const {
  int32_t h = 0;
  for (const Node& n : nodes_) h = std::max(h, n.host + 1);
  return h;
}

std::vector<NodeIndex> Topology::nodes_of(NodeKind kind) const {
  std::vector<NodeIndex> out;
  for (NodeIndex i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == kind) out.push_back(i);
  return out;
}

namespace {
std::vector<NodeIndex> sorted_by_host_index(const Topology& t, std::vector<NodeIndex> v) {
  std::stable_sort(v.begin(), v.end(), [&](NodeIndex a, NodeIndex b) {
    return std::tie(t.node(a).host, t.node(a).index) < std::tie(t.node(b).host, t.node(b).index);
  });
  return v;
}
}  // namespace

std::vector<NodeIndex> Topology::gpus() const {
  return sorted_by_host_index(*this, nodes_of(NodeKind::kGpu));
}

std::vector<NodeIndex> Topology::gpus_of_host(int32_t host) const {
  std::vector<NodeIndex> out;
  for (NodeIndex g : gpus())
    if (nodes_[g].host == host) out.push_back(g);
  return out;
}

std::vector<NodeIndex> Topology::nics() const {
  return sorted_by_host_index(*this, nodes_of(NodeKind::kNic));
}

namespace {
/// Hops from `start` over PCIe, C2C and inter-CPU links, through switches and CPUs only: the
/// nodes reached (a walk stays inside its host), with their hop counts.
std::unordered_map<NodeIndex, int> pcie_hops(const Topology& t, NodeIndex start) {
  std::unordered_map<NodeIndex, int> hops{{start, 0}};
  std::deque<NodeIndex> queue{start};
  while (!queue.empty()) {
    const NodeIndex n = queue.front();
    queue.pop_front();
    if (n != start && t.node(n).kind != NodeKind::kPcieSwitch && t.node(n).kind != NodeKind::kCpu)
      continue;  // devices end a walk
    for (LinkIndex l : t.out_links(n)) {
      const Link& link = t.link(l);
      if (link.kind != LinkKind::kPcie && link.kind != LinkKind::kC2c &&
          link.kind != LinkKind::kSmp)
        continue;
      if (hops.count(link.to) != 0) continue;
      hops.emplace(link.to, hops.at(n) + 1);
      queue.push_back(link.to);
    }
  }
  return hops;
}

/// The NIC of `host` with the lowest (host, index): rail_nic's answer when none is reachable.
std::optional<NodeIndex> first_nic_of_host(const Topology& t, int32_t host) {
  std::optional<NodeIndex> best;
  for (NodeIndex n = 0; n < t.nodes().size(); ++n)
    if (t.node(n).kind == NodeKind::kNic && t.node(n).host == host &&
        (!best || t.node(n).index < t.node(*best).index))
      best = n;
  return best;
}
}  // namespace

std::optional<NodeIndex> Topology::rail_nic(NodeIndex gpu) const {
  // The nearest NIC over PCIe (fewest hops, then the lowest index); else the host's first.
  std::optional<NodeIndex> best;
  int best_hops = 0;
  for (const auto& [n, h] : pcie_hops(*this, gpu)) {
    if (nodes_[n].kind != NodeKind::kNic || nodes_[n].host != nodes_[gpu].host) continue;
    if (!best || h < best_hops || (h == best_hops && nodes_[n].index < nodes_[*best].index) ||
        (h == best_hops && nodes_[n].index == nodes_[*best].index && n < *best)) {
      best = n;
      best_hops = h;
    }
  }
  if (best) return best;
  return first_nic_of_host(*this, nodes_[gpu].host);
}

std::optional<NodeIndex> Topology::local_cpu(NodeIndex device) const {
  if (nodes_[device].kind == NodeKind::kCpu) return device;
  std::optional<NodeIndex> best;
  int best_hops = 0;
  for (const auto& [n, h] : pcie_hops(*this, device))
    if (nodes_[n].kind == NodeKind::kCpu && (!best || h < best_hops || (h == best_hops && n < *best))) {
      best = n;
      best_hops = h;
    }
  return best;
}

std::optional<NodeIndex> Topology::memory_of(NodeIndex cpu) const {
  for (LinkIndex l : out_[cpu])
    if (links_[l].kind == LinkKind::kHost && nodes_[links_[l].to].kind == NodeKind::kHostMemory)
      return links_[l].to;
  return std::nullopt;
}

bool Topology::nvlink_peers(NodeIndex a, NodeIndex b) const {
  return a != b && nvlink_route(a, b).has_value();
}

double Topology::nvlink_gbps(NodeIndex gpu) const {
  double sum = 0;
  for (LinkIndex l : out_[gpu])
    if (links_[l].kind == LinkKind::kNvlink) sum += links_[l].gbps;
  return sum;
}

Path Topology::path_of(std::vector<LinkIndex> links) const {
  Path p;
  p.links = std::move(links);
  p.gbps = p.links.empty() ? 0 : std::numeric_limits<double>::infinity();
  for (LinkIndex l : p.links) {
    p.gbps = std::min(p.gbps, links_[l].gbps);
    p.latency_us += links_[l].latency_us;
  }
  return p;
}

namespace {

/// Widest path, then least latency, then fewest links, over links `usable` accepts and through
/// intermediate nodes `passable` accepts. Deterministic: ties go to the lower link index.
template <typename Usable, typename Passable>
std::optional<Path> best_path(const Topology& t, NodeIndex from, NodeIndex to, Usable usable,
                              Passable passable) {
  const std::size_t n = t.nodes().size();
  if (from >= n || to >= n) return std::nullopt;
  if (from == to) return t.path_of({});
  // 1. The largest bottleneck (a widest-path Dijkstra).
  std::vector<double> width(n, 0);
  width[from] = std::numeric_limits<double>::infinity();
  std::vector<bool> done(n, false);
  using Entry = std::pair<double, NodeIndex>;
  auto wider = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(wider)> wq(wider);
  wq.push({width[from], from});
  while (!wq.empty()) {
    const auto [w, u] = wq.top();
    wq.pop();
    if (done[u]) continue;
    done[u] = true;
    if (u != from && (u == to || !passable(u))) continue;
    for (LinkIndex l : t.out_links(u)) {
      const Link& link = t.link(l);
      if (!usable(link)) continue;
      const double nw = std::min(w, link.gbps);
      if (nw > width[link.to]) {
        width[link.to] = nw;
        wq.push({nw, link.to});
      }
    }
  }
  if (width[to] <= 0) return std::nullopt;
  const double bottleneck = width[to];
  // 2. Least latency, then fewest links, over links at least that wide.
  using Cost = std::tuple<double, uint32_t, NodeIndex>;
  std::vector<double> latency(n, std::numeric_limits<double>::infinity());
  std::vector<uint32_t> hops(n, std::numeric_limits<uint32_t>::max());
  std::vector<LinkIndex> via(n, std::numeric_limits<LinkIndex>::max());
  std::fill(done.begin(), done.end(), false);
  std::priority_queue<Cost, std::vector<Cost>, std::greater<Cost>> q;
  latency[from] = 0;
  hops[from] = 0;
  q.push({0.0, 0u, from});
  while (!q.empty()) {
    const auto [lat, h, u] = q.top();
    q.pop();
    if (done[u]) continue;
    done[u] = true;
    if (u != from && (u == to || !passable(u))) continue;
    for (LinkIndex l : t.out_links(u)) {
      const Link& link = t.link(l);
      if (!usable(link) || link.gbps < bottleneck) continue;
      const double nl = lat + link.latency_us;
      const uint32_t nh = h + 1;
      if (std::tie(nl, nh) < std::tie(latency[link.to], hops[link.to])) {
        latency[link.to] = nl;
        hops[link.to] = nh;
        via[link.to] = l;
        q.push({nl, nh, link.to});
      }
    }
  }
  if (via[to] == std::numeric_limits<LinkIndex>::max()) return std::nullopt;
  std::vector<LinkIndex> links;
  for (NodeIndex v = to; v != from; v = t.link(via[v]).from) links.push_back(via[v]);
  std::reverse(links.begin(), links.end());
  return t.path_of(std::move(links));
}

}  // namespace

std::optional<Path> Topology::route(NodeIndex from, NodeIndex to) const {
  return best_path(
      *this, from, to, [](const Link&) { return true; },
      [&](NodeIndex v) {
        const NodeKind k = nodes_[v].kind;
        return k != NodeKind::kGpu && k != NodeKind::kHostMemory;
      });
}

std::optional<Path> Topology::nvlink_route(NodeIndex from, NodeIndex to) const {
  return best_path(
      *this, from, to, [](const Link& l) { return l.kind == LinkKind::kNvlink; },
      [&](NodeIndex v) { return nodes_[v].kind == NodeKind::kNvSwitch; });
}

std::optional<Path> Topology::host_route(NodeIndex a, NodeIndex b) const {
  const auto cpu = local_cpu(a);
  if (!cpu) return std::nullopt;
  const auto memory = memory_of(*cpu);
  if (!memory) return std::nullopt;
  // Only PCIe, C2C, inter-CPU and memory links: the host path never borrows NVLink.
  const auto usable = [](const Link& l) {
    return l.kind == LinkKind::kPcie || l.kind == LinkKind::kC2c || l.kind == LinkKind::kSmp ||
           l.kind == LinkKind::kHost;
  };
  const auto passable = [&](NodeIndex v) {
    const NodeKind k = nodes_[v].kind;
    return k == NodeKind::kPcieSwitch || k == NodeKind::kCpu;
  };
  auto up = best_path(*this, a, *memory, usable, passable);
  auto down = best_path(*this, *memory, b, usable, passable);
  if (!up || !down) return std::nullopt;
  std::vector<LinkIndex> links = up->links;
  links.insert(links.end(), down->links.begin(), down->links.end());
  Path p = path_of(std::move(links));
  p.host_staged = true;
  return p;
}

std::vector<Path> Topology::gpu_walks(NodeIndex a, NodeIndex b) const {
  std::vector<Path> walks;
  if (a == b || nodes_[a].kind != NodeKind::kGpu || nodes_[b].kind != NodeKind::kGpu ||
      nodes_[a].host != nodes_[b].host)
    return walks;
  if (auto direct = route(a, b)) walks.push_back(std::move(*direct));
  for (NodeIndex r : gpus_of_host(nodes_[a].host)) {
    if (r == a || r == b) continue;
    auto first = route(a, r);
    auto second = route(r, b);
    if (!first || !second) continue;
    std::vector<LinkIndex> links = first->links;
    links.insert(links.end(), second->links.begin(), second->links.end());
    Path p = path_of(std::move(links));
    p.relay = r;
    walks.push_back(std::move(p));
  }
  if (auto host = host_route(a, b)) walks.push_back(std::move(*host));
  return walks;
}

Status Topology::check() const {
  if (nodes_.size() > kMaxNodes) return Status::error("more than " + std::to_string(kMaxNodes) +
                                                      " nodes");
  if (links_.size() > kMaxLinks) return Status::error("more than " + std::to_string(kMaxLinks) +
                                                      " links");
  for (const Node& n : nodes_) {
    if (n.kind == NodeKind::kRailSwitch ? n.host != -1 : (n.host < 0 || n.host >= kMaxHosts))
      return Status::error("node '" + n.id + "' has host " + std::to_string(n.host) +
                           (n.kind == NodeKind::kRailSwitch ? " (a rail switch has host -1)"
                                                            : " (hosts are 0 ... " +
                                                                  std::to_string(kMaxHosts - 1) +
                                                                  ")"));
    if (n.kind == NodeKind::kNic && !(std::isfinite(n.gbps) && n.gbps > 0))
      return Status::error("NIC '" + n.id + "' has no speed");
  }
  for (NodeIndex i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == NodeKind::kGpu && out_[i].empty())
      return Status::error("GPU '" + nodes_[i].id + "' has no link");
  // Per host, so that per-GPU walks (rail NICs, routes) stay cheap on any accepted graph.
  std::unordered_map<int32_t, std::pair<std::size_t, std::size_t>> per_host;  // GPUs, NICs
  for (const Node& n : nodes_) {
    auto& [gpus, nics] = per_host[n.host];
    if (n.kind == NodeKind::kGpu && ++gpus > kMaxGpusPerHost)
      return Status::error("host " + std::to_string(n.host) + " has more than " +
                           std::to_string(kMaxGpusPerHost) + " GPUs");
    if (n.kind == NodeKind::kNic && ++nics > kMaxNicsPerHost)
      return Status::error("host " + std::to_string(n.host) + " has more than " +
                           std::to_string(kMaxNicsPerHost) + " NICs");
  }
  for (const Link& l : links_)
    if (l.from >= nodes_.size() || l.to >= nodes_.size() || !(l.gbps > 0))
      return Status::error("a link with bad endpoints or capacity");
  return Status::ok();
}

uint64_t Topology::hash() const { return hash64(to_json(*this, -1)); }

}  // namespace efccl::topo
