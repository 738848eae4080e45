// The planner (efccl/balance/planner.h; docs/balancer.md gives the method).
//
// Per call: every pair's bytes are checked and put on its default path through the table's
// flat rows (the pairs under the threshold stay there), a lower bound on the optimum is taken
// from the load that cannot move and from cuts (what must leave or enter each GPU and each
// host), and unless every pair on its default path is already within 1% of it, the pairs at
// or above the threshold go to the split solver (split_solver.h). The result is kept compact
// (the shares of the pairs off their default path, and the link loads) and listed as a Plan
// at the end; the hysteresis cache keeps the compact form, not the listing.
#include "efccl/balance/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "efccl/common/hash.h"
#include "path_table_state.h"
#include "split_solver.h"

namespace efccl::balance {
namespace {

constexpr std::size_t kMaxCachedPlans = 256;
constexpr uint64_t kMaxPairBytes = uint64_t{1} << 50;
/// Every pair stays on its default path when that is provably within this fraction of the
/// optimum (the solver's own margin, split_solver.cc).
constexpr double kCertified = 0.01;

/// Microseconds to carry `bytes` at `gbps`.
double us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

/// The background load per link: finite, non-negative values of `background`, 0 elsewhere.
std::vector<double> base_load(std::span<const double> background, std::size_t nlinks) {
  std::vector<double> load(nlinks, 0.0);
  for (std::size_t l = 0; l < background.size() && l < nlinks; ++l)
    load[l] = std::isfinite(background[l]) && background[l] > 0 ? background[l] : 0.0;
  return load;
}

double max_us(std::span<const double> us_per_byte, std::span<const double> a,
              std::span<const double> b) {
  double worst = 0;
  for (std::size_t l = 0; l < us_per_byte.size(); ++l)
    worst = std::max(worst, (a[l] + b[l]) * us_per_byte[l]);
  return worst;
}

}  // namespace

namespace detail {

/// A pair at or above the threshold, and where its shares are once planned.
struct PairSplit {
  std::size_t position = 0;  ///< src * nranks + dst
  uint64_t bytes = 0;
  int32_t src_slot = 0, dst_slot = 0;
  uint32_t ncandidates = 0;  ///< its candidates, when it has bytes off candidates[0]
  uint32_t begin = 0;        ///< its bytes per candidate: share_bytes[begin .. + ncandidates)
  bool off_default = false;  ///< some bytes off candidates[0]
};

}  // namespace detail

/// A plan without its listing: the shares of the pairs off their default path, and the loads.
struct Planner::Solution {
  using Split = detail::PairSplit;
  /// The pairs at or above the threshold (only those off their default path unless every
  /// pair is listed), src-major.
  std::vector<Split> split;
  std::vector<uint64_t> share_bytes;
  std::vector<double> pair_bytes;  ///< per link: every pair's bytes under the plan (no background)
  std::size_t pairs_with_bytes = 0;
  double max_load_us = 0;  ///< under the background it was planned or last judged with
  double direct_max_load_us = 0;
  bool by_class = false;  ///< Plan::by_class
};

/// The plan in force for one demand, and the background it was judged under.
struct Planner::Kept {
  std::shared_ptr<const Demand> demand;
  std::vector<double> background;
  Solution solution;
};

namespace {

/// compute()'s buffers, kept from one plan to the next (per thread): a planner that plans
/// again touches no fresh memory but for the plan it keeps and the one it returns.
struct ComputeScratch {
  std::vector<double> fixed, movable, fixed_direct, base, direct;
  std::vector<double> slot_out, slot_in, host_out, host_in;
  std::vector<detail::PairSplit> big;
  std::vector<detail::SplitPair> pairs;
  detail::SplitOutput out;
};

ComputeScratch& compute_scratch() {
  thread_local ComputeScratch scratch;
  return scratch;
}

/// The plan by class (docs/balancer.md, "The plan by class"): where the table is symmetric
/// by host (detail::Folding), there is no background load and a pair's bytes depend only on
/// its ranks' places on their hosts and on whether the hosts are the same, the pairs
/// equivalent by that symmetry share one plan. The classes are planned by the split solver as
/// the pairs of the folded problem, and a class's bytes are dealt back to its pairs so that
/// every host sees the same loads. The answer is kept only when its real maximum load, over
/// every link, is within kCertified of the proven lower bound (and below the direct plan's);
/// otherwise the general planner runs. Buffers per thread.
struct ClassScratch {
  std::vector<uint32_t> class_of;     ///< (same host, i, j) -> class, or kNone
  std::vector<uint32_t> class_key;    ///< per class: (same host, i, j)
  std::vector<uint64_t> class_bytes;  ///< per class: the folded pair's bytes
  std::vector<int32_t> out_index;     ///< per class: its index in `out`, -1 on its default path
  std::vector<double> base, direct;   ///< per folded link
  std::vector<uint64_t> mine;         ///< one pair's shares
  std::vector<uint64_t> shares;       ///< the moved pairs' shares, in order
  std::vector<std::pair<std::size_t, detail::PairSplit>> moved;  ///< by index into `big`
  std::vector<detail::SplitPair> pairs;
  detail::SplitOutput out;
};

ClassScratch& class_scratch() {
  thread_local ClassScratch scratch;
  return scratch;
}

constexpr uint32_t kNone = detail::Folding::kNone;

/// Appends to `f.arena` the view of `set` over folded links (the same candidates and flags).
void fold_view(const detail::CandidateView set, detail::Folding& f,
               std::vector<uint32_t>& united) {
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

/// Fills `f` for `st`'s table (symmetric stays false where the table is not). A template:
/// PathTable::State is the Planner's to name.
template <typename State>
void fold(State& st, detail::Folding& f) {
  const topo::Topology& t = *st.topology;
  const std::size_t nlinks = t.links().size();
  const std::size_t nhosts = st.hosts.size();
  const std::size_t n = st.rank_slot.size();
  if (nhosts < 2 || st.slot_gpu.size() != n || n % nhosts != 0) return;
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
  std::vector<double> gbps;
  std::vector<uint32_t> count;
  for (std::size_t h = 0; h < nhosts; ++h) {
    const auto& g = st.hosts[h];
    if (g.to_whole.size() != local_links || g.graph.nodes().size() != first.graph.nodes().size())
      return;
    for (std::size_t v = 0; v < g.graph.nodes().size(); ++v)
      if (g.graph.nodes()[v].kind != first.graph.nodes()[v].kind) return;
    for (std::size_t l = 0; l < local_links; ++l) {
      const topo::Link& mine = g.graph.links()[l];
      const topo::Link& other = first.graph.links()[l];
      if (mine.from != other.from || mine.to != other.to || mine.gbps != other.gbps) return;
      f.folded[g.to_whole[l]] = static_cast<uint32_t>(l);
    }
  }
  for (std::size_t l = 0; l < local_links; ++l) gbps.push_back(first.graph.links()[l].gbps);
  count.assign(local_links, static_cast<uint32_t>(nhosts));
  f.per_host_link.assign(local_links, 1);
  // A link between a host and an outside node (a rail switch) folds by (its node on the
  // host, the outside node, the way); one between outside nodes is its own.
  std::unordered_map<uint64_t, uint32_t> external;
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
      const uint64_t key = uint64_t{st.local_of[inside]} << 33 | uint64_t{outside} << 1 |
                           (hf >= 0 ? 1u : 0u);
      auto [it, added] = external.emplace(key, next);
      const uint64_t host = static_cast<uint64_t>(hf >= 0 ? hf : ht);
      if (!folded_host.insert(uint64_t{it->second} << 32 | host).second) return;
      if (!added) {
        if (gbps[it->second] != link.gbps) return;
        ++count[it->second];
        f.folded[l] = it->second;
        continue;
      }
    }
    gbps.push_back(link.gbps);
    count.push_back(1);
    f.per_host_link.push_back(hf >= 0 || ht >= 0 ? 1 : 0);
    f.folded[l] = next;
  }
  f.us_per_byte.resize(gbps.size());
  for (std::size_t o = 0; o < gbps.size(); ++o) {
    if ((f.per_host_link[o] && count[o] != nhosts) || !(gbps[o] > 0)) return;
    // A folded link stands for one link of each host (a host's pairs of a class load it); a
    // link outside the hosts carries every host's.
    f.us_per_byte[o] = (f.per_host_link[o] ? 1.0 : static_cast<double>(nhosts)) / (gbps[o] * 1e3);
  }
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
  f.hosts = nhosts;
  f.per_host = k;
  f.symmetric = true;
}

}  // namespace

uint64_t Demand::hash() const {
  // Four lanes a word at a time (a matrix of a thousand ranks is 8 MB), then folded.
  uint64_t lane[4] = {kFnv1aOffset, kFnv1aOffset + 1, kFnv1aOffset + 2, kFnv1aOffset + 3};
  for (std::size_t i = 0; i < bytes.size(); ++i) lane[i & 3] = mix64(lane[i & 3] ^ bytes[i]);
  uint64_t h = fnv1a_u64(static_cast<uint64_t>(nranks));
  for (uint64_t v : lane) h = fnv1a_u64(v, h);
  return mix64(h);
}

StatusOr<Demand> demand_from_json(std::string_view text, std::string_view where) {
  const std::string w(where);
  if (text.size() > (64u << 20)) return Status::error(w + ": larger than 64 MiB");
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::error(w + ": not a JSON object");
  auto ranks = j.find("ranks");
  if (ranks == j.end() || !ranks->is_number_integer())
    return Status::error(w + ": \"ranks\" must be an integer");
  const int64_t n = ranks->get<int64_t>();
  if (n < 1 || n > 4096) return Status::error(w + ": \"ranks\" must be 1 ... 4096, got " +
                                              std::to_string(n));
  auto rows = j.find("bytes");
  if (rows == j.end() || !rows->is_array() || rows->size() != static_cast<std::size_t>(n))
    return Status::error(w + ": \"bytes\" must be an array of " + std::to_string(n) + " rows");
  Demand d;
  d.nranks = static_cast<int32_t>(n);
  d.bytes.reserve(static_cast<std::size_t>(n * n));
  for (int64_t s = 0; s < n; ++s) {
    const auto& row = (*rows)[static_cast<std::size_t>(s)];
    if (!row.is_array() || row.size() != static_cast<std::size_t>(n))
      return Status::error(w + ": bytes[" + std::to_string(s) + "] must have " +
                           std::to_string(n) + " entries");
    for (int64_t t = 0; t < n; ++t) {
      const auto& v = row[static_cast<std::size_t>(t)];
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
        return Status::error(w + ": bytes[" + std::to_string(s) + "][" + std::to_string(t) +
                             "] must be a non-negative integer");
      const uint64_t b = v.get<uint64_t>();
      if (b > (uint64_t{1} << 50))
        return Status::error(w + ": bytes[" + std::to_string(s) + "][" + std::to_string(t) +
                             "] is larger than 2^50");
      d.bytes.push_back(b);
    }
  }
  return d;
}

double max_load_us(const topo::Topology& t, std::span<const double> link_bytes) {
  double worst = 0;
  for (std::size_t l = 0; l < link_bytes.size() && l < t.links().size(); ++l)
    worst = std::max(worst, us(link_bytes[l], t.links()[l].gbps));
  return worst;
}

StatusOr<PlannerOptions> PlannerOptions::from_environment() {
  PlannerOptions o;
  if (const char* v = std::getenv("EFCCL_BALANCE_MIN_BYTES"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*v == '-' || end == v || *end != '\0' || n > (uint64_t{1} << 50))
      return Status::error(std::string("EFCCL_BALANCE_MIN_BYTES='") + v +
                           "' is not a byte count from 0 to 2^50");
    o.min_split_bytes = n;
  }
  if (const char* v = std::getenv("EFCCL_BALANCE_HYSTERESIS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const double h = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(h >= 0 && h < 1))
      return Status::error(std::string("EFCCL_BALANCE_HYSTERESIS='") + v +
                           "' is not a fraction from 0 to below 1");
    o.hysteresis = h;
  }
  return o;
}

Planner::Planner(std::shared_ptr<const PathTable> table, PlannerOptions options)
    : table_(std::move(table)), options_(options) {
  // Pieces of 1 byte ... 2^40 bytes, 1 ... 4096 a pair: the placement's loop stays bounded.
  options_.piece_bytes = std::clamp<uint64_t>(options_.piece_bytes, 1, uint64_t{1} << 40);
  options_.max_pieces = std::clamp<uint32_t>(options_.max_pieces, 1, 4096);
  options_.iterations = std::clamp(options_.iterations, 0, 4096);
}


StatusOr<Planner::Solution> Planner::compute(const Demand& demand,
                                             std::span<const double> background) const {
  const PathTable& table = *table_;
  PathTable::State& st = *table.state_;
  const topo::Topology& t = table.topology();
  const std::size_t nlinks = t.links().size();
  if (demand.nranks != table.nranks())
    return Status::error("the demand has " + std::to_string(demand.nranks) +
                         " ranks; the plan's placement has " + std::to_string(table.nranks()));
  const std::size_t n = static_cast<std::size_t>(demand.nranks);
  if (demand.bytes.size() != n * n) return Status::error("the demand matrix is not nranks x nranks");
  for (std::size_t i = 0; i < demand.bytes.size(); ++i)
    if (demand.bytes[i] > kMaxPairBytes)
      return Status::error("the demand of ranks " + std::to_string(i / n) + " -> " +
                           std::to_string(i % n) + " is more than 2^50 bytes");
  if (!background.empty() && background.size() != nlinks)
    return Status::error("the background load has " + std::to_string(background.size()) +
                         " links; the topology has " + std::to_string(nlinks));
  const std::vector<double> bg = base_load(background, nlinks);
  const std::span<const double> inv = st.us_per_byte;
  ComputeScratch& w = compute_scratch();
  Solution sol;
  // Every pair: onto its default path (the base load if it stays there), into the cuts. The
  // pairs at or above the threshold, in order, in `big`.
  std::vector<double>& fixed = w.fixed;
  std::vector<double>& movable = w.movable;
  fixed.assign(nlinks, 0.0);
  movable.assign(nlinks, 0.0);
  w.slot_out.assign(st.slot_gpu.size(), 0.0);
  w.slot_in.assign(st.slot_gpu.size(), 0.0);
  w.host_out.assign(st.hosts.size(), 0.0);
  w.host_in.assign(st.hosts.size(), 0.0);
  std::vector<Solution::Split>& big = w.big;
  big.clear();
  const auto error_of = [&](std::size_t s, std::size_t d, int32_t a, int32_t b) {
    auto set = st.full_set(a, b);
    return Status::error("ranks " + std::to_string(s) + " -> " + std::to_string(d) + ": " +
                         (set ? std::string("no path") : set.status().message()));
  };
  for (std::size_t s = 0; s < n; ++s) {
    const int32_t a = st.rank_slot[s];
    const detail::Row& row = *st.row(a);
    const uint64_t* demand_row = demand.bytes.data() + s * n;
    for (std::size_t d = 0; d < n; ++d) {
      const uint64_t bytes = demand_row[d];
      if (bytes == 0) continue;
      ++sol.pairs_with_bytes;
      const int32_t b = st.rank_slot[d];
      if (!row.reachable[static_cast<std::size_t>(b)]) return error_of(s, d, a, b);
      const double v = static_cast<double>(bytes);
      const bool small = bytes < options_.min_split_bytes;
      std::vector<double>& load = small ? fixed : movable;
      for (LinkIndex l : row.default_links(b)) load[l] += v;
      if (!small) big.push_back({s * n + d, bytes, a, b, 0, 0, false});
      if (a == b) continue;
      w.slot_out[static_cast<std::size_t>(a)] += v;
      w.slot_in[static_cast<std::size_t>(b)] += v;
      const int32_t ha = st.slot_host[static_cast<std::size_t>(a)];
      const int32_t hb = st.slot_host[static_cast<std::size_t>(b)];
      if (ha != hb) {
        w.host_out[static_cast<std::size_t>(ha)] += v;
        w.host_in[static_cast<std::size_t>(hb)] += v;
      }
    }
  }
  sol.direct_max_load_us = 0;
  std::vector<double>& fixed_direct = w.fixed_direct;  // every pair on its default path
  fixed_direct.resize(nlinks);
  for (std::size_t l = 0; l < nlinks; ++l) {
    fixed_direct[l] = fixed[l] + movable[l];
    sol.direct_max_load_us = std::max(sol.direct_max_load_us, (bg[l] + fixed_direct[l]) * inv[l]);
  }
  // A lower bound on any plan's maximum: the load that cannot move, and what must cross the
  // links out of / into each GPU and each host.
  double bound = 0;
  for (std::size_t l = 0; l < nlinks; ++l) bound = std::max(bound, (bg[l] + fixed[l]) * inv[l]);
  const auto cut = [&](const std::vector<double>& crossing, const std::vector<LinkIndex>& links,
                       const std::vector<uint32_t>& begin, const std::vector<double>& gbps) {
    for (std::size_t i = 0; i < crossing.size(); ++i) {
      if (crossing[i] <= 0 || !(gbps[i] > 0)) continue;
      double bytes = crossing[i];
      for (uint32_t k = begin[i]; k < begin[i + 1]; ++k) bytes += bg[links[k]];
      bound = std::max(bound, us(bytes, gbps[i]));
    }
  };
  cut(w.slot_out, st.slot_out_links, st.slot_out_begin, st.slot_out_gbps);
  cut(w.slot_in, st.slot_in_links, st.slot_in_begin, st.slot_in_gbps);
  cut(w.host_out, st.host_out_links, st.host_out_begin, st.host_out_gbps);
  cut(w.host_in, st.host_in_links, st.host_in_begin, st.host_in_gbps);
  // Every pair on its default path when that is provably good enough (uniform traffic on a
  // symmetric machine); else the solver, which asks for candidates only where it needs them.
  std::vector<double> load = fixed_direct;  // becomes every pair's bytes under the plan
  const bool balance = !big.empty() && sol.direct_max_load_us > bound * (1 + kCertified);
  // A symmetric machine and demand: one plan per class of equivalent pairs, kept when it is
  // provably within kCertified; else the general way.
  if (balance && options_.by_class) {
    sol.by_class = plan_by_class(demand, bg, fixed, bound, sol.direct_max_load_us, big,
                                 sol.split, sol.share_bytes, load);
    if (!sol.by_class) load = fixed_direct;
  }
  if (balance && !sol.by_class) {
    w.base.resize(nlinks);
    w.direct.resize(nlinks);
    for (std::size_t l = 0; l < nlinks; ++l) {
      w.direct[l] = bg[l] + load[l];
      w.base[l] = w.direct[l] - movable[l];
    }
    w.pairs.resize(big.size());
    for (std::size_t i = 0; i < big.size(); ++i)
      w.pairs[i] = {big[i].bytes, st.row(big[i].src_slot)->default_links(big[i].dst_slot)};
    detail::SplitInput in;
    in.us_per_byte = inv;
    in.base = w.base;
    in.direct = w.direct;
    in.lower_bound_us = bound;
    in.pairs = w.pairs;
    in.candidates = [&](uint32_t i) -> StatusOr<detail::CandidateView> {
      const Solution::Split& sp = big[i];
      auto view = st.full_view(sp.src_slot, sp.dst_slot);
      if (!view) return error_of(sp.position / n, sp.position % n, sp.src_slot, sp.dst_slot);
      return view;
    };
    in.piece_bytes = options_.piece_bytes;
    in.max_pieces = options_.max_pieces;
    in.hop_penalty_us = options_.hop_penalty_us;
    in.max_sweeps = options_.iterations;
    if (Status s = detail::split(in, w.out); !s) return s;
    // The pairs off their default path: off it, onto their shares.
    for (std::size_t k = 0; k < w.out.pairs.size(); ++k) {
      Solution::Split& sp = big[w.out.pairs[k]];
      const detail::CandidateView view = w.out.views[k];
      sp.ncandidates = view.size();
      sp.begin = static_cast<uint32_t>(sol.share_bytes.size());
      sp.off_default = true;
      sol.share_bytes.insert(sol.share_bytes.end(), w.out.bytes.begin() + w.out.begin[k],
                             w.out.bytes.begin() + w.out.begin[k] + view.size());
      const double bytes = static_cast<double>(sp.bytes);
      for (LinkIndex l : view.links_of(0)) load[l] -= bytes;
      for (uint32_t c = 0; c < view.size(); ++c)
        if (const uint64_t share = sol.share_bytes[sp.begin + c]; share > 0)
          for (LinkIndex l : view.links_of(c)) load[l] += static_cast<double>(share);
    }
  }
  sol.max_load_us = max_us(inv, bg, load);
  if (sol.max_load_us >= sol.direct_max_load_us) {
    // Balancing did not help (uniform traffic, rounding): every pair on its default path.
    sol.share_bytes.clear();
    sol.split.clear();
    sol.by_class = false;
    for (Solution::Split& sp : big) sp.off_default = false;
    load = fixed_direct;
    sol.max_load_us = sol.direct_max_load_us;
  }
  // Kept: the pairs a listing shows with their candidates (all at or above the threshold when
  // every pair is listed; else those off their default path).
  if (options_.list_direct_pairs) {
    sol.split = big;
  } else if (!sol.by_class) {  // by class: listed already
    sol.split.reserve(static_cast<std::size_t>(std::count_if(
        big.begin(), big.end(), [](const Solution::Split& sp) { return sp.off_default; })));
    for (const Solution::Split& sp : big)
      if (sp.off_default) sol.split.push_back(sp);
  }
  sol.pair_bytes = std::move(load);
  return sol;
}

/// The plan by class of `demand` (see ClassScratch): true when kept, then `big`'s pairs off
/// their default path have their candidate counts and shares (in `share_bytes`), `moved`
/// lists them in order and `load` is every pair's bytes under the plan; false (`big`,
/// `moved`, `share_bytes` untouched, `load` spoilt) when the symmetry does not hold or the
/// answer is not provably within kCertified.
bool Planner::plan_by_class(const Demand& demand, std::span<const double> bg,
                            std::span<const double> fixed, double bound, double direct_max_us,
                            std::vector<detail::PairSplit>& big,
                            std::vector<detail::PairSplit>& moved,
                            std::vector<uint64_t>& share_bytes, std::vector<double>& load) const {
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
  if (std::any_of(bg.begin(), bg.end(), [](double b) { return b != 0; })) return false;
  const std::size_t n = static_cast<std::size_t>(demand.nranks);
  const std::size_t nhosts = f->hosts, k = f->per_host;
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
  // The classes: (same host?, i, j) with bytes at or above the threshold, each a pair of the
  // folded problem; a class of pairs on two hosts carries the bytes of one host's pairs to
  // the others (nhosts - 1), which the folded links of one host see.
  ClassScratch& w = class_scratch();
  w.class_of.assign(2 * k * k, kNone);
  w.class_key.clear();
  w.class_bytes.clear();
  for (std::size_t key = 0; key < 2 * k * k; ++key) {
    const std::size_t same = key / (k * k), i = key / k % k, j = key % k;
    const uint64_t b = bytes[i * n + (same ? j : k + j)];
    if (b == 0 || b < options_.min_split_bytes) continue;
    if (f->view_at[key] == kNone) return false;  // the general planner names the error
    w.class_of[key] = static_cast<uint32_t>(w.class_key.size());
    w.class_key.push_back(static_cast<uint32_t>(key));
    // Above 2^53 bytes the solver's doubles are inexact: the general planner takes it.
    if (!same && b > (uint64_t{1} << 53) / (nhosts - 1)) return false;
    w.class_bytes.push_back(same ? b : b * (nhosts - 1));
  }
  const std::size_t nclasses = w.class_key.size();
  if (nclasses == 0) return false;
  const auto view_of = [&](uint32_t c) {
    return detail::CandidateView{f->arena.data() + f->view_at[w.class_key[c]]};
  };
  const std::size_t nfolded = f->us_per_byte.size();
  w.base.assign(nfolded, 0.0);
  for (LinkIndex l = 0; l < fixed.size(); ++l) {
    const uint32_t o = f->folded[l];
    const double b = f->per_host_link[o] ? fixed[l] : fixed[l] / static_cast<double>(nhosts);
    w.base[o] = std::max(w.base[o], b);
  }
  w.direct = w.base;
  w.pairs.resize(nclasses);
  for (uint32_t c = 0; c < nclasses; ++c) {
    w.pairs[c] = {w.class_bytes[c], view_of(c).links_of(0)};
    for (uint32_t o : view_of(c).links_of(0)) w.direct[o] += static_cast<double>(w.class_bytes[c]);
  }
  detail::SplitInput in;
  in.us_per_byte = f->us_per_byte;
  in.base = w.base;
  in.direct = w.direct;
  in.lower_bound_us = bound;  // the folded problem's optimum is no lower than the whole one's
  in.pairs = w.pairs;
  in.candidates = [&](uint32_t c) -> StatusOr<detail::CandidateView> { return view_of(c); };
  in.piece_bytes = options_.piece_bytes;
  in.max_pieces = options_.max_pieces;
  in.hop_penalty_us = options_.hop_penalty_us;
  in.max_sweeps = options_.iterations;
  if (!detail::split(in, w.out) || w.out.pairs.empty()) return false;
  w.out_index.assign(nclasses, -1);
  for (std::size_t x = 0; x < w.out.pairs.size(); ++x) {  // shares add up, or no pair's would
    w.out_index[w.out.pairs[x]] = static_cast<int32_t>(x);
    uint64_t sum = 0;
    for (uint32_t c = 0; c < w.out.views[x].size(); ++c) sum += w.out.bytes[w.out.begin[x] + c];
    if (sum != w.class_bytes[w.out.pairs[x]]) return false;
  }
  // A pair cut where its class's shares meet keeps the general planner's granularity: every
  // share but its largest a multiple of 1/64 of a piece (nearest), the largest the rest.
  const uint64_t grain = std::max<uint64_t>(1, options_.piece_bytes / 64);
  // Back to the pairs. A class's shares, candidate by candidate, laid end to end; the pair
  // (h, i) -> (h + t, j) takes the t-th stretch of one pair's bytes (t = 1 ... nhosts - 1),
  // so every host sends and receives each stretch once: the same loads on every host. Most
  // pairs fall within one candidate's shares and go there whole.
  std::vector<uint64_t>& mine = w.mine;
  w.moved.clear();
  std::vector<uint64_t>& shares_of_moved = w.shares;  // share_bytes once kept
  shares_of_moved.clear();
  const auto reject = []() { return false; };
  std::size_t s = 0, row_begin = 0;  // big is src-major: s = position / n, without dividing
  for (std::size_t p = 0; p < big.size(); ++p) {
    const detail::PairSplit& sp = big[p];
    while (sp.position >= row_begin + n) {
      ++s;
      row_begin += n;
    }
    const std::size_t d = sp.position - row_begin;
    const std::size_t hs = static_cast<std::size_t>(st.slot_host[s]);
    const std::size_t hd = static_cast<std::size_t>(st.slot_host[d]);
    const std::size_t i = s - hs * k, j = d - hd * k;
    const uint32_t c = w.class_of[((hs == hd ? 1 : 0) * k + i) * k + j];
    if (c == kNone) return reject();  // not expected: the demand is symmetric
    const int32_t x = w.out_index[c];
    if (x < 0) continue;
    const uint32_t nc = w.out.views[static_cast<std::size_t>(x)].size();
    const uint64_t* shares = w.out.bytes.data() + w.out.begin[static_cast<std::size_t>(x)];
    const uint64_t stretch = hs == hd ? 0 : (hd > hs ? hd - hs : hd + nhosts - hs) - 1;
    const uint64_t lo = stretch * sp.bytes, hi = lo + sp.bytes;
    mine.assign(nc, 0);
    uint64_t at = 0;
    for (uint32_t cand = 0; cand < nc && at < hi; ++cand) {
      const uint64_t from = std::max(at, lo), to = std::min(at + shares[cand], hi);
      if (to > from) mine[cand] = to - from;
      at += shares[cand];
    }
    const auto largest = std::max_element(mine.begin(), mine.end());
    if (*largest != sp.bytes) {  // cut: every share but the largest in grains, it the rest
      uint64_t rest = sp.bytes;
      for (auto it = mine.begin(); it != mine.end(); ++it)
        if (it != largest) rest -= (*it = std::min(rest, (*it + grain / 2) / grain * grain));
      *largest = rest;
    }
    if (mine[0] == sp.bytes) continue;  // all on its default path
    detail::PairSplit split = sp;
    split.ncandidates = nc;
    split.begin = static_cast<uint32_t>(shares_of_moved.size());
    split.off_default = true;
    shares_of_moved.insert(shares_of_moved.end(), mine.begin(), mine.end());
    for (LinkIndex l : st.row(sp.src_slot)->default_links(sp.dst_slot))  // read in order
      load[l] -= static_cast<double>(sp.bytes);
    w.moved.emplace_back(p, split);
  }
  // The moved pairs' own candidates, their views fetched ahead: at a thousand ranks they are
  // hundreds of thousands of blocks spread over the table, a cache miss each otherwise.
  const std::size_t nmoved = w.moved.size();
  const auto view_of_moved = [&](std::size_t m) {
    const detail::PairSplit& sp = w.moved[m].second;
    return st.full_view(sp.src_slot, sp.dst_slot);
  };
  constexpr std::size_t kAhead = 8;
  for (std::size_t m = 0; m < std::min(nmoved, kAhead); ++m)
    if (auto v = view_of_moved(m)) __builtin_prefetch(v->v);
  for (std::size_t m = 0; m < nmoved; ++m) {
    if (m + kAhead < nmoved)
      if (auto v = view_of_moved(m + kAhead)) __builtin_prefetch(v->v);
    if (m + kAhead / 2 < nmoved)
      if (auto v = view_of_moved(m + kAhead / 2)) {
        // The header is in cache by now: the rest of the block.
        const uint32_t words = v->v[3 + 2 * v->size()];
        for (uint32_t at = 16; at < words; at += 16) __builtin_prefetch(v->v + at);
      }
    const detail::PairSplit& split = w.moved[m].second;
    auto view = view_of_moved(m);
    if (!view || view->size() != split.ncandidates) return reject();
    const uint64_t* mine_shares = shares_of_moved.data() + split.begin;
    for (uint32_t cand = 0; cand < split.ncandidates; ++cand)
      if (mine_shares[cand] > 0)
        for (LinkIndex l : view->links_of(cand)) load[l] += static_cast<double>(mine_shares[cand]);
  }
  // Kept only when provably within kCertified of the optimum, on the real links.
  double worst = 0;
  for (std::size_t l = 0; l < load.size(); ++l)
    worst = std::max(worst, (bg[l] + load[l]) * st.us_per_byte[l]);
  if (!(worst <= bound * (1 + kCertified)) || !(worst < direct_max_us)) return reject();
  moved.clear();
  moved.reserve(w.moved.size());
  for (auto& [p, split] : w.moved) {
    big[p] = split;
    moved.push_back(split);
  }
  share_bytes.assign(shares_of_moved.begin(), shares_of_moved.end());
  return true;
}

StatusOr<Plan> Planner::materialize(const Solution& sol, const Demand& demand,
                                    std::span<const double> background) const {
  PathTable::State& st = *table_->state_;
  Plan plan;
  plan.min_split_bytes = options_.min_split_bytes;
  plan.lists_direct_pairs = options_.list_direct_pairs;
  plan.max_load_us = sol.max_load_us;
  plan.direct_max_load_us = sol.direct_max_load_us;
  plan.by_class = sol.by_class;
  plan.link_bytes = base_load(background, sol.pair_bytes.size());
  for (std::size_t l = 0; l < plan.link_bytes.size(); ++l) plan.link_bytes[l] += sol.pair_bytes[l];
  const std::size_t n = static_cast<std::size_t>(demand.nranks);
  // A pair's candidates, owned through the table, which keeps every set it made for its
  // lifetime: one count for the whole plan, hot in cache (a set's own count is a cache miss a
  // pair when a plan lists hundreds of thousands).
  const auto candidates_of = [&](const detail::CandidateSet* set) {
    return std::shared_ptr<const std::vector<Candidate>>(table_, &set->candidates);
  };
  // A pair the planner may split: its shares, or all on candidates[0].
  const auto split_pair = [&](const Solution::Split& sp) -> StatusOr<PairPlan> {
    PairPlan p;
    p.src = static_cast<int32_t>(sp.position / n);
    p.dst = static_cast<int32_t>(sp.position % n);
    p.bytes = sp.bytes;
    auto set = st.full_set(sp.src_slot, sp.dst_slot);
    if (!set) return set.status();
    p.candidates = candidates_of(*set);
    if (!sp.off_default) {
      p.paths.push_back({0, sp.bytes});
      return p;
    }
    for (uint32_t c = 0; c < sp.ncandidates; ++c)
      if (const uint64_t bytes = sol.share_bytes[sp.begin + c]; bytes > 0) p.paths.push_back({c, bytes});
    return p;
  };
  if (!options_.list_direct_pairs) {
    plan.pairs.reserve(sol.split.size());
    for (const Solution::Split& sp : sol.split) {
      if (!sp.off_default) continue;
      auto p = split_pair(sp);
      if (!p) return p.status();
      plan.pairs.push_back(std::move(*p));
    }
    return plan;
  }
  plan.pairs.reserve(sol.pairs_with_bytes);
  std::size_t next = 0;
  for (std::size_t s = 0; s < n; ++s) {
    const int32_t a = st.rank_slot[s];
    for (std::size_t d = 0; d < n; ++d) {
      const uint64_t bytes = demand.bytes[s * n + d];
      if (bytes == 0) continue;
      if (next < sol.split.size() && sol.split[next].position == s * n + d) {
        auto p = split_pair(sol.split[next++]);
        if (!p) return p.status();
        plan.pairs.push_back(std::move(*p));
        continue;
      }
      auto set = st.default_set(a, st.rank_slot[d]);
      if (!set) return set.status();
      PairPlan& p = plan.pairs.emplace_back();
      p.src = static_cast<int32_t>(s);
      p.dst = static_cast<int32_t>(d);
      p.bytes = bytes;
      p.candidates = candidates_of(*set);
      p.paths.push_back({0, bytes});
    }
  }
  return plan;
}

StatusOr<Plan> Planner::plan(const Demand& demand, std::span<const double> background) {
  const uint64_t key = demand.hash();
  auto it = last_.find(key);
  if (it != last_.end() && (it->second->demand->nranks != demand.nranks ||
                            it->second->demand->bytes != demand.bytes)) {
    last_.erase(it);  // another demand with the same hash: not this one's plan
    it = last_.end();
  }
  if (it != last_.end() && std::equal(background.begin(), background.end(),
                                      it->second->background.begin(),
                                      it->second->background.end()))
    return materialize(it->second->solution, demand, background);  // judged under this load
  auto fresh = compute(demand, background);
  if (!fresh) return fresh.status();
  auto entry = std::make_shared<Kept>();
  entry->background.assign(background.begin(), background.end());
  if (it != last_.end()) {
    // The plan in force, under today's background.
    const Kept& kept = *it->second;
    entry->demand = kept.demand;
    entry->solution = kept.solution;
    Solution& s = entry->solution;
    const std::vector<double> bg = base_load(background, s.pair_bytes.size());
    s.max_load_us = max_us(table_->state_->us_per_byte, bg, s.pair_bytes);
    s.direct_max_load_us = fresh->direct_max_load_us;
    if (fresh->max_load_us < s.max_load_us * (1 - options_.hysteresis))
      entry->solution = std::move(*fresh);
  } else {
    entry->demand = std::make_shared<const Demand>(demand);
    entry->solution = std::move(*fresh);
    if (last_.size() >= kMaxCachedPlans) last_.clear();
  }
  last_[key] = entry;
  return materialize(entry->solution, demand, background);
}

}  // namespace efccl::balance
