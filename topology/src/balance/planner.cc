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
#include <utility>

#include "efccl/common/hash.h"
#include "planner_internal.h"
#include "split_solver.h"

namespace efccl::balance {
namespace {

constexpr std::size_t kMaxCachedPlans = 256;
constexpr uint64_t kMaxPairBytes = uint64_t{1} << 50;
using detail::kCertified;
using detail::us;

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
  // A symmetric machine and demand with no background: one plan per class of equivalent
  // pairs, kept when it is provably within kCertified; else the general way.
  if (options_.by_class && std::all_of(bg.begin(), bg.end(), [](double b) { return b == 0; })) {
    Solution by_class;
    if (plan_by_class(demand, by_class)) return by_class;
  }
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
  if (balance) {
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
    for (Solution::Split& sp : big) sp.off_default = false;
    load = fixed_direct;
    sol.max_load_us = sol.direct_max_load_us;
  }
  // Kept: the pairs a listing shows with their candidates (all at or above the threshold when
  // every pair is listed; else those off their default path).
  if (options_.list_direct_pairs) {
    sol.split = big;
  } else {
    sol.split.reserve(static_cast<std::size_t>(std::count_if(
        big.begin(), big.end(), [](const Solution::Split& sp) { return sp.off_default; })));
    for (const Solution::Split& sp : big)
      if (sp.off_default) sol.split.push_back(sp);
  }
  sol.pair_bytes = std::move(load);
  return sol;
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
  if (sol.classes) {  // by class: listed lazily, as read
    plan.pairs = PairList(sol.classes);
    return plan;
  }
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
  std::vector<PairPlan> pairs;
  if (!options_.list_direct_pairs) {
    pairs.reserve(sol.split.size());
    for (const Solution::Split& sp : sol.split) {
      if (!sp.off_default) continue;
      auto p = split_pair(sp);
      if (!p) return p.status();
      pairs.push_back(std::move(*p));
    }
    plan.pairs = std::move(pairs);
    return plan;
  }
  pairs.reserve(sol.pairs_with_bytes);
  std::size_t next = 0;
  for (std::size_t s = 0; s < n; ++s) {
    const int32_t a = st.rank_slot[s];
    for (std::size_t d = 0; d < n; ++d) {
      const uint64_t bytes = demand.bytes[s * n + d];
      if (bytes == 0) continue;
      if (next < sol.split.size() && sol.split[next].position == s * n + d) {
        auto p = split_pair(sol.split[next++]);
        if (!p) return p.status();
        pairs.push_back(std::move(*p));
        continue;
      }
      auto set = st.default_set(a, st.rank_slot[d]);
      if (!set) return set.status();
      PairPlan& p = pairs.emplace_back();
      p.src = static_cast<int32_t>(s);
      p.dst = static_cast<int32_t>(d);
      p.bytes = bytes;
      p.candidates = candidates_of(*set);
      p.paths.push_back({0, bytes});
    }
  }
  plan.pairs = std::move(pairs);
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
