// The planner (efccl/balance/planner.h; docs/balancer.md gives the method).
//
// 1. Pairs under the threshold, and pairs with one candidate, go on candidates[0]; with the
//    background they are the base load of the links.
// 2. The other pairs are cut into whole pieces and placed round-robin, largest pair first: each
//    piece goes to the candidate whose most loaded link, with the piece added, is lightest (the
//    bottleneck metric of pipelined paths), plus a penalty per link beyond candidates[0]'s.
// 3. Block-coordinate descent, pair by pair, on a smoothed maximum of the link loads (the
//    fractional problem), then shares rounded back to whole pieces.
// 4. Refinement: while the most loaded link carries pieces that another candidate of their pair
//    can take without reaching that load, move them (the moved amount halves when no whole
//    piece fits).
// 5. A plan no better than every pair on candidates[0] is replaced by that.
// Floating-point work happens in one fixed order, so the plan is the same everywhere.
#include "efccl/balance/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "efccl/common/hash.h"

namespace efccl::balance {
namespace {

constexpr std::size_t kMaxCachedPlans = 256;
constexpr uint64_t kMaxPairBytes = uint64_t{1} << 50;

/// Microseconds to carry `bytes` at `gbps`.
double us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

struct BigPair {
  std::size_t plan_index;  ///< into Plan::pairs
  const std::vector<Candidate>* candidates;
  std::vector<double> on;  ///< bytes per candidate
  uint64_t piece = 0;
};

/// The background load per link: finite, non-negative values of `background`, 0 elsewhere.
std::vector<double> base_load(std::span<const double> background, std::size_t nlinks) {
  std::vector<double> load(nlinks, 0.0);
  for (std::size_t l = 0; l < background.size() && l < nlinks; ++l)
    load[l] = std::isfinite(background[l]) && background[l] > 0 ? background[l] : 0.0;
  return load;
}

/// `background` plus every share of `pairs` on its links.
std::vector<double> plan_load(const std::vector<PairPlan>& pairs,
                              std::span<const double> background, std::size_t nlinks) {
  std::vector<double> load = base_load(background, nlinks);
  for (const PairPlan& p : pairs)
    for (const PathShare& s : p.paths)
      for (LinkIndex l : (*p.candidates)[s.candidate].links)
        load[l] += static_cast<double>(s.bytes);
  return load;
}

}  // namespace

uint64_t Demand::hash() const {
  uint64_t h = fnv1a_u64(static_cast<uint64_t>(nranks));
  for (uint64_t b : bytes) h = fnv1a_u64(b, h);
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

StatusOr<Plan> Planner::compute(const Demand& demand, std::span<const double> background) const {
  const topo::Topology& t = table_->topology();
  const std::size_t nlinks = t.links().size();
  if (demand.nranks != table_->nranks())
    return Status::error("the demand has " + std::to_string(demand.nranks) +
                         " ranks; the plan's placement has " + std::to_string(table_->nranks()));
  if (demand.bytes.size() != static_cast<std::size_t>(demand.nranks) * demand.nranks)
    return Status::error("the demand matrix is not nranks x nranks");
  for (std::size_t i = 0; i < demand.bytes.size(); ++i)
    if (demand.bytes[i] > kMaxPairBytes)
      return Status::error("the demand of ranks " + std::to_string(i / demand.nranks) + " -> " +
                           std::to_string(i % demand.nranks) + " is more than 2^50 bytes");
  if (!background.empty() && background.size() != nlinks)
    return Status::error("the background load has " + std::to_string(background.size()) +
                         " links; the topology has " + std::to_string(nlinks));
  Plan plan;
  plan.min_split_bytes = options_.min_split_bytes;
  plan.link_bytes = base_load(background, nlinks);
  std::vector<double> direct = plan.link_bytes;
  std::vector<double>& load = plan.link_bytes;
  std::vector<BigPair> big;
  for (int32_t s = 0; s < demand.nranks; ++s) {
    for (int32_t d = 0; d < demand.nranks; ++d) {
      const uint64_t bytes = demand.at(s, d);
      if (bytes == 0) continue;
      const bool small = bytes < options_.min_split_bytes;
      auto candidates = table_->candidates(s, d, small);
      if (!candidates) return candidates.status();
      PairPlan p;
      p.src = s;
      p.dst = d;
      p.bytes = bytes;
      p.candidates = *candidates;
      for (LinkIndex l : p.candidates->front().links) direct[l] += static_cast<double>(bytes);
      if (small || p.candidates->size() == 1) {
        p.paths.push_back({0, bytes});
        for (LinkIndex l : p.candidates->front().links) load[l] += static_cast<double>(bytes);
      } else {
        BigPair b;
        b.plan_index = plan.pairs.size();
        b.candidates = p.candidates.get();
        b.on.assign(p.candidates->size(), 0.0);
        const uint64_t per = (bytes + options_.max_pieces - 1) / options_.max_pieces;
        b.piece = std::max<uint64_t>(options_.piece_bytes,
                                     (per + options_.piece_bytes - 1) / options_.piece_bytes *
                                         options_.piece_bytes);
        big.push_back(std::move(b));
      }
      plan.pairs.push_back(std::move(p));
    }
  }
  plan.direct_max_load_us = max_load_us(t, direct);
  // Largest first; equal sizes in (src, dst) order, which plan_index already is.
  std::stable_sort(big.begin(), big.end(), [&](const BigPair& x, const BigPair& y) {
    return plan.pairs[x.plan_index].bytes > plan.pairs[y.plan_index].bytes;
  });
  const auto hop_penalty = [&](const BigPair& b, uint32_t c) {
    const double extra = static_cast<double>((*b.candidates)[c].links.size()) -
                         static_cast<double>(b.candidates->front().links.size());
    return extra > 0 ? extra * options_.hop_penalty_us : 0.0;
  };
  /// The candidate of `b` whose busiest link, with `amount` added, is lightest (+ penalty).
  const auto best = [&](const BigPair& b, double amount, uint32_t skip, double* cost) {
    uint32_t chosen = 0;
    double chosen_cost = std::numeric_limits<double>::infinity();
    for (uint32_t c = 0; c < b.candidates->size(); ++c) {
      if (c == skip) continue;
      double worst = 0;
      for (LinkIndex l : (*b.candidates)[c].links)
        worst = std::max(worst, us(load[l] + amount, t.link(l).gbps));
      const double value = worst + hop_penalty(b, c);
      if (value < chosen_cost) {
        chosen_cost = value;
        chosen = c;
      }
    }
    *cost = chosen_cost;
    return chosen;
  };
  // 2. Round-robin placement of pieces.
  std::vector<uint64_t> left(big.size());
  for (std::size_t i = 0; i < big.size(); ++i) left[i] = plan.pairs[big[i].plan_index].bytes;
  for (bool any = true; any;) {
    any = false;
    for (std::size_t i = 0; i < big.size(); ++i) {
      if (left[i] == 0) continue;
      any = true;
      const uint64_t piece = std::min(left[i], big[i].piece);
      double cost = 0;
      const uint32_t c = best(big[i], static_cast<double>(piece), UINT32_MAX, &cost);
      big[i].on[c] += static_cast<double>(piece);
      for (LinkIndex l : (*big[i].candidates)[c].links) load[l] += static_cast<double>(piece);
      left[i] -= piece;
    }
  }
  // 3. Block-coordinate descent on a smoothed maximum (softmax of the link loads, sharpened
  //    over the sweeps): pair by pair, the share on its costliest used candidate moves towards
  //    its cheapest (costs: the smoothed maximum's gradient), by the amount that minimises the
  //    smoothed maximum over the links the move touches (convex: a few Newton steps).
  if (!big.empty()) {
    std::vector<LinkIndex> minus, plus;
    const int sweeps = options_.iterations;
    double previous = std::numeric_limits<double>::infinity();
    for (int sweep = 0; sweep < sweeps; ++sweep) {
      double umax = 0;
      for (LinkIndex l = 0; l < nlinks; ++l) umax = std::max(umax, us(load[l], t.link(l).gbps));
      if (umax <= 0) break;
      // Stop once a sweep (at the sharpest smoothing reached) no longer lowers the maximum.
      if (sweep >= 4 && umax > previous * (1 - 1e-4)) break;
      previous = umax;
      const double beta = 8.0 * std::pow(64.0, static_cast<double>(sweep) / sweeps);
      const auto term = [&](LinkIndex l, double bytes) {
        return std::exp(beta * (us(bytes, t.link(l).gbps) / umax - 1));
      };
      for (BigPair& b : big) {
        uint32_t best_c = 0, worst_c = 0;
        double best_cost = std::numeric_limits<double>::infinity(), worst_cost = -1;
        for (uint32_t c = 0; c < b.candidates->size(); ++c) {
          double cost = 0;
          for (LinkIndex l : (*b.candidates)[c].links) cost += term(l, load[l]) / t.link(l).gbps;
          if (cost < best_cost) {
            best_cost = cost;
            best_c = c;
          }
          if (b.on[c] > 0 && cost > worst_cost) {
            worst_cost = cost;
            worst_c = c;
          }
        }
        if (best_c == worst_c) continue;
        const auto& from = (*b.candidates)[worst_c].links;
        const auto& to = (*b.candidates)[best_c].links;
        minus.clear();
        plus.clear();
        for (LinkIndex l : from)
          if (std::find(to.begin(), to.end(), l) == to.end()) minus.push_back(l);
        for (LinkIndex l : to)
          if (std::find(from.begin(), from.end(), l) == from.end()) plus.push_back(l);
        // f(d) = sum over touched links of exp(beta * u(d) / umax); Newton from d = 0 within
        // [0, share] (f is convex), a few steps.
        const double share = b.on[worst_c];
        const auto f_and_derivatives = [&](double d, double* f1, double* f2) {
          double f = 0, d1 = 0, d2 = 0;
          for (LinkIndex l : minus) {
            const double k = beta / (umax * t.link(l).gbps * 1e3);
            const double e = term(l, load[l] - d);
            f += e;
            d1 -= k * e;
            d2 += k * k * e;
          }
          for (LinkIndex l : plus) {
            const double k = beta / (umax * t.link(l).gbps * 1e3);
            const double e = term(l, load[l] + d);
            f += e;
            d1 += k * e;
            d2 += k * k * e;
          }
          *f1 = d1;
          *f2 = d2;
          return f;
        };
        double d1 = 0, d2 = 0;
        const double f0 = f_and_derivatives(0, &d1, &d2);
        if (!(d1 < 0)) continue;  // moving does not lower the smoothed maximum
        double moved = 0;
        for (int k = 0; k < 6; ++k) {
          double g1 = 0, g2 = 0;
          f_and_derivatives(moved, &g1, &g2);
          if (!(g2 > 0)) break;
          const double next = std::clamp(moved - g1 / g2, 0.0, share);
          if (std::fabs(next - moved) <= share * 1e-6) {
            moved = next;
            break;
          }
          moved = next;
        }
        double g1 = 0, g2 = 0;
        if (!(moved > 0) || !(f_and_derivatives(moved, &g1, &g2) < f0)) continue;
        b.on[worst_c] -= moved;
        b.on[best_c] += moved;
        for (LinkIndex l : minus) load[l] -= moved;
        for (LinkIndex l : plus) load[l] += moved;
      }
    }
    // Back to whole pieces: each share rounded down to a multiple of the piece size, the rest of
    // the pair's bytes to its largest share.
    load = base_load(background, nlinks);
    for (const PairPlan& p : plan.pairs)
      if (p.bytes < options_.min_split_bytes || p.candidates->size() == 1)
        for (LinkIndex l : p.candidates->front().links) load[l] += static_cast<double>(p.bytes);
    for (BigPair& b : big) {
      const double bytes = static_cast<double>(plan.pairs[b.plan_index].bytes);
      const double piece = static_cast<double>(options_.piece_bytes);
      uint32_t largest = 0;
      double sum = 0;
      for (uint32_t c = 0; c < b.on.size(); ++c) {
        if (b.on[c] > b.on[largest]) largest = c;
        b.on[c] = std::floor(std::max(0.0, b.on[c]) / piece) * piece;
        sum += b.on[c];
      }
      b.on[largest] += bytes - sum;
      for (uint32_t c = 0; c < b.on.size(); ++c)
        for (LinkIndex l : (*b.candidates)[c].links) load[l] += b.on[c];
    }
  }
  // 4. Refinement: relieve the busiest link while some piece on it fits elsewhere.
  const std::size_t max_moves = 64 + 64 * big.size();
  for (std::size_t move = 0; move < max_moves && !big.empty(); ++move) {
    LinkIndex hot = 0;
    double hot_us = -1;
    for (LinkIndex l = 0; l < nlinks; ++l)
      if (const double v = us(load[l], t.link(l).gbps); v > hot_us) {
        hot_us = v;
        hot = l;
      }
    bool moved = false;
    for (BigPair& b : big) {
      for (uint32_t c = 0; c < b.candidates->size() && !moved; ++c) {
        if (b.on[c] <= 0) continue;
        const auto& links = (*b.candidates)[c].links;
        if (std::find(links.begin(), links.end(), hot) == links.end()) continue;
        // Try a whole piece, then halves down to 1/64 of one: the smallest move that helps.
        for (double amount = std::min<double>(b.on[c], static_cast<double>(b.piece));
             amount >= static_cast<double>(b.piece) / 64 && !moved; amount /= 2) {
          const double whole = std::floor(amount / static_cast<double>(options_.piece_bytes)) *
                               static_cast<double>(options_.piece_bytes);
          const double step = whole > 0 ? whole : amount;  // keep multiples where possible
          if (step > b.on[c]) continue;
          double cost = 0;
          const uint32_t to = best(b, step, c, &cost);
          // The new home must avoid the hot link and stay below its load, penalty included.
          const auto& to_links = (*b.candidates)[to].links;
          const bool shares_hot = std::find(to_links.begin(), to_links.end(), hot) != to_links.end();
          if (shares_hot || !(cost < hot_us * (1 - 1e-9))) continue;
          b.on[c] -= step;
          b.on[to] += step;
          for (LinkIndex l : links) load[l] -= step;
          for (LinkIndex l : (*b.candidates)[to].links) load[l] += step;
          moved = true;
        }
      }
      if (moved) break;
    }
    if (!moved) break;
  }
  // Shares become whole bytes: pieces are integers, halves of pieces may not be; the pair's
  // remainder goes to its largest share so that the bytes add up exactly.
  for (BigPair& b : big) {
    PairPlan& p = plan.pairs[b.plan_index];
    uint64_t assigned = 0;
    uint32_t largest = 0;
    for (uint32_t c = 0; c < b.on.size(); ++c) {
      if (b.on[c] > b.on[largest]) largest = c;
      const uint64_t bytes = static_cast<uint64_t>(std::llround(std::max(0.0, b.on[c])));
      if (bytes > 0) p.paths.push_back({c, bytes});
      assigned += bytes;
    }
    const int64_t fix = static_cast<int64_t>(p.bytes) - static_cast<int64_t>(assigned);
    auto it = std::find_if(p.paths.begin(), p.paths.end(),
                           [&](const PathShare& s) { return s.candidate == largest; });
    if (it == p.paths.end()) {
      p.paths.push_back({largest, 0});
      it = p.paths.end() - 1;
    }
    it->bytes = static_cast<uint64_t>(static_cast<int64_t>(it->bytes) + fix);
    std::sort(p.paths.begin(), p.paths.end(),
              [](const PathShare& x, const PathShare& y) { return x.candidate < y.candidate; });
  }
  // The loads of the final, integral plan.
  load = plan_load(plan.pairs, background, nlinks);
  plan.max_load_us = max_load_us(t, load);
  if (plan.max_load_us >= plan.direct_max_load_us) {
    // Balancing did not help (uniform traffic, rounding): every pair on its default path.
    for (BigPair& b : big) {
      PairPlan& p = plan.pairs[b.plan_index];
      p.paths.assign(1, PathShare{0, p.bytes});
    }
    plan.link_bytes = direct;
    plan.max_load_us = plan.direct_max_load_us;
  }
  return plan;
}

StatusOr<Plan> Planner::plan(const Demand& demand, std::span<const double> background) {
  auto fresh = compute(demand, background);
  if (!fresh) return fresh;
  const uint64_t key = demand.hash();
  auto it = last_.find(key);
  if (it != last_.end() && it->second.first.bytes != demand.bytes) {
    last_.erase(it);  // another demand with the same hash: not this one's plan
    it = last_.end();
  }
  if (it != last_.end()) {
    // The plan in force, under today's background.
    Plan kept = it->second.second;
    kept.link_bytes = plan_load(kept.pairs, background, kept.link_bytes.size());
    kept.max_load_us = max_load_us(table_->topology(), kept.link_bytes);
    kept.direct_max_load_us = fresh->direct_max_load_us;
    if (!(fresh->max_load_us < kept.max_load_us * (1 - options_.hysteresis))) {
      it->second.second = kept;
      return kept;
    }
  }
  if (last_.size() >= kMaxCachedPlans && it == last_.end()) last_.clear();
  last_[key] = {demand, *fresh};
  return fresh;
}

}  // namespace efccl::balance
