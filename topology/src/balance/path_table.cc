// Every pair's candidate paths (efccl/balance/planner.h, PathTable).
#include <algorithm>

#include "efccl/balance/planner.h"

namespace efccl::balance {
namespace {

constexpr NodeIndex kAbsent = static_cast<NodeIndex>(topo::kMaxNodes);
/// Relay candidates per pair on hosts with more GPUs than this + 2 (docs/balancer.md).
constexpr std::size_t kMaxRelays = 16;

}  // namespace

StatusOr<std::shared_ptr<const PathTable>> PathTable::build(const topo::Topology& topology,
                                                            std::vector<NodeIndex> rank_gpu) {
  if (Status s = topology.check(); !s) return s;
  for (std::size_t r = 0; r < rank_gpu.size(); ++r)
    if (rank_gpu[r] >= topology.nodes().size() ||
        topology.node(rank_gpu[r]).kind != topo::NodeKind::kGpu)
      return Status::error("rank " + std::to_string(r) + " is not placed on a GPU of the topology");
  std::shared_ptr<PathTable> table(new PathTable());
  table->topology_ = topology;
  table->rank_gpu_ = std::move(rank_gpu);
  const topo::Topology& t = table->topology_;
  const int32_t hosts = t.hosts();
  table->hosts_.resize(static_cast<std::size_t>(std::max(hosts, 0)));
  table->local_of_.assign(t.nodes().size(), kAbsent);
  for (NodeIndex n = 0; n < t.nodes().size(); ++n) {
    const int32_t h = t.node(n).host;
    if (h < 0) continue;
    HostGraph& g = table->hosts_[static_cast<std::size_t>(h)];
    auto added = g.graph.add_node(t.node(n));
    if (!added) return added.status();
    table->local_of_[n] = *added;
    g.to_whole_node.push_back(n);
  }
  for (LinkIndex l = 0; l < t.links().size(); ++l) {
    const topo::Link& link = t.link(l);
    const int32_t h = t.node(link.from).host;
    if (h < 0 || t.node(link.to).host != h) continue;
    topo::Link local = link;
    local.from = table->local_of_[link.from];
    local.to = table->local_of_[link.to];
    HostGraph& g = table->hosts_[static_cast<std::size_t>(h)];
    if (auto added = g.graph.add_link(local); !added) return added.status();
    g.to_whole.push_back(l);
  }
  return std::shared_ptr<const PathTable>(std::move(table));
}

std::optional<topo::Path> PathTable::host_route(NodeIndex a, NodeIndex b) const {
  const int32_t h = topology_.node(a).host;
  if (h < 0 || topology_.node(b).host != h) return std::nullopt;
  const HostGraph& g = hosts_[static_cast<std::size_t>(h)];
  auto p = g.graph.route(local_of_[a], local_of_[b]);
  if (!p) return std::nullopt;
  for (LinkIndex& l : p->links) l = g.to_whole[l];
  return p;
}

StatusOr<std::vector<Candidate>> PathTable::compute(NodeIndex a, NodeIndex b,
                                                    bool only_default) const {
  const topo::Topology& t = topology_;
  std::vector<Candidate> out;
  const auto add = [&](std::vector<LinkIndex> links, std::string via, CandidateKind kind,
                       std::vector<NodeIndex> relays = {}, int32_t rail = -1) {
    for (const Candidate& c : out)
      if (c.links == links) return;  // the same walk reached twice
    Candidate c;
    c.gbps = t.path_of(links).gbps;
    c.links = std::move(links);
    c.via = std::move(via);
    c.kind = kind;
    c.relays = std::move(relays);
    c.rail = rail;
    out.push_back(std::move(c));
  };
  if (a == b) {
    add({}, "local", CandidateKind::kLocal);
    return out;
  }
  const int32_t ha = t.node(a).host;
  const int32_t hb = t.node(b).host;
  if (ha == hb) {
    const HostGraph& g = hosts_[static_cast<std::size_t>(ha)];
    std::vector<topo::Path> walks;
    const NodeIndex la = local_of_[a], lb = local_of_[b];
    if (only_default) {
      if (auto p = g.graph.route(la, lb)) walks.push_back(std::move(*p));
    } else if (g.graph.gpus_of_host(0).size() <= kMaxRelays + 2) {
      walks = g.graph.gpu_walks(la, lb);
    } else {
      // A large host: relays only through GPUs joined to both ends by a direct NVLink (where
      // a relay can add bandwidth), the first kMaxRelays in index order.
      if (auto p = g.graph.route(la, lb)) walks.push_back(std::move(*p));
      const auto direct_nvlink = [&](NodeIndex x, NodeIndex y) -> std::optional<LinkIndex> {
        for (LinkIndex l : g.graph.out_links(x))
          if (g.graph.link(l).to == y && g.graph.link(l).kind == topo::LinkKind::kNvlink) return l;
        return std::nullopt;
      };
      std::size_t relays = 0;
      for (NodeIndex r : g.graph.gpus_of_host(0)) {
        if (r == la || r == lb || relays >= kMaxRelays) continue;
        auto first = direct_nvlink(la, r);
        auto second = direct_nvlink(r, lb);
        if (!first || !second) continue;
        topo::Path p = g.graph.path_of({*first, *second});
        p.relay = r;
        walks.push_back(std::move(p));
        ++relays;
      }
      if (auto h = g.graph.host_route(la, lb)) walks.push_back(std::move(*h));
    }
    for (topo::Path& p : walks) {
      for (LinkIndex& l : p.links) l = g.to_whole[l];
      if (p.host_staged) {
        add(std::move(p.links), "host memory", CandidateKind::kHost);
      } else if (p.relay) {
        add(std::move(p.links), "relay " + g.graph.node(*p.relay).id, CandidateKind::kRelay,
            {g.to_whole_node[*p.relay]});
      } else {
        add(std::move(p.links), "direct", CandidateKind::kDirect);
      }
    }
  } else {
    const HostGraph& ga = hosts_[static_cast<std::size_t>(ha)];
    const HostGraph& gb = hosts_[static_cast<std::size_t>(hb)];
    // NIC of rail r on a host, and the rail switch's links.
    const auto nic_of_rail = [&](const HostGraph& g, int32_t rail) -> std::optional<NodeIndex> {
      for (NodeIndex n : g.graph.nics())
        if (g.graph.node(n).rail == rail || (g.graph.node(n).rail < 0 && g.graph.node(n).index == rail))
          return g.to_whole_node[n];
      return std::nullopt;
    };
    const auto net_hop = [&](NodeIndex from_nic, NodeIndex to_nic) -> std::vector<LinkIndex> {
      for (LinkIndex up : t.out_links(from_nic)) {
        if (t.link(up).kind != topo::LinkKind::kNet) continue;
        for (LinkIndex down : t.out_links(t.link(up).to))
          if (t.link(down).to == to_nic) return {up, down};
      }
      return {};
    };
    const auto rail_of = [&](NodeIndex nic) {
      return t.node(nic).rail >= 0 ? t.node(nic).rail : t.node(nic).index;
    };
    const auto via_rail = [&](NodeIndex src_gpu, NodeIndex src_nic, NodeIndex dst_nic,
                              NodeIndex dst_gpu) -> std::optional<std::vector<LinkIndex>> {
      std::vector<LinkIndex> links;
      for (auto [x, y] : {std::pair{a, src_gpu}, std::pair{src_gpu, src_nic}}) {
        if (x == y) continue;
        auto p = host_route(x, y);
        if (!p) return std::nullopt;
        links.insert(links.end(), p->links.begin(), p->links.end());
      }
      auto hop = net_hop(src_nic, dst_nic);
      if (hop.empty()) return std::nullopt;
      links.insert(links.end(), hop.begin(), hop.end());
      for (auto [x, y] : {std::pair{dst_nic, dst_gpu}, std::pair{dst_gpu, b}}) {
        if (x == y) continue;
        auto p = host_route(x, y);
        if (!p) return std::nullopt;
        links.insert(links.end(), p->links.begin(), p->links.end());
      }
      return links;
    };
    // Default: src's own rail NIC, the NIC of that rail on dst's host, straight to dst.
    if (auto own = ga.graph.rail_nic(local_of_[a])) {
      const NodeIndex src_nic = ga.to_whole_node[*own];
      if (auto dst_nic = nic_of_rail(gb, rail_of(src_nic)))
        if (auto links = via_rail(a, src_nic, *dst_nic, b))
          add(std::move(*links), "rail " + std::to_string(rail_of(src_nic)) + " (own NIC)",
              CandidateKind::kDirect, {}, rail_of(src_nic));
    }
    // Rail-matched: through the GPUs that own rail r on each side (PXN-style).
    if (only_default && !out.empty()) return out;
    const auto owner = [&](const HostGraph& g, NodeIndex nic) -> std::optional<NodeIndex> {
      for (NodeIndex gpu : g.graph.gpus()) {
        auto r = g.graph.rail_nic(gpu);
        if (r && g.to_whole_node[*r] == nic) return g.to_whole_node[gpu];
      }
      return std::nullopt;
    };
    for (NodeIndex local_nic : ga.graph.nics()) {
      const NodeIndex src_nic = ga.to_whole_node[local_nic];
      const int32_t rail = rail_of(src_nic);
      auto dst_nic = nic_of_rail(gb, rail);
      auto src_owner = owner(ga, src_nic);
      if (!dst_nic || !src_owner) continue;
      auto dst_owner = owner(gb, *dst_nic);
      if (!dst_owner) continue;
      if (auto links = via_rail(*src_owner, src_nic, *dst_nic, *dst_owner)) {
        std::vector<NodeIndex> relays;
        if (*src_owner != a) relays.push_back(*src_owner);
        if (*dst_owner != b) relays.push_back(*dst_owner);
        add(std::move(*links), "rail " + std::to_string(rail), CandidateKind::kRail,
            std::move(relays), rail);
      }
    }
    if (out.empty())
      if (auto p = t.route(a, b)) add(p->links, "route", CandidateKind::kDirect);
  }
  if (out.empty())
    return Status::error("no path from " + t.node(a).id + " to " + t.node(b).id);
  return out;
}

StatusOr<std::shared_ptr<const std::vector<Candidate>>> PathTable::candidates(
    int32_t src, int32_t dst, bool only_default) const {
  if (src < 0 || dst < 0 || src >= nranks() || dst >= nranks())
    return Status::error("pair (" + std::to_string(src) + ", " + std::to_string(dst) +
                         ") is outside the table's " + std::to_string(nranks()) + " ranks");
  const auto key = std::make_pair(rank_gpu(src), rank_gpu(dst));
  auto& cache = only_default ? default_cache_ : cache_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto computed = compute(key.first, key.second, only_default);
  if (!computed)
    return Status::error("ranks " + std::to_string(src) + " -> " + std::to_string(dst) + ": " +
                         computed.status().message());
  auto shared = std::make_shared<const std::vector<Candidate>>(std::move(*computed));
  std::lock_guard<std::mutex> lock(mu_);
  return cache.emplace(key, std::move(shared)).first->second;
}

}  // namespace efccl::balance
