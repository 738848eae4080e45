// Every pair's candidate paths (efccl/balance/planner.h, PathTable). Candidates are computed
// per GPU pair on first use and kept in dense per-source rows (path_table_state.h): a lookup
// is two array reads, no lock; the default paths of a whole row are computed at once, from
// per-host routes that many pairs share.
#include <algorithm>

#include "efccl/balance/planner.h"
#include "path_table_state.h"

namespace efccl::balance {
namespace {

constexpr NodeIndex kAbsent = static_cast<NodeIndex>(topo::kMaxNodes);
/// Relay candidates per pair on hosts with more GPUs than this + 2 (docs/balancer.md).
constexpr std::size_t kMaxRelays = 16;

uint64_t key_of(NodeIndex a, NodeIndex b) { return (uint64_t{a} << 32) | b; }
using detail::Walk;

}  // namespace

PathTable::PathTable() = default;
PathTable::~PathTable() = default;

StatusOr<std::shared_ptr<const PathTable>> PathTable::build(const topo::Topology& topology,
                                                            std::vector<NodeIndex> rank_gpu,
                                                            PathTableOptions options) {
  if (Status s = topology.check(); !s) return s;
  for (std::size_t r = 0; r < rank_gpu.size(); ++r)
    if (rank_gpu[r] >= topology.nodes().size() ||
        topology.node(rank_gpu[r]).kind != topo::NodeKind::kGpu)
      return Status::error("rank " + std::to_string(r) + " is not placed on a GPU of the topology");
  std::shared_ptr<PathTable> table(new PathTable());
  table->topology_ = topology;
  table->rank_gpu_ = std::move(rank_gpu);
  table->state_ = std::make_unique<State>();
  State& st = *table->state_;
  const topo::Topology& t = table->topology_;
  st.topology = &t;
  st.host_memory = options.host_memory;
  const int32_t hosts = t.hosts();
  st.hosts.resize(static_cast<std::size_t>(std::max(hosts, 0)));
  st.local_of.assign(t.nodes().size(), kAbsent);
  for (NodeIndex n = 0; n < t.nodes().size(); ++n) {
    const int32_t h = t.node(n).host;
    if (h < 0) continue;
    State::HostGraph& g = st.hosts[static_cast<std::size_t>(h)];
    auto added = g.graph.add_node(t.node(n));
    if (!added) return added.status();
    st.local_of[n] = *added;
    g.to_whole_node.push_back(n);
  }
  for (LinkIndex l = 0; l < t.links().size(); ++l) {
    const topo::Link& link = t.link(l);
    const int32_t h = t.node(link.from).host;
    if (h < 0 || t.node(link.to).host != h) continue;
    topo::Link local = link;
    local.from = st.local_of[link.from];
    local.to = st.local_of[link.to];
    State::HostGraph& g = st.hosts[static_cast<std::size_t>(h)];
    if (auto added = g.graph.add_link(local); !added) return added.status();
    g.to_whole.push_back(l);
  }
  for (State::HostGraph& g : st.hosts) {
    g.gpus = g.graph.gpus();
    g.nics = g.graph.nics();
    g.rail_nic.assign(g.graph.nodes().size(), kAbsent);
    g.nic_owner.assign(g.graph.nodes().size(), kAbsent);
    for (NodeIndex gpu : g.gpus)
      if (auto nic = g.graph.rail_nic(gpu)) {
        g.rail_nic[gpu] = *nic;
        if (g.nic_owner[*nic] == kAbsent) g.nic_owner[*nic] = g.to_whole_node[gpu];
      }
  }
  // Net hops: a rail switch's first link to each node.
  for (LinkIndex l = 0; l < t.links().size(); ++l) {
    if (t.link(l).kind != topo::LinkKind::kNet) continue;
    const NodeIndex sw = t.link(l).to;
    for (LinkIndex down : t.out_links(sw)) st.switch_link.emplace(key_of(sw, t.link(down).to), down);
  }
  // Slots: the distinct GPUs of the ranks.
  std::unordered_map<NodeIndex, int32_t> slot_of;
  for (NodeIndex gpu : table->rank_gpu_) {
    auto [it, fresh] = slot_of.emplace(gpu, static_cast<int32_t>(st.slot_gpu.size()));
    if (fresh) {
      st.slot_gpu.push_back(gpu);
      st.slot_host.push_back(t.node(gpu).host);
    }
    st.rank_slot.push_back(it->second);
  }
  st.us_per_byte.resize(t.links().size());
  for (LinkIndex l = 0; l < t.links().size(); ++l) st.us_per_byte[l] = 1.0 / (t.link(l).gbps * 1e3);
  // Cuts: links out of and into each slot's GPU, and each host.
  const std::size_t nslots = st.slot_gpu.size();
  std::vector<std::vector<LinkIndex>> slot_out(nslots), slot_in(nslots);
  std::vector<std::vector<LinkIndex>> host_out(st.hosts.size()), host_in(st.hosts.size());
  std::vector<int32_t> node_slot(t.nodes().size(), -1);
  for (std::size_t s = 0; s < nslots; ++s) node_slot[st.slot_gpu[s]] = static_cast<int32_t>(s);
  for (LinkIndex l = 0; l < t.links().size(); ++l) {
    const topo::Link& link = t.link(l);
    if (node_slot[link.from] >= 0) slot_out[static_cast<std::size_t>(node_slot[link.from])].push_back(l);
    if (node_slot[link.to] >= 0) slot_in[static_cast<std::size_t>(node_slot[link.to])].push_back(l);
    const int32_t hf = t.node(link.from).host, ht = t.node(link.to).host;
    if (hf == ht) continue;
    if (hf >= 0) host_out[static_cast<std::size_t>(hf)].push_back(l);
    if (ht >= 0) host_in[static_cast<std::size_t>(ht)].push_back(l);
  }
  const auto flatten = [&](const std::vector<std::vector<LinkIndex>>& sets,
                           std::vector<LinkIndex>& links, std::vector<uint32_t>& begin,
                           std::vector<double>& gbps) {
    begin.assign(1, 0);
    for (const auto& set : sets) {
      double sum = 0;
      for (LinkIndex l : set) {
        links.push_back(l);
        sum += t.link(l).gbps;
      }
      begin.push_back(static_cast<uint32_t>(links.size()));
      gbps.push_back(sum);
    }
  };
  flatten(slot_out, st.slot_out_links, st.slot_out_begin, st.slot_out_gbps);
  flatten(slot_in, st.slot_in_links, st.slot_in_begin, st.slot_in_gbps);
  flatten(host_out, st.host_out_links, st.host_out_begin, st.host_out_gbps);
  flatten(host_in, st.host_in_links, st.host_in_begin, st.host_in_gbps);
  st.rows = std::make_unique<std::atomic<const detail::Row*>[]>(nslots);
  return std::shared_ptr<const PathTable>(std::move(table));
}

const std::optional<std::vector<LinkIndex>>& PathTable::State::host_route(NodeIndex a,
                                                                          NodeIndex b) {
  auto [it, fresh] = routes.try_emplace(key_of(a, b));
  if (!fresh) return it->second;
  const topo::Topology& t = *topology;
  const int32_t h = t.node(a).host;
  if (h < 0 || t.node(b).host != h) return it->second;
  const HostGraph& g = hosts[static_cast<std::size_t>(h)];
  if (auto p = g.graph.route(local_of[a], local_of[b])) {
    for (LinkIndex& l : p->links) l = g.to_whole[l];
    it->second = std::move(p->links);
  }
  return it->second;
}

std::optional<std::vector<LinkIndex>> PathTable::State::via_rail(NodeIndex a, NodeIndex src_gpu,
                                                                 NodeIndex src_nic,
                                                                 NodeIndex dst_nic,
                                                                 NodeIndex dst_gpu, NodeIndex b) {
  const topo::Topology& t = *topology;
  std::vector<LinkIndex> links;
  const auto append = [&](NodeIndex x, NodeIndex y) {
    if (x == y) return true;
    const auto& p = host_route(x, y);
    if (!p) return false;
    links.insert(links.end(), p->begin(), p->end());
    return true;
  };
  if (!append(a, src_gpu) || !append(src_gpu, src_nic)) return std::nullopt;
  // The net hop: the NIC's first net link whose switch reaches dst_nic, then that link.
  bool hopped = false;
  for (LinkIndex up : t.out_links(src_nic)) {
    if (t.link(up).kind != topo::LinkKind::kNet) continue;
    auto down = switch_link.find(key_of(t.link(up).to, dst_nic));
    if (down == switch_link.end()) continue;
    links.push_back(up);
    links.push_back(down->second);
    hopped = true;
    break;
  }
  if (!hopped || !append(dst_nic, dst_gpu) || !append(dst_gpu, b)) return std::nullopt;
  return links;
}

std::optional<NodeIndex> PathTable::State::nic_of_rail(int32_t host, int32_t rail) const {
  const HostGraph& g = hosts[static_cast<std::size_t>(host)];
  for (NodeIndex n : g.nics) {
    const topo::Node& nic = g.graph.node(n);
    if (nic.rail == rail || (nic.rail < 0 && nic.index == rail)) return g.to_whole_node[n];
  }
  return std::nullopt;
}

int32_t PathTable::State::rail_of(NodeIndex nic) const {
  const topo::Node& n = topology->node(nic);
  return n.rail >= 0 ? n.rail : n.index;
}

std::optional<Walk> PathTable::State::default_walk(NodeIndex a, NodeIndex b) {
  if (a == b) return Walk{{}, "local", CandidateKind::kLocal, {}, -1};
  const topo::Topology& t = *topology;
  const int32_t ha = t.node(a).host, hb = t.node(b).host;
  if (ha == hb) {
    const auto& p = host_route(a, b);
    if (!p) return std::nullopt;
    return Walk{*p, "direct", CandidateKind::kDirect, {}, -1};
  }
  // Source's own rail NIC, the NIC of that rail on the destination's host, straight on.
  const HostGraph& ga = hosts[static_cast<std::size_t>(ha)];
  const NodeIndex own = ga.rail_nic[local_of[a]];
  if (own == kAbsent) return std::nullopt;
  const NodeIndex src_nic = ga.to_whole_node[own];
  const int32_t rail = rail_of(src_nic);
  auto dst_nic = nic_of_rail(hb, rail);
  if (!dst_nic) return std::nullopt;
  auto links = via_rail(a, a, src_nic, *dst_nic, b, b);
  if (!links) return std::nullopt;
  return Walk{std::move(*links), "rail " + std::to_string(rail) + " (own NIC)",
              CandidateKind::kDirect, {}, rail};
}

std::vector<Walk> PathTable::State::walks(NodeIndex a, NodeIndex b) {
  const topo::Topology& t = *topology;
  std::vector<Walk> out;
  const auto add = [&](std::vector<LinkIndex> links, std::string via, CandidateKind kind,
                       std::vector<NodeIndex> relays = {}, int32_t rail = -1) {
    for (const Walk& w : out)
      if (w.links == links) return;  // the same walk reached twice
    out.push_back(Walk{std::move(links), std::move(via), kind, std::move(relays), rail});
  };
  const auto add_walk = [&](Walk w) {
    add(std::move(w.links), std::move(w.via), w.kind, std::move(w.relays), w.rail);
  };
  if (a == b) {
    add({}, "local", CandidateKind::kLocal);
    return out;
  }
  const int32_t ha = t.node(a).host, hb = t.node(b).host;
  if (ha == hb) {
    const HostGraph& g = hosts[static_cast<std::size_t>(ha)];
    const NodeIndex la = local_of[a], lb = local_of[b];
    std::vector<topo::Path> paths;
    if (g.gpus.size() <= kMaxRelays + 2) {
      paths = g.graph.gpu_walks(la, lb);
    } else {
      // A large host: relays only through GPUs joined to both ends by a direct NVLink (where
      // a relay can add bandwidth), the first kMaxRelays in index order.
      if (auto p = g.graph.route(la, lb)) paths.push_back(std::move(*p));
      const auto direct_nvlink = [&](NodeIndex x, NodeIndex y) -> std::optional<LinkIndex> {
        for (LinkIndex l : g.graph.out_links(x))
          if (g.graph.link(l).to == y && g.graph.link(l).kind == topo::LinkKind::kNvlink) return l;
        return std::nullopt;
      };
      std::size_t relays = 0;
      for (NodeIndex r : g.gpus) {
        if (r == la || r == lb || relays >= kMaxRelays) continue;
        auto first = direct_nvlink(la, r);
        auto second = direct_nvlink(r, lb);
        if (!first || !second) continue;
        topo::Path p = g.graph.path_of({*first, *second});
        p.relay = r;
        paths.push_back(std::move(p));
        ++relays;
      }
      if (auto h = g.graph.host_route(la, lb)) paths.push_back(std::move(*h));
    }
    for (std::size_t i = 0; i < paths.size(); ++i) {
      topo::Path& p = paths[i];
      // Without host-memory candidates, a host-staged walk stays only as the default path.
      if (p.host_staged && !host_memory && i > 0) continue;
      for (LinkIndex& l : p.links) l = g.to_whole[l];
      if (p.host_staged)
        add(std::move(p.links), "host memory", CandidateKind::kHost);
      else if (p.relay)
        add(std::move(p.links), "relay " + g.graph.node(*p.relay).id, CandidateKind::kRelay,
            {g.to_whole_node[*p.relay]});
      else
        add(std::move(p.links), "direct", CandidateKind::kDirect);
    }
    return out;
  }
  if (auto own = default_walk(a, b)) add_walk(std::move(*own));
  // Rail-matched: through the GPUs that own rail r on each side (PXN-style).
  const HostGraph& ga = hosts[static_cast<std::size_t>(ha)];
  const HostGraph& gb = hosts[static_cast<std::size_t>(hb)];
  for (NodeIndex local_nic : ga.nics) {
    const NodeIndex src_nic = ga.to_whole_node[local_nic];
    const int32_t rail = rail_of(src_nic);
    auto dst_nic = nic_of_rail(hb, rail);
    const NodeIndex src_owner = ga.nic_owner[local_nic];
    if (!dst_nic || src_owner == kAbsent) continue;
    const NodeIndex dst_owner = gb.nic_owner[local_of[*dst_nic]];
    if (dst_owner == kAbsent) continue;
    if (auto links = via_rail(a, src_owner, src_nic, *dst_nic, dst_owner, b)) {
      std::vector<NodeIndex> relays;
      if (src_owner != a) relays.push_back(src_owner);
      if (dst_owner != b) relays.push_back(dst_owner);
      add(std::move(*links), "rail " + std::to_string(rail), CandidateKind::kRail,
          std::move(relays), rail);
    }
  }
  if (out.empty())
    if (auto p = t.route(a, b)) add(p->links, "route", CandidateKind::kDirect);
  return out;
}

std::shared_ptr<detail::CandidateSet> PathTable::State::make_set(const detail::Row& row,
                                                                std::vector<Walk> walks) {
  const topo::Topology& t = *topology;
  auto set = std::make_shared<detail::CandidateSet>();
  const uint32_t n = static_cast<uint32_t>(walks.size());
  const std::size_t base = n == 0 ? 0 : walks[0].links.size();
  std::vector<uint32_t> flags(n);
  std::vector<LinkIndex> united;
  uint32_t shortest = 0;
  for (uint32_t c = 0; c < n; ++c) {
    const auto& mine = walks[c].links;
    bool dominated = false;
    for (uint32_t o = 0; o < n && !dominated; ++o) {
      const auto& other = walks[o].links;
      if (o == c || other.size() > mine.size() || (other.size() == mine.size() && o > c)) continue;
      dominated = std::all_of(other.begin(), other.end(), [&](LinkIndex l) {
        return std::find(mine.begin(), mine.end(), l) != mine.end();
      });
    }
    const uint32_t extra = mine.size() > base ? static_cast<uint32_t>(mine.size() - base) : 0;
    flags[c] = extra << 1 | (dominated ? 0 : 1);
    if (dominated) continue;
    united.insert(united.end(), mine.begin(), mine.end());
    if ((flags[shortest] & 1) == 0 || extra < (flags[shortest] >> 1)) shortest = c;
  }
  std::sort(united.begin(), united.end());
  united.erase(std::unique(united.begin(), united.end()), united.end());
  std::vector<uint32_t> v = {n, shortest, static_cast<uint32_t>(united.size())};
  v.insert(v.end(), flags.begin(), flags.end());
  uint32_t at = static_cast<uint32_t>(3 + 2 * n + 1 + united.size());
  for (uint32_t c = 0; c <= n; ++c) {
    v.push_back(at);
    if (c < n) at += static_cast<uint32_t>(walks[c].links.size());
  }
  v.insert(v.end(), united.begin(), united.end());
  for (Walk& w : walks) {
    v.insert(v.end(), w.links.begin(), w.links.end());
    Candidate c;
    c.gbps = t.path_of(w.links).gbps;
    c.links = std::move(w.links);
    c.via = std::move(w.via);
    c.kind = w.kind;
    c.relays = std::move(w.relays);
    c.rail = w.rail;
    set->candidates.push_back(std::move(c));
  }
  constexpr std::size_t kChunk = 1 << 12;  // words
  uint32_t* space = nullptr;
  if (v.size() > kChunk) {
    space = row.view_chunks.emplace_back(std::make_unique<uint32_t[]>(v.size())).get();
  } else {
    if (v.size() > row.view_left) {
      row.view_chunks.push_back(std::make_unique<uint32_t[]>(kChunk));
      row.view_left = kChunk;
    }
    space = row.view_chunks.back().get() + (kChunk - row.view_left);
    row.view_left -= v.size();
  }
  std::copy(v.begin(), v.end(), space);
  set->view.v = space;
  sets.push_back(set);
  return set;
}

const detail::CandidateSet* PathTable::State::publish(const detail::Row& row, int32_t dst,
                                                      std::shared_ptr<detail::CandidateSet> set) {
  const auto d = static_cast<std::size_t>(dst);
  row.full[d].store(set.get(), std::memory_order_release);
  row.full_view[d].store(set->view.v, std::memory_order_release);  // after: a view implies a set
  return set.get();
}

Status PathTable::State::no_path(NodeIndex a, NodeIndex b) const {
  return Status::error("no path from " + topology->node(a).id + " to " + topology->node(b).id);
}

const detail::Row* PathTable::State::row(int32_t slot) {
  if (const detail::Row* r = rows[static_cast<std::size_t>(slot)].load(std::memory_order_acquire))
    return r;
  std::lock_guard<std::mutex> lock(mu);
  if (const detail::Row* r = rows[static_cast<std::size_t>(slot)].load(std::memory_order_relaxed))
    return r;
  auto r = std::make_unique<detail::Row>();
  const std::size_t nslots = slot_gpu.size();
  r->full = std::make_unique<std::atomic<const detail::CandidateSet*>[]>(nslots);
  r->full_view = std::make_unique<std::atomic<const uint32_t*>[]>(nslots);
  r->only_default = std::make_unique<std::atomic<const detail::CandidateSet*>[]>(nslots);
  r->begin.push_back(0);
  const NodeIndex a = slot_gpu[static_cast<std::size_t>(slot)];
  for (std::size_t d = 0; d < nslots; ++d) {
    auto w = default_walk(a, slot_gpu[d]);
    if (w) {
      r->links.insert(r->links.end(), w->links.begin(), w->links.end());
    } else if (auto all = walks(a, slot_gpu[d]); !all.empty()) {
      // No default of the usual shape: candidates[0] of the whole set is the default.
      r->links.insert(r->links.end(), all[0].links.begin(), all[0].links.end());
      publish(*r, static_cast<int32_t>(d), make_set(*r, std::move(all)));
      w.emplace();
    }
    r->reachable.push_back(w ? 1 : 0);
    r->begin.push_back(static_cast<uint32_t>(r->links.size()));
  }
  const detail::Row* published = r.get();
  row_storage.push_back(std::move(r));
  rows[static_cast<std::size_t>(slot)].store(published, std::memory_order_release);
  return published;
}

StatusOr<const detail::CandidateSet*> PathTable::State::full_set(int32_t src, int32_t dst) {
  const detail::Row* r = row(src);
  auto& slot = r->full[static_cast<std::size_t>(dst)];
  if (const detail::CandidateSet* s = slot.load(std::memory_order_acquire)) return s;
  std::lock_guard<std::mutex> lock(mu);
  if (const detail::CandidateSet* s = slot.load(std::memory_order_relaxed)) return s;
  const NodeIndex a = slot_gpu[static_cast<std::size_t>(src)];
  const NodeIndex b = slot_gpu[static_cast<std::size_t>(dst)];
  auto all = walks(a, b);
  if (all.empty()) return no_path(a, b);
  return publish(*r, dst, make_set(*r, std::move(all)));
}

StatusOr<detail::CandidateView> PathTable::State::full_view(int32_t src, int32_t dst) {
  const detail::Row* r = row(src);
  if (const uint32_t* v =
          r->full_view[static_cast<std::size_t>(dst)].load(std::memory_order_acquire))
    return detail::CandidateView{v};
  auto set = full_set(src, dst);
  if (!set) return set.status();
  return (*set)->view;
}

StatusOr<const detail::CandidateSet*> PathTable::State::default_set(int32_t src, int32_t dst) {
  const detail::Row* r = row(src);
  if (const detail::CandidateSet* s =
          r->full[static_cast<std::size_t>(dst)].load(std::memory_order_acquire))
    return s;  // every candidate already known
  auto& slot = r->only_default[static_cast<std::size_t>(dst)];
  if (const detail::CandidateSet* s = slot.load(std::memory_order_acquire)) return s;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const detail::CandidateSet* s = slot.load(std::memory_order_relaxed)) return s;
    const NodeIndex a = slot_gpu[static_cast<std::size_t>(src)];
    const NodeIndex b = slot_gpu[static_cast<std::size_t>(dst)];
    if (auto w = default_walk(a, b)) {
      std::vector<Walk> one;
      one.push_back(std::move(*w));
      const detail::CandidateSet* s = make_set(*r, std::move(one)).get();
      slot.store(s, std::memory_order_release);
      return s;
    }
  }
  return full_set(src, dst);  // no default of the usual shape: the whole set decides
}

std::vector<Walk> PathTable::State::unkept_walks(int32_t src, int32_t dst) {
  std::lock_guard<std::mutex> lock(mu);
  return walks(slot_gpu[static_cast<std::size_t>(src)], slot_gpu[static_cast<std::size_t>(dst)]);
}

StatusOr<std::shared_ptr<const std::vector<Candidate>>> PathTable::candidates(
    int32_t src, int32_t dst, bool only_default) const {
  if (src < 0 || dst < 0 || src >= nranks() || dst >= nranks())
    return Status::error("pair (" + std::to_string(src) + ", " + std::to_string(dst) +
                         ") is outside the table's " + std::to_string(nranks()) + " ranks");
  const int32_t a = state_->rank_slot[static_cast<std::size_t>(src)];
  const int32_t b = state_->rank_slot[static_cast<std::size_t>(dst)];
  auto set = only_default ? state_->default_set(a, b) : state_->full_set(a, b);
  if (!set)
    return Status::error("ranks " + std::to_string(src) + " -> " + std::to_string(dst) + ": " +
                         set.status().message());
  return detail::candidates_of(*set);
}

}  // namespace efccl::balance
