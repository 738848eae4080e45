// The plan by class (docs/balancer.md, "The plan by class") and its lazy listing (PairList,
// efccl/balance/planner.h).
//
// Where the table is symmetric by host (detail::Folding), there is no background load and a
// pair's bytes depend only on its ranks' places on their hosts and on whether the hosts are
// the same, the pairs equivalent by that symmetry share one plan. Everything is computed per
// class, never per pair: the loads with every pair on its default path, the lower bound, the
// split (the classes are the pairs of the folded problem, planned by the split solver), a
// class's bytes dealt back to its pairs by stretch so that every host sees the same loads,
// and the exact load of every link under that plan, in integers, as a class's bytes times
// the number of its pairs on the link. The answer is kept only when that maximum load is
// within kCertified of the proven lower bound (and below the direct plan's); otherwise the
// general planner runs. Per-pair results (a PairPlan) are made only when a caller reads them.
//
// What makes the per-class sums exact is that every pair's paths are its class
// representative's with its own hosts' links in place: checked once per table, when it is
// folded, for every pair's default path and for the candidates of sample pairs on other hosts
// (the candidates are made by one function of a host's subgraph, which the folding checks is
// the same graph on every host).
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "planner_internal.h"
#include "split_solver.h"

namespace efccl::balance {
namespace {

/// Two links of two hosts' subgraphs alike in everything a walk reads.
bool same_link(const topo::Link& a, const topo::Link& b) {
  return a.from == b.from && a.to == b.to && a.kind == b.kind && a.gbps == b.gbps &&
         a.latency_us == b.latency_us && a.lanes == b.lanes;
}

constexpr uint32_t kNone = detail::Folding::kNone;

/// plan_by_class's buffers, per thread.
struct ClassScratch {
  std::vector<uint64_t> key_bytes;    ///< per key (same host, i, j): each pair's bytes
  std::vector<uint32_t> class_key;    ///< per class (a key at or above the threshold)
  std::vector<uint64_t> class_bytes;  ///< per class: the folded pair's bytes
  std::vector<uint64_t> folded_fixed, folded_direct;  ///< per folded link, integers
  std::vector<int64_t> folded_moved;                  ///< per folded link: what the split moves
  std::vector<double> fixed, direct, load;            ///< per link of the topology
  std::vector<double> base, folded_start;             ///< per folded link, for the solver
  std::vector<uint64_t> mine, sums;
  std::vector<detail::SplitPair> pairs;
  detail::SplitOutput out;
};

ClassScratch& class_scratch() {
  thread_local ClassScratch scratch;
  return scratch;
}

/// Appends to `f.arena` the view of `set` over folded links (the same candidates and flags).
void fold_view(const detail::CandidateView set, detail::Folding& f, std::vector<uint32_t>& united) {
  const uint32_t n = set.size();
  united.clear();
  for (uint32_t c = 0; c < n; ++c)
    if (set.useful(c))
      for (LinkIndex l : set.links_of(c)) united.push_back(f.folded[l]);
  std::sort(united.begin(), united.end());
  united.erase(std::unique(united.begin(), united.end()), united.end());
  f.arena.push_back(n);
  f.arena.push_back(set.shortest_useful());
  f.arena.push_back(static_cast<uint32_t>(united.size()));
  for (uint32_t c = 0; c < n; ++c) f.arena.push_back(set.v[3 + c]);
  uint32_t begin = static_cast<uint32_t>(3 + 2 * n + 1 + united.size());
  for (uint32_t c = 0; c <= n; ++c) {
    f.arena.push_back(begin);
    if (c < n) begin += static_cast<uint32_t>(set.links_of(c).size());
  }
  f.arena.insert(f.arena.end(), united.begin(), united.end());
  for (uint32_t c = 0; c < n; ++c)
    for (LinkIndex l : set.links_of(c)) f.arena.push_back(f.folded[l]);
}

/// Where links lie, for checking that a pair's paths are its representative's: a link's
/// host (-1 between outside nodes), and per folded link of a host the link of host 0 and 1.
struct Places {
  std::vector<int32_t> host;
  std::vector<LinkIndex> at0, at1;
  /// `l` of a pair from host hs to hd as the representative (host 0 to 1, or 0 to 0) has it.
  LinkIndex canonical(const detail::Folding& f, LinkIndex l, int32_t hs, int32_t hd) const {
    const int32_t h = host[l];
    if (h < 0) return l;
    return h == hs ? at0[f.folded[l]] : h == hd ? at1[f.folded[l]] : kNone;
  }
  bool same(const detail::Folding& f, std::span<const LinkIndex> mine,
            std::span<const LinkIndex> rep, int32_t hs, int32_t hd) const {
    if (mine.size() != rep.size()) return false;
    for (std::size_t x = 0; x < mine.size(); ++x)
      if (canonical(f, mine[x], hs, hd) != rep[x]) return false;
    return true;
  }
};

/// Whether every pair's default path, and every candidate of the pairs between sample hosts,
/// are their representative's (see the top of the file). Computes every row of the table (as
/// the general planner's pass does); the samples' candidate sets are not kept.
template <typename State>
bool paths_fold(State& st, const detail::Folding& f, const Places& at) {
  const std::size_t k = f.per_host, n = st.rank_slot.size();
  const int32_t last = static_cast<int32_t>(f.hosts) - 1;
  const auto rep_of = [&](std::size_t s, std::size_t d) {
    return std::make_pair(static_cast<int32_t>(s % k),
                          static_cast<int32_t>(s / k == d / k ? d % k : k + d % k));
  };
  for (std::size_t s = 0; s < n; ++s) {
    const detail::Row& row = *st.row(static_cast<int32_t>(s));
    for (std::size_t d = 0; d < n; ++d) {
      const auto [rs, rd] = rep_of(s, d);
      const detail::Row& rep = *st.row(rs);
      if (row.reachable[d] != rep.reachable[static_cast<std::size_t>(rd)]) return false;
      const int32_t hs = static_cast<int32_t>(s / k), hd = static_cast<int32_t>(d / k);
      if (!at.same(f, row.default_links(static_cast<int32_t>(d)), rep.default_links(rd), hs, hd))
        return false;
    }
  }
  // The representatives' candidates[0] is their default path (what the loads assume).
  for (std::size_t s = 0; s < k; ++s)
    for (std::size_t d = 0; d < 2 * k; ++d) {
      auto view = st.full_view(static_cast<int32_t>(s), static_cast<int32_t>(d));
      const auto path = st.row(static_cast<int32_t>(s))->default_links(static_cast<int32_t>(d));
      if (view &&
          !std::equal(path.begin(), path.end(), view->links_of(0).begin(), view->links_of(0).end()))
        return false;
    }
  // Sample hosts: the last to the first, the second to the last, and the last on itself.
  const std::pair<int32_t, int32_t> samples[] = {
      {last, 0}, {1, last == 1 ? 0 : last}, {last, last}};
  for (const auto& [hs, hd] : samples)
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t s = static_cast<std::size_t>(hs) * k + i;
        const std::size_t d = static_cast<std::size_t>(hd) * k + j;
        const auto [rs, rd] = rep_of(s, d);
        const std::vector<detail::Walk> mine =
            st.unkept_walks(static_cast<int32_t>(s), static_cast<int32_t>(d));
        auto rep = st.full_view(rs, rd);
        if (!rep) {
          if (!mine.empty()) return false;
          continue;
        }
        // The same walks in place: the same flags too (they follow from the links).
        if (mine.size() != rep->size()) return false;
        for (uint32_t c = 0; c < rep->size(); ++c)
          if (!at.same(f, mine[c].links, rep->links_of(c), hs, hd)) return false;
      }
  return true;
}

/// Fills `f` for `st`'s table (symmetric stays false where the table is not). A template:
/// PathTable::State is the Planner's to name.
template <typename State>
void fold(State& st, detail::Folding& f) {
  const topo::Topology& t = *st.topology;
  const std::size_t nlinks = t.links().size();
  const std::size_t nhosts = st.hosts.size();
  const std::size_t n = st.rank_slot.size();
  if (nhosts < 2 || n == 0 || st.slot_gpu.size() != n || n % nhosts != 0) return;
  // Ranks host by host, one a GPU, the same GPUs in the same order on every host.
  const std::size_t k = n / nhosts;
  for (std::size_t r = 0; r < n; ++r) {
    const NodeIndex gpu = st.slot_gpu[r];
    if (st.rank_slot[r] != static_cast<int32_t>(r) ||
        st.slot_host[r] != static_cast<int32_t>(r / k) ||
        st.local_of[gpu] != st.local_of[st.slot_gpu[r % k]])
      return;
  }
  // Every host the same graph: a link inside a host folds onto its index in the host.
  const auto& first = st.hosts[0];
  const std::size_t local_links = first.to_whole.size();
  f.folded.assign(nlinks, kNone);
  Places at;
  at.host.assign(nlinks, -1);
  std::vector<double> gbps;
  std::vector<uint32_t> count;
  for (std::size_t h = 0; h < nhosts; ++h) {
    const auto& g = st.hosts[h];
    if (g.to_whole.size() != local_links || g.graph.nodes().size() != first.graph.nodes().size())
      return;
    for (std::size_t v = 0; v < g.graph.nodes().size(); ++v) {
      const topo::Node& mine = g.graph.nodes()[v];
      const topo::Node& other = first.graph.nodes()[v];
      // Rails and indices name the rail-matched candidates; the rest may steer the walks.
      if (mine.kind != other.kind || mine.rail != other.rail || mine.index != other.index ||
          mine.numa != other.numa || mine.gbps != other.gbps)
        return;
    }
    for (std::size_t l = 0; l < local_links; ++l) {
      const topo::Link& mine = g.graph.links()[l];
      const topo::Link& other = first.graph.links()[l];
      // Every field: the walks follow links by kind (a GPU's rail NIC, the host-memory path)
      // and break ties by latency, so a host differing in any of them has other candidates.
      if (!same_link(mine, other)) return;
      f.folded[g.to_whole[l]] = static_cast<uint32_t>(l);
      at.host[g.to_whole[l]] = static_cast<int32_t>(h);
    }
  }
  for (std::size_t l = 0; l < local_links; ++l) gbps.push_back(first.graph.links()[l].gbps);
  count.assign(local_links, static_cast<uint32_t>(nhosts));
  f.per_host_link.assign(local_links, 1);
  // A link between a host and an outside node (a rail switch) folds by (its node on the
  // host, the outside node, the way); one between outside nodes is its own.
  std::unordered_map<uint64_t, uint32_t> external;
  std::unordered_map<uint32_t, LinkIndex> external_first;  // folded link -> its first link
  std::unordered_set<uint64_t> folded_host;  // (folded link, host): one link of each host
  for (LinkIndex l = 0; l < nlinks; ++l) {
    if (f.folded[l] != kNone) continue;
    const topo::Link& link = t.link(l);
    const int32_t hf = t.node(link.from).host, ht = t.node(link.to).host;
    if (hf >= 0 && ht >= 0) return;  // between two hosts
    const uint32_t next = static_cast<uint32_t>(gbps.size());
    if (hf >= 0 || ht >= 0) {
      const NodeIndex inside = hf >= 0 ? link.from : link.to;
      const NodeIndex outside = hf >= 0 ? link.to : link.from;
      const uint64_t key =
          uint64_t{st.local_of[inside]} << 33 | uint64_t{outside} << 1 | (hf >= 0 ? 1u : 0u);
      auto [it, added] = external.emplace(key, next);
      const uint64_t host = static_cast<uint64_t>(hf >= 0 ? hf : ht);
      at.host[l] = static_cast<int32_t>(host);
      if (!folded_host.insert(uint64_t{it->second} << 32 | host).second) return;
      if (!added) {
        const topo::Link& seen = t.link(external_first.at(it->second));
        if (seen.kind != link.kind || seen.gbps != link.gbps ||
            seen.latency_us != link.latency_us || seen.lanes != link.lanes)
          return;
        ++count[it->second];
        f.folded[l] = it->second;
        continue;
      }
    }
    if (hf >= 0 || ht >= 0) external_first.emplace(next, l);
    gbps.push_back(link.gbps);
    count.push_back(1);
    f.per_host_link.push_back(hf >= 0 || ht >= 0 ? 1 : 0);
    f.folded[l] = next;
  }
  // A node's links out of it in the same order on every host: a walk takes the first that
  // matches (a NIC's link up to its rail), so another order is another candidate.
  std::vector<uint32_t> order, expect;
  for (std::size_t v = 0; v < first.graph.nodes().size(); ++v) {
    expect.clear();
    for (const LinkIndex l : t.out_links(first.to_whole_node[v])) expect.push_back(f.folded[l]);
    for (std::size_t h = 1; h < nhosts; ++h) {
      order.clear();
      for (const LinkIndex l : t.out_links(st.hosts[h].to_whole_node[v]))
        order.push_back(f.folded[l]);
      if (order != expect) return;
    }
  }
  f.us_per_byte.resize(gbps.size());
  for (std::size_t o = 0; o < gbps.size(); ++o) {
    if ((f.per_host_link[o] && count[o] != nhosts) || !(gbps[o] > 0)) return;
    // A folded link stands for one link of each host (a host's pairs of a class load it); a
    // link outside the hosts carries every host's.
    f.us_per_byte[o] = (f.per_host_link[o] ? 1.0 : static_cast<double>(nhosts)) / (gbps[o] * 1e3);
  }
  at.at0.assign(gbps.size(), kNone);
  at.at1.assign(gbps.size(), kNone);
  for (LinkIndex l = 0; l < nlinks; ++l) {
    if (at.host[l] == 0) at.at0[f.folded[l]] = l;
    if (at.host[l] == 1) at.at1[f.folded[l]] = l;
  }
  f.hosts = nhosts;
  f.per_host = k;
  if (!paths_fold(st, f, at)) return;
  // Each class's representative, its candidates over folded links.
  f.view_at.assign(2 * k * k, kNone);
  std::vector<uint32_t> united;
  for (std::size_t same = 0; same < 2; ++same)
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t j = 0; j < k; ++j) {
        auto view = st.full_view(static_cast<int32_t>(i), static_cast<int32_t>(same ? j : k + j));
        if (!view) continue;
        f.view_at[(same * k + i) * k + j] = static_cast<uint32_t>(f.arena.size());
        fold_view(*view, f, united);
      }
  f.symmetric = true;
}

}  // namespace

namespace detail {

PairPlan ClassListing::pair(std::size_t s, std::size_t d) const {
  PairPlan p;
  p.src = static_cast<int32_t>(s);
  p.dst = static_cast<int32_t>(d);
  p.bytes = key_bytes[key(s, d)];
  // A pair the planner may split with every candidate; a pair under the threshold with
  // candidates[0] alone, whenever it is read (the table may have learnt its other candidates
  // since, from another plan: the same plan must read the same at any time). Found when folded;
  // a failed lookup leaves no candidates, which plan_program reports.
  const bool small = p.bytes < min_split_bytes;
  if (auto c = table->candidates(p.src, p.dst, small)) {
    p.candidates = *c;
    if (small && p.candidates->size() > 1)
      p.candidates = std::make_shared<const std::vector<Candidate>>(1, p.candidates->front());
  }
  const uint32_t at = split_of(s, d);
  if (at == kNone) {
    p.paths.push_back({0, p.bytes});
    return p;
  }
  for (uint32_t c = 0; c < ncandidates[key(s, d)]; ++c)
    if (shares[at + c] > 0) p.paths.push_back({c, shares[at + c]});
  return p;
}

std::size_t ClassListing::position_of(std::size_t index) const {
  // Every row of a host lists as many pairs as the same row of host 0 (its stretches are the
  // same, in another order).
  const std::size_t host = index / before_local[per_host];
  std::size_t rest = index % before_local[per_host];
  const std::size_t i = static_cast<std::size_t>(
      std::upper_bound(before_local.begin(), before_local.end(), rest) - before_local.begin() - 1);
  rest -= before_local[i];
  const std::size_t s = host * per_host + i;
  for (std::size_t d = 0;; ++d)
    if (is_listed(s, d) && rest-- == 0) return s * nranks + d;
}

std::size_t ClassListing::next_listed(std::size_t position) const {
  const std::size_t end = nranks * nranks;
  while (position < end && !is_listed(position / nranks, position % nranks)) ++position;
  return position;
}

}  // namespace detail

PairList::PairList(std::shared_ptr<const detail::ClassListing> classes)
    : classes_(std::move(classes)) {}

std::size_t PairList::size() const { return classes_ ? classes_->listed : listed_.size(); }

PairPlan PairList::operator[](std::size_t i) const {
  if (!classes_) return listed_[i];
  const std::size_t at = classes_->position_of(i);
  return classes_->pair(at / classes_->nranks, at % classes_->nranks);
}

std::optional<PairPlan> PairList::find(int32_t src, int32_t dst) const {
  if (classes_) {
    const std::size_t n = classes_->nranks;
    if (src < 0 || dst < 0 || static_cast<std::size_t>(src) >= n ||
        static_cast<std::size_t>(dst) >= n ||
        !classes_->is_listed(static_cast<std::size_t>(src), static_cast<std::size_t>(dst)))
      return std::nullopt;
    return classes_->pair(static_cast<std::size_t>(src), static_cast<std::size_t>(dst));
  }
  const auto it = std::lower_bound(listed_.begin(), listed_.end(), std::make_pair(src, dst),
                                   [](const PairPlan& p, const std::pair<int32_t, int32_t>& k) {
                                     return std::make_pair(p.src, p.dst) < k;
                                   });
  if (it == listed_.end() || it->src != src || it->dst != dst) return std::nullopt;
  return *it;
}

PairList::const_iterator PairList::begin() const {
  const_iterator it;
  it.list_ = this;
  if (classes_ && classes_->listed > 0) {
    it.position_ = classes_->next_listed(0);
    it.current_ = classes_->pair(it.position_ / classes_->nranks, it.position_ % classes_->nranks);
  }
  return it;
}

PairList::const_iterator PairList::end() const {
  const_iterator it;
  it.list_ = this;
  it.index_ = size();
  return it;
}

PairList::const_iterator& PairList::const_iterator::operator++() {
  ++index_;
  const detail::ClassListing* c = list_->classes_.get();
  if (c == nullptr) return *this;
  if (index_ >= c->listed) {
    current_ = PairPlan{};
    return *this;
  }
  position_ = c->next_listed(position_ + 1);
  current_ = c->pair(position_ / c->nranks, position_ % c->nranks);
  return *this;
}

bool Planner::plan_by_class(const Demand& demand, Solution& sol) const {
  PathTable::State& st = *table_->state_;
  const detail::Folding* f = st.folding.load(std::memory_order_acquire);
  if (f == nullptr) {
    auto built = std::make_unique<detail::Folding>();
    fold(st, *built);  // outside the lock: it looks up candidate sets, which take it
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.folding_storage) {
      st.folding_storage = std::move(built);
      st.folding.store(st.folding_storage.get(), std::memory_order_release);
    }
    f = st.folding_storage.get();
  }
  if (!f->symmetric) return false;
  const std::size_t n = static_cast<std::size_t>(demand.nranks);
  const std::size_t nhosts = f->hosts, k = f->per_host, keys = 2 * k * k;
  const std::size_t stretches = nhosts - 1;
  // The demand: host 0's row for pairs on one host, host 0 to host 1 for the others.
  const uint64_t* bytes = demand.bytes.data();
  for (std::size_t s = 0; s < n; ++s) {
    const uint64_t* model = bytes + (s % k) * n;
    const uint64_t* row = bytes + s * n;
    const std::size_t host_begin = s - s % k;
    for (std::size_t hd = 0; hd < n; hd += k) {
      const uint64_t* want = model + (hd == host_begin ? 0 : k);
      if (!std::equal(row + hd, row + hd + k, want)) return false;
    }
  }
  // The keys (same host?, i, j): their bytes, their pairs, their classes (at or above the
  // threshold; each a pair of the folded problem). A class of pairs on two hosts carries the
  // bytes of one host's pairs to the others (nhosts - 1), which the folded links of one host
  // see. Every sum below stays under 2^53: exact in doubles, as the general planner's sums.
  ClassScratch& w = class_scratch();
  w.key_bytes.assign(keys, 0);
  w.class_key.clear();
  w.class_bytes.clear();
  const std::size_t nfolded = f->us_per_byte.size();
  w.folded_fixed.assign(nfolded, 0);
  w.folded_direct.assign(nfolded, 0);
  const auto view_of_key = [&](std::size_t key) {
    return detail::CandidateView{f->arena.data() + f->view_at[key]};
  };
  uint64_t total = 0;
  std::vector<uint64_t> slot_out(k, 0), slot_in(k, 0);  // of local GPU i, on every host
  uint64_t host_cross = 0;                              // out of (and into) every host
  for (std::size_t key = 0; key < keys; ++key) {
    const bool same = key >= k * k;
    const std::size_t i = key / k % k, j = key % k;
    const uint64_t b = bytes[i * n + (same ? j : k + j)];
    if (b == 0) continue;
    if (f->view_at[key] == kNone) return false;  // the general planner names the error
    const uint64_t pairs = same ? nhosts : nhosts * stretches;
    if (b > (uint64_t{1} << 53) / pairs || total + b * pairs > (uint64_t{1} << 53)) return false;
    total += b * pairs;
    w.key_bytes[key] = b;
    sol.pairs_with_bytes += pairs;
    const uint64_t class_bytes = same ? b : b * stretches;
    const bool small = b < options_.min_split_bytes;
    for (uint32_t o : view_of_key(key).links_of(0))
      (small ? w.folded_fixed : w.folded_direct)[o] += class_bytes;
    if (!same) {
      slot_out[i] += b * stretches;
      slot_in[j] += b * stretches;
      host_cross += b * stretches;
    } else if (i != j) {
      slot_out[i] += b;
      slot_in[j] += b;
    }
    if (small) continue;
    w.class_key.push_back(static_cast<uint32_t>(key));
    w.class_bytes.push_back(class_bytes);
  }
  for (std::size_t o = 0; o < nfolded; ++o) w.folded_direct[o] += w.folded_fixed[o];
  // The real links: every host's copy of a folded link carries the same, a link outside the
  // hosts every host's.
  const std::size_t nlinks = f->folded.size();
  const auto real = [&](LinkIndex l, uint64_t folded_bytes) {
    const uint32_t o = f->folded[l];
    return static_cast<double>(f->per_host_link[o] ? folded_bytes : folded_bytes * nhosts);
  };
  w.fixed.resize(nlinks);
  w.direct.resize(nlinks);
  const std::span<const double> inv = st.us_per_byte;
  double bound = 0;
  sol.direct_max_load_us = 0;
  for (LinkIndex l = 0; l < nlinks; ++l) {
    w.fixed[l] = real(l, w.folded_fixed[f->folded[l]]);
    w.direct[l] = real(l, w.folded_direct[f->folded[l]]);
    bound = std::max(bound, w.fixed[l] * inv[l]);
    sol.direct_max_load_us = std::max(sol.direct_max_load_us, w.direct[l] * inv[l]);
  }
  // The cuts of the lower bound, as compute() takes them (no background here).
  for (std::size_t s = 0; s < n; ++s) {
    if (slot_out[s % k] > 0 && st.slot_out_gbps[s] > 0)
      bound =
          std::max(bound, detail::us(static_cast<double>(slot_out[s % k]), st.slot_out_gbps[s]));
    if (slot_in[s % k] > 0 && st.slot_in_gbps[s] > 0)
      bound = std::max(bound, detail::us(static_cast<double>(slot_in[s % k]), st.slot_in_gbps[s]));
  }
  for (std::size_t h = 0; h < nhosts && host_cross > 0; ++h) {
    if (st.host_out_gbps[h] > 0)
      bound = std::max(bound, detail::us(static_cast<double>(host_cross), st.host_out_gbps[h]));
    if (st.host_in_gbps[h] > 0)
      bound = std::max(bound, detail::us(static_cast<double>(host_cross), st.host_in_gbps[h]));
  }
  auto listing = std::make_shared<detail::ClassListing>();
  detail::ClassListing& c = *listing;
  c.table = table_;
  c.nranks = n;
  c.per_host = k;
  c.hosts = nhosts;
  c.min_split_bytes = options_.min_split_bytes;
  c.lists_direct_pairs = options_.list_direct_pairs;
  c.key_bytes = w.key_bytes;
  c.ncandidates.assign(keys, 0);
  c.split_at.assign(keys * stretches, detail::ClassListing::kNone);
  const auto finish = [&](std::vector<double>& load) {
    // Listed pairs per row of each local source; every host's rows list the same numbers.
    c.before_local.assign(k + 1, 0);
    for (std::size_t i = 0; i < k; ++i) {
      std::size_t row = 0;
      for (std::size_t j = 0; j < n; ++j) row += c.is_listed(i, j) ? 1 : 0;
      c.before_local[i + 1] = c.before_local[i] + row;
    }
    c.listed = c.before_local[k] * nhosts;
    sol.classes = std::move(listing);
    sol.pair_bytes.assign(load.begin(), load.end());
    return true;
  };
  const std::size_t nclasses = w.class_key.size();
  // Every pair on its default path when that is provably good enough.
  if (nclasses == 0 || !(sol.direct_max_load_us > bound * (1 + detail::kCertified))) {
    sol.max_load_us = sol.direct_max_load_us;
    return finish(w.direct);
  }
  // The folded problem: the classes over folded links, the base load the most of any copy.
  w.base.assign(nfolded, 0.0);
  for (LinkIndex l = 0; l < nlinks; ++l) {
    const uint32_t o = f->folded[l];
    const double b = f->per_host_link[o] ? w.fixed[l] : w.fixed[l] / static_cast<double>(nhosts);
    w.base[o] = std::max(w.base[o], b);
  }
  w.folded_start = w.base;
  w.pairs.resize(nclasses);
  for (uint32_t x = 0; x < nclasses; ++x) {
    w.pairs[x] = {w.class_bytes[x], view_of_key(w.class_key[x]).links_of(0)};
    for (uint32_t o : view_of_key(w.class_key[x]).links_of(0))
      w.folded_start[o] += static_cast<double>(w.class_bytes[x]);
  }
  detail::SplitInput in;
  in.us_per_byte = f->us_per_byte;
  in.base = w.base;
  in.direct = w.folded_start;
  in.lower_bound_us = bound;  // the folded problem's optimum is no lower than the whole one's
  in.pairs = w.pairs;
  in.candidates = [&](uint32_t x) -> StatusOr<detail::CandidateView> {
    return view_of_key(w.class_key[x]);
  };
  in.piece_bytes = options_.piece_bytes;
  in.max_pieces = options_.max_pieces;
  in.hop_penalty_us = options_.hop_penalty_us;
  in.max_sweeps = options_.iterations;
  if (!detail::split(in, w.out) || w.out.pairs.empty()) return false;
  // Back to the pairs. A class's shares, candidate by candidate, laid end to end; the pair
  // (h, i) -> (h + t + 1, j) takes the t-th stretch of one pair's bytes, so that every host
  // sends and receives each stretch once: the same loads on every host. Most pairs fall
  // within one candidate's shares and go there whole. A pair cut where its class's shares
  // meet keeps the general planner's granularity: every share but its largest a multiple of
  // 1/64 of a piece (nearest), the largest the rest.
  const uint64_t grain = std::max<uint64_t>(1, options_.piece_bytes / 64);
  w.folded_moved.assign(nfolded, 0);
  std::size_t moved_pairs = 0;
  for (std::size_t x = 0; x < w.out.pairs.size(); ++x) {
    const std::size_t key = w.class_key[w.out.pairs[x]];
    const bool same = key >= k * k;
    const uint64_t b = w.key_bytes[key];
    const detail::CandidateView view = view_of_key(key);
    const uint32_t nc = view.size();
    const uint64_t* shares = w.out.bytes.data() + w.out.begin[x];
    uint64_t sum = 0;  // shares add up, or no pair's would
    for (uint32_t cand = 0; cand < nc; ++cand) sum += shares[cand];
    if (sum != w.class_bytes[w.out.pairs[x]]) return false;
    c.ncandidates[key] = nc;
    w.sums.assign(nc, 0);  // the class's moved pairs' bytes per candidate, over stretches
    uint64_t moved = 0;    // their bytes
    for (std::size_t t = 0; t < (same ? 1 : stretches); ++t) {
      const uint64_t lo = t * b, hi = lo + b;
      w.mine.assign(nc, 0);
      uint64_t at = 0;
      for (uint32_t cand = 0; cand < nc && at < hi; ++cand) {
        const uint64_t from = std::max(at, lo), to = std::min(at + shares[cand], hi);
        if (to > from) w.mine[cand] = to - from;
        at += shares[cand];
      }
      const auto largest = std::max_element(w.mine.begin(), w.mine.end());
      if (*largest != b) {  // cut: every share but the largest in grains, it the rest
        uint64_t rest = b;
        for (auto it = w.mine.begin(); it != w.mine.end(); ++it)
          if (it != largest) rest -= (*it = std::min(rest, (*it + grain / 2) / grain * grain));
        *largest = rest;
      }
      if (w.mine[0] == b) continue;  // all on its default path
      c.split_at[key * stretches + t] = static_cast<uint32_t>(c.shares.size());
      c.shares.insert(c.shares.end(), w.mine.begin(), w.mine.end());
      for (uint32_t cand = 0; cand < nc; ++cand) w.sums[cand] += w.mine[cand];
      moved += b;
      moved_pairs += nhosts;
    }
    // On a copy of a folded link, each moved (key, stretch) has one pair from its host and
    // one to it: the folded view counts both ends' links.
    for (uint32_t o : view.links_of(0)) w.folded_moved[o] -= static_cast<int64_t>(moved);
    for (uint32_t cand = 0; cand < nc; ++cand)
      if (w.sums[cand] > 0)
        for (uint32_t o : view.links_of(cand))
          w.folded_moved[o] += static_cast<int64_t>(w.sums[cand]);
  }
  if (moved_pairs == 0) return false;
  // The exact load of every link under the plan; kept only when provably within kCertified
  // of the optimum, and below the direct plan.
  w.load.resize(nlinks);
  double worst = 0;
  for (LinkIndex l = 0; l < nlinks; ++l) {
    const uint32_t o = f->folded[l];
    const int64_t folded = static_cast<int64_t>(w.folded_direct[o]) + w.folded_moved[o];
    if (folded < 0) return false;  // not expected: a pair's bytes leave only links it had
    w.load[l] = real(l, static_cast<uint64_t>(folded));
    worst = std::max(worst, w.load[l] * inv[l]);
  }
  if (!(worst <= bound * (1 + detail::kCertified)) || !(worst < sol.direct_max_load_us))
    return false;
  sol.max_load_us = worst;
  sol.by_class = true;
  return finish(w.load);
}

}  // namespace efccl::balance
