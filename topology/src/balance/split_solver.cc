// The planner's numeric core (split_solver.h; docs/balancer.md, "The method").
//
// 1. The core: the pairs whose default path crosses a link that, with every pair on its
//    default path, is above the limit (the proven lower bound plus kCertified). Only they are
//    placed; every other pair stays on its default path, part of the load outside.
// 2. Only links that could reach the lower bound matter: a link whose load, were every core
//    pair that may cross it to put all its bytes there, stays under the bound is left out. A
//    pair with a candidate clear of the remaining links goes there whole (it costs the maximum
//    nothing); a pair left with one useful candidate goes there.
// 3. Greedy: each pair's bytes in pieces, largest pair first, round-robin; each piece to the
//    candidate whose busiest link, with the piece added, is lightest (the bottleneck metric of
//    pipelined paths) plus the hop penalty. Done if every link is within the limit; else the
//    pairs of the outside crossing a link above it join the core, and again.
// 4. When the core stops growing short of the limit, every pair becomes free, from where the
//    greedy left them: block-coordinate descent on a smoothed maximum of the link loads,
//    sum exp(beta * load / max), beta sharpened over the sweeps: pair by pair, bytes move from
//    the costliest used candidate (cost: the gradient) to the cheapest, by a Newton step on the
//    links the move touches. The same weights prove lower bounds (LP duality: for weights
//    y >= 0, sum y * fixed load + sum over pairs of bytes * cheapest weighted path, over sum
//    y); the descent stops once the plan is within kCertified of the best of them.
// 5. Shares become whole pieces (largest remainders), then while the busiest link carries a
//    piece that another candidate of its pair takes below that load, it moves.
// Every loop runs in one fixed order and the exponential is plain arithmetic, so equal inputs
// give equal bits everywhere.
#include "split_solver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <limits>
static bool g_trace = std::getenv("SPLIT_TRACE") != nullptr;

namespace efccl::balance::detail {
namespace {

/// A plan provably within this fraction of the optimum is final.
constexpr double kCertified = 0.01;
/// Pieces per pair in the greedy start.
/// The greedy's work, in link visits, and its pieces per pair (whatever that work allows).
static const std::size_t kGreedyVisits = std::getenv("GV") ? atoi(std::getenv("GV")) : 16384;
constexpr std::size_t kGreedyPiecesMin = 2;
static const std::size_t kGreedyPiecesMax = std::getenv("GP") ? atoi(std::getenv("GP")) : 32;
/// Moves per pair per sweep of the descent.
static const int kMovesPerVisit = std::getenv("MV") ? atoi(std::getenv("MV")) : 2;
/// Newton steps per move.
constexpr int kNewtonSteps = 2;
/// Sharpness of the smoothed maximum, from the first sweep to the last.
static const double kBetaFirst = std::getenv("B0") ? atof(std::getenv("B0")) : 0.5;
static const double kBetaLast = std::getenv("B1") ? atof(std::getenv("B1")) : 512;
/// Sharpness of the weights that prove lower bounds.
static const double kBetaBound = std::getenv("BB") ? atof(std::getenv("BB")) : 256;
/// Moves of the final refinement, at most, beyond 4 per pair.
constexpr std::size_t kRefineMoves = 64;

/// e^x by range reduction and a polynomial: only + and *, so the same bits on every machine
/// (libm's exp may differ between versions); relative error below 1e-9, 0 below e^-700.
inline double exp_fixed(double x) {
  if (!(x > -700.0)) return 0.0;
  if (x > 700.0) x = 700.0;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const double n = (x * 1.4426950408889634 + kRound) - kRound;
  const double r = (x - n * 0.693147180369123816490) - n * 1.90821492927058770002e-10;
  const double p =
      1 + r * (1 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 +
          r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880)))))))));
  const int64_t bits = (static_cast<int64_t>(n) + 1023) << 52;
  double scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// The pairs to place, over the links that can matter (local numbering).
struct Problem {
  std::vector<double> inv;            ///< per link: microseconds per byte
  std::vector<double> base;           ///< per link: bytes that stay
  std::vector<LinkIndex> global;      ///< per link: the topology's index
  std::vector<double> bytes;          ///< per pair
  std::vector<uint32_t> member;       ///< per pair: its index in SplitInput::pairs
  std::vector<uint32_t> cand_begin;   ///< pair p's candidates: [cand_begin[p], cand_begin[p+1])
  std::vector<uint32_t> cand_index;   ///< per candidate: its index in the pair's set
  std::vector<uint32_t> cand_pair;    ///< per candidate: its pair
  std::vector<uint32_t> link_begin;   ///< candidate c's links: [link_begin[c], link_begin[c+1])
  std::vector<uint32_t> links;
  std::vector<double> penalty_us;     ///< per candidate: the hop penalty
  std::size_t nlinks() const { return inv.size(); }
  std::size_t npairs() const { return bytes.size(); }
};

/// Bytes per candidate of the input pairs that have been placed: pair p's candidate c at
/// x[offset[p] + c], with its candidates in set[p]; offset[p] == kUnplaced for the others.
struct Placement {
  static constexpr uint32_t kUnplaced = ~uint32_t{0};
  std::vector<uint32_t> offset;
  std::vector<const CandidateSet*> set;
  std::vector<double> x;
  double* of(uint32_t p) { return x.data() + offset[p]; }
};

double max_us(const Problem& pb, const std::vector<double>& load) {
  double worst = 0;
  for (std::size_t l = 0; l < pb.nlinks(); ++l) worst = std::max(worst, load[l] * pb.inv[l]);
  return worst;
}

/// The smoothed maximum's weights of `load`: weight[l] = exp(beta * (u_l / umax - 1)) and
/// cost[l] = weight[l] * inv[l] (a byte's marginal cost on l).
void weigh(const Problem& pb, const std::vector<double>& load, double beta, double umax,
           std::vector<double>& weight, std::vector<double>& cost) {
  const double k = beta / umax;
  for (std::size_t l = 0; l < pb.nlinks(); ++l) {
    weight[l] = exp_fixed(k * load[l] * pb.inv[l] - beta);
    cost[l] = weight[l] * pb.inv[l];
  }
}

double path_cost(const Problem& pb, uint32_t c, const std::vector<double>& cost) {
  double s = 0;
  for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k) s += cost[pb.links[k]];
  return s;
}

/// The LP dual's value at link weights `weight` (cost = weight * inv): a lower bound on every
/// plan's maximum load, microseconds.
double dual_bound(const Problem& pb, const std::vector<double>& weight,
                  const std::vector<double>& cost) {
  double total = 0, value = 0;
  for (std::size_t l = 0; l < pb.nlinks(); ++l) {
    total += weight[l];
    value += cost[l] * pb.base[l];
  }
  for (std::size_t p = 0; p < pb.npairs(); ++p) {
    double cheapest = std::numeric_limits<double>::infinity();
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c)
      cheapest = std::min(cheapest, path_cost(pb, c, cost));
    value += cheapest * pb.bytes[p];
  }
  return total > 0 ? value / total : 0;
}

double bound_at(const Problem& pb, const std::vector<double>& load, std::vector<double>& weight,
                std::vector<double>& cost) {
  const double umax = max_us(pb, load);
  if (!(umax > 0)) return 0;
  weigh(pb, load, kBetaBound, umax, weight, cost);
  return dual_bound(pb, weight, cost);
}

void add_path(const Problem& pb, uint32_t c, double bytes, std::vector<double>& load) {
  for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k) load[pb.links[k]] += bytes;
}

/// Step 3: each pair's bytes in pieces, largest pair first, round-robin.
void greedy(const Problem& pb, uint32_t pieces, std::vector<double>& x, std::vector<double>& load) {
  std::vector<uint32_t> order(pb.npairs());
  for (uint32_t p = 0; p < order.size(); ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return pb.bytes[a] > pb.bytes[b]; });
  for (uint32_t round = 0; round < pieces; ++round)
    for (uint32_t p : order) {
      const double piece = pb.bytes[p] / pieces;
      uint32_t chosen = pb.cand_begin[p];
      double chosen_cost = std::numeric_limits<double>::infinity();
      for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
        double worst = 0;
        for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k) {
          const uint32_t l = pb.links[k];
          worst = std::max(worst, (load[l] + piece) * pb.inv[l]);
        }
        if (worst + pb.penalty_us[c] < chosen_cost) {
          chosen_cost = worst + pb.penalty_us[c];
          chosen = c;
        }
      }
      x[chosen] += piece;
      add_path(pb, chosen, piece, load);
    }
}

bool contains(const Problem& pb, uint32_t c, uint32_t l) {
  for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k)
    if (pb.links[k] == l) return true;
  return false;
}

/// Step 4. Returns the best lower bound it proved.
double descend(const Problem& pb, int sweeps, double known_bound, std::vector<double>& x,
               std::vector<double>& load) {
  const std::size_t nl = pb.nlinks();
  std::vector<double> weight(nl), cost(nl);
  std::vector<uint32_t> minus, plus;
  double bound = known_bound;
  for (int sweep = 0; sweep < sweeps; ++sweep) {
    const double umax = max_us(pb, load);
    if (!(umax > 0)) break;
    const double beta =
        kBetaFirst * std::pow(kBetaLast / kBetaFirst,
                              static_cast<double>(sweep) / std::max(1, sweeps - 1));
    const double k = beta / umax;
    weigh(pb, load, beta, umax, weight, cost);
    const auto reweigh = [&](uint32_t l) {
      weight[l] = exp_fixed(k * load[l] * pb.inv[l] - beta);
      cost[l] = weight[l] * pb.inv[l];
    };
    for (std::size_t p = 0; p < pb.npairs(); ++p) {
      for (int visit = 0; visit < kMovesPerVisit; ++visit) {
        uint32_t best = 0, worst = 0;
        double best_cost = std::numeric_limits<double>::infinity(), worst_cost = -1;
        for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
          const double v = path_cost(pb, c, cost);
          if (v < best_cost) {
            best_cost = v;
            best = c;
          }
          if (x[c] > 0 && v > worst_cost) {
            worst_cost = v;
            worst = c;
          }
        }
        if (worst_cost < 0 || best == worst) break;
        minus.clear();
        plus.clear();
        for (uint32_t i = pb.link_begin[worst]; i < pb.link_begin[worst + 1]; ++i)
          if (!contains(pb, best, pb.links[i])) minus.push_back(pb.links[i]);
        for (uint32_t i = pb.link_begin[best]; i < pb.link_begin[best + 1]; ++i)
          if (!contains(pb, worst, pb.links[i])) plus.push_back(pb.links[i]);
        // f(d): the smoothed maximum over the links the move touches, d bytes moved; convex.
        // Its derivatives at 0 come from the weights in hand.
        double g1 = 0, g2 = 0, f0 = 0;
        for (uint32_t l : minus) {
          const double q = k * pb.inv[l];
          f0 += weight[l];
          g1 -= q * weight[l];
          g2 += q * q * weight[l];
        }
        for (uint32_t l : plus) {
          const double q = k * pb.inv[l];
          f0 += weight[l];
          g1 += q * weight[l];
          g2 += q * q * weight[l];
        }
        if (!(g1 < 0) || !(g2 > 0)) break;
        const double share = x[worst];
        double d = std::min(share, -g1 / g2), fd = 0;
        for (int step = 0; step < kNewtonSteps; ++step) {
          fd = g1 = g2 = 0;
          for (uint32_t l : minus) {
            const double q = k * pb.inv[l];
            const double e = exp_fixed(q * (load[l] - d) - beta);
            fd += e;
            g1 -= q * e;
            g2 += q * q * e;
          }
          for (uint32_t l : plus) {
            const double q = k * pb.inv[l];
            const double e = exp_fixed(q * (load[l] + d) - beta);
            fd += e;
            g1 += q * e;
            g2 += q * q * e;
          }
          if (step + 1 == kNewtonSteps || !(g2 > 0)) break;
          const double next = std::clamp(d - g1 / g2, 0.0, share);
          if (std::fabs(next - d) <= share * 1e-6) break;
          d = next;
        }
        if (!(d > 0) || !(fd < f0)) break;
        x[worst] -= d;
        x[best] += d;
        for (uint32_t l : minus) {
          load[l] -= d;
          reweigh(l);
        }
        for (uint32_t l : plus) {
          load[l] += d;
          reweigh(l);
        }
      }
    }
    // The weights of the loads now prove a bound; stop once the plan is within reach of it.
    if (beta >= kBetaBound / 8 || sweep + 1 == sweeps) {
      bound = std::max(bound, bound_at(pb, load, weight, cost));
      if (g_trace) fprintf(stderr, "  sweep %d beta %.1f max %.2f bound %.2f\n", sweep, beta, max_us(pb, load), bound);
      if (max_us(pb, load) <= bound * (1 + kCertified)) break;
    }
  }
  return bound;
}

/// Step 5: whole pieces, then the busiest link relieved piece by piece.
void round_and_refine(const Problem& pb, const SplitInput& in, double bound,
                      const std::vector<double>& x, std::vector<uint64_t>& units,
                      std::vector<uint32_t>& remainder_at) {
  const double unit = static_cast<double>(in.piece_bytes);
  std::vector<double> load = pb.base;
  std::vector<std::pair<double, uint32_t>> fractions;
  for (std::size_t p = 0; p < pb.npairs(); ++p) {
    const uint64_t bytes = in.pairs[pb.member[p]].bytes;
    const uint64_t whole = bytes / in.piece_bytes;
    uint64_t assigned = 0;
    fractions.clear();
    uint32_t largest = pb.cand_begin[p];
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
      const double q = std::max(0.0, x[c]) / unit;
      units[c] = std::min<uint64_t>(static_cast<uint64_t>(q), whole);
      assigned += units[c];
      fractions.push_back({q - static_cast<double>(units[c]), c});
      if (x[c] > x[largest]) largest = c;
    }
    // Largest remainders first (then the lower candidate); drift the other way takes units
    // from the smallest.
    std::stable_sort(fractions.begin(), fractions.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (std::size_t i = 0; assigned < whole; i = (i + 1) % fractions.size(), ++assigned)
      ++units[fractions[i].second];
    for (std::size_t i = fractions.size(); assigned > whole;)
      if (i = (i + fractions.size() - 1) % fractions.size(); units[fractions[i].second] > 0) {
        --units[fractions[i].second];
        --assigned;
      }
    remainder_at[p] = largest;
    const double rest = static_cast<double>(bytes - whole * in.piece_bytes);
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c)
      add_path(pb, c, static_cast<double>(units[c]) * unit + (c == largest ? rest : 0.0), load);
  }
  if (g_trace) fprintf(stderr, "  rounded max %.2f bound %.2f\n", max_us(pb, load), bound);
  if (max_us(pb, load) <= bound * (1 + kCertified)) return;
  // Which candidates cross each link.
  std::vector<uint32_t> user_begin(pb.nlinks() + 1, 0), users(pb.links.size());
  for (uint32_t l : pb.links) ++user_begin[l + 1];
  for (std::size_t l = 0; l < pb.nlinks(); ++l) user_begin[l + 1] += user_begin[l];
  {
    std::vector<uint32_t> fill(user_begin.begin(), user_begin.end() - 1);
    for (uint32_t c = 0; c + 1 < pb.link_begin.size(); ++c)
      for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k) users[fill[pb.links[k]]++] = c;
  }
  const std::size_t max_moves = kRefineMoves + 4 * pb.npairs();
  for (std::size_t move = 0; move < max_moves; ++move) {
    uint32_t hot = 0;
    double hot_us = -1;
    for (uint32_t l = 0; l < pb.nlinks(); ++l)
      if (load[l] * pb.inv[l] > hot_us) {
        hot_us = load[l] * pb.inv[l];
        hot = l;
      }
    bool moved = false;
    for (uint32_t i = user_begin[hot]; i < user_begin[hot + 1] && !moved; ++i) {
      const uint32_t from = users[i];
      if (units[from] == 0) continue;
      const uint32_t p = pb.cand_pair[from];
      uint32_t to = from;
      double to_cost = std::numeric_limits<double>::infinity();
      for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
        if (c == from || contains(pb, c, hot)) continue;
        double worst = 0;
        for (uint32_t k = pb.link_begin[c]; k < pb.link_begin[c + 1]; ++k) {
          const uint32_t l = pb.links[k];
          worst = std::max(worst, (load[l] + unit) * pb.inv[l]);
        }
        if (worst < hot_us * (1 - 1e-9) && worst + pb.penalty_us[c] < to_cost) {
          to_cost = worst + pb.penalty_us[c];
          to = c;
        }
      }
      if (to == from) continue;
      --units[from];
      ++units[to];
      add_path(pb, from, -unit, load);
      add_path(pb, to, unit, load);
      moved = true;
    }
    if (!moved) { if (g_trace) fprintf(stderr, "  refine stopped after %zu moves max %.2f\n", move, max_us(pb, load)); break; }
  }
}

/// The problem over `members` (indices into in.pairs), everything else being `outside` (bytes
/// per link of the topology). Members with a candidate clear of the links that can matter, or
/// with one useful candidate, are placed there (in `placement`) and become base load; the
/// others' placement is zeroed unless `keep`.
StatusOr<Problem> build(const SplitInput& in, std::span<const uint32_t> members,
                        std::span<const double> outside, bool keep, Placement& placement) {
  const std::size_t nlinks = in.us_per_byte.size();
  std::vector<double> reach(outside.begin(), outside.end());
  for (uint32_t m : members) {
    if (placement.offset[m] == Placement::kUnplaced) {
      auto set = in.candidates(m);
      if (!set) return set.status();
      placement.set[m] = *set;
      placement.offset[m] = static_cast<uint32_t>(placement.x.size());
      placement.x.resize(placement.x.size() + (*set)->size(), 0.0);
    }
    for (LinkIndex l : placement.set[m]->union_links)
      reach[l] += static_cast<double>(in.pairs[m].bytes);
  }
  Problem pb;
  std::vector<int32_t> local(nlinks, -1);
  for (LinkIndex l = 0; l < nlinks; ++l)
    if (reach[l] * in.us_per_byte[l] > in.lower_bound_us) {
      local[l] = static_cast<int32_t>(pb.global.size());
      pb.global.push_back(l);
      pb.inv.push_back(in.us_per_byte[l]);
      pb.base.push_back(outside[l]);
    }
  pb.cand_begin.push_back(0);
  pb.link_begin.push_back(0);
  for (uint32_t m : members) {
    const CandidateSet& set = *placement.set[m];
    const double bytes = static_cast<double>(in.pairs[m].bytes);
    double* x = placement.of(m);
    const auto place = [&](uint32_t c) {
      std::fill(x, x + set.size(), 0.0);
      x[c] = bytes;
      for (LinkIndex l : set.links_of(c))
        if (local[l] >= 0) pb.base[static_cast<std::size_t>(local[l])] += bytes;
    };
    // Clear of every link that matters: the shortest useful candidate.
    if (std::none_of(set.union_links.begin(), set.union_links.end(),
                     [&](LinkIndex l) { return local[l] >= 0; })) {
      place(set.shortest_useful);
      continue;
    }
    const uint32_t first_cand = static_cast<uint32_t>(pb.cand_index.size());
    const uint32_t first_link = static_cast<uint32_t>(pb.links.size());
    int32_t clear = -1;
    for (uint32_t c = 0; c < set.size(); ++c) {
      if (!set.useful[c]) continue;
      const uint32_t before = static_cast<uint32_t>(pb.links.size());
      for (LinkIndex l : set.links_of(c))
        if (local[l] >= 0) pb.links.push_back(static_cast<uint32_t>(local[l]));
      if (pb.links.size() == before &&
          (clear < 0 || set.extra_links[c] < set.extra_links[static_cast<uint32_t>(clear)]))
        clear = static_cast<int32_t>(c);
      pb.cand_index.push_back(c);
      pb.link_begin.push_back(static_cast<uint32_t>(pb.links.size()));
      pb.penalty_us.push_back(set.extra_links[c] * in.hop_penalty_us);
    }
    const uint32_t useful = static_cast<uint32_t>(pb.cand_index.size()) - first_cand;
    if (clear >= 0 || useful == 1) {
      const uint32_t c = clear >= 0 ? static_cast<uint32_t>(clear) : pb.cand_index[first_cand];
      pb.cand_index.resize(first_cand);
      pb.link_begin.resize(first_cand + 1);
      pb.penalty_us.resize(first_cand);
      pb.links.resize(first_link);
      place(c);
      continue;
    }
    if (!keep) std::fill(x, x + set.size(), 0.0);
    for (uint32_t c = first_cand; c < pb.cand_index.size(); ++c)
      pb.cand_pair.push_back(static_cast<uint32_t>(pb.bytes.size()));
    pb.bytes.push_back(bytes);
    pb.member.push_back(m);
    pb.cand_begin.push_back(static_cast<uint32_t>(pb.cand_index.size()));
  }
  return pb;
}

/// Greedy rounds for a problem of this size: the work of about kGreedyVisits link visits.
uint32_t greedy_pieces(const Problem& pb, uint32_t max_pieces) {
  const std::size_t per_round = std::max<std::size_t>(1, pb.links.size());
  const std::size_t pieces = std::clamp<std::size_t>(kGreedyVisits / per_round, kGreedyPiecesMin,
                                                     kGreedyPiecesMax);
  return static_cast<uint32_t>(std::min<std::size_t>(pieces, std::max<uint32_t>(max_pieces, 1)));
}

}  // namespace

StatusOr<SplitOutput> split(const SplitInput& in) {
  const std::size_t nlinks = in.us_per_byte.size();
  const uint32_t npairs = static_cast<uint32_t>(in.pairs.size());
  const double limit = in.lower_bound_us * (1 + kCertified);
  Placement placement;
  placement.offset.assign(npairs, Placement::kUnplaced);
  placement.set.assign(npairs, nullptr);
  // 1. The core: pairs whose default path crosses a link above the limit.
  std::vector<uint8_t> over(nlinks, 0), core(npairs, 0);
  for (LinkIndex l = 0; l < nlinks; ++l) over[l] = in.direct[l] * in.us_per_byte[l] > limit ? 1 : 0;
  std::vector<double> outside(in.direct.begin(), in.direct.end());
  std::vector<uint32_t> members;
  const auto grow = [&]() {
    bool grew = false;
    for (uint32_t p = 0; p < npairs; ++p) {
      if (core[p]) continue;
      const auto path = in.pairs[p].path;
      if (std::none_of(path.begin(), path.end(), [&](LinkIndex l) { return over[l] != 0; })) continue;
      core[p] = 1;
      members.push_back(p);
      grew = true;
      for (LinkIndex l : path) outside[l] -= static_cast<double>(in.pairs[p].bytes);
    }
    std::sort(members.begin(), members.end());
    return grew;
  };
  grow();
  Problem pb;
  std::vector<double> x, load;
  const auto to_placement = [&]() {
    for (std::size_t c = 0; c < x.size(); ++c)
      placement.of(pb.member[pb.cand_pair[c]])[pb.cand_index[c]] = x[c];
  };
  bool certified = false;
  // 2-3. Greedy over the core until every link is within the limit or the core stops growing.
  for (bool grew = !members.empty(); grew;) {
    auto built = build(in, members, outside, /*keep=*/false, placement);
    if (!built) return built.status();
    pb = std::move(*built);
    x.assign(pb.cand_index.size(), 0.0);
    load = pb.base;
    greedy(pb, greedy_pieces(pb, in.max_pieces), x, load);
    if (g_trace) fprintf(stderr, "core: links %zu/%zu pairs %zu/%zu members %zu cands %zu limit %.2f greedy max %.2f\n", pb.nlinks(), nlinks, pb.npairs(), (size_t)npairs, members.size(), pb.cand_index.size(), limit, max_us(pb, load));
    if (max_us(pb, load) <= limit) {
      certified = true;
      break;
    }
    std::fill(over.begin(), over.end(), 0);
    for (std::size_t l = 0; l < pb.nlinks(); ++l)
      over[pb.global[l]] = load[l] * pb.inv[l] > limit ? 1 : 0;
    to_placement();
    grew = grow();
  }
  double bound = in.lower_bound_us;
  if (!certified) {
    // 4. Every pair free, from where the greedy left the core and the rest on their default.
    members.resize(npairs);
    for (uint32_t p = 0; p < npairs; ++p) members[p] = p;
    std::vector<uint32_t> outside_core;
    for (uint32_t p = 0; p < npairs; ++p)
      if (!core[p]) outside_core.push_back(p);
    std::vector<double> none(nlinks, 0.0);
    if (auto fetched = build(in, outside_core, none, /*keep=*/false, placement); !fetched)
      return fetched.status();  // (only to give them sets and places)
    for (uint32_t p : outside_core) {
      const CandidateSet& set = *placement.set[p];
      double* px = placement.of(p);
      std::fill(px, px + set.size(), 0.0);
      px[set.useful[0] ? 0 : set.shortest_useful] = static_cast<double>(in.pairs[p].bytes);
    }
    auto built = build(in, members, in.base, /*keep=*/true, placement);
    if (!built) return built.status();
    pb = std::move(*built);
    x.resize(pb.cand_index.size());
    load = pb.base;
    for (std::size_t c = 0; c < x.size(); ++c) {
      x[c] = placement.of(pb.member[pb.cand_pair[c]])[pb.cand_index[c]];
      add_path(pb, static_cast<uint32_t>(c), x[c], load);
    }
    std::vector<double> weight(pb.nlinks()), cost(pb.nlinks());
    bound = std::max(bound, bound_at(pb, load, weight, cost));
    if (g_trace) fprintf(stderr, "full: links %zu/%zu pairs %zu/%zu cands %zu start max %.2f bound %.2f\n", pb.nlinks(), nlinks, pb.npairs(), (size_t)npairs, pb.cand_index.size(), max_us(pb, load), bound);
    if (max_us(pb, load) > bound * (1 + kCertified)) bound = descend(pb, in.max_sweeps, bound, x, load);
  }
  // 5. Whole pieces.
  std::vector<uint64_t> units(x.size(), 0);
  std::vector<uint32_t> remainder_at(pb.npairs(), 0);
  if (pb.npairs() > 0) round_and_refine(pb, in, bound, x, units, remainder_at);
  // The pairs off their default path: the problem's (in whole pieces) and those placed whole
  // elsewhere on the way.
  std::vector<int32_t> in_problem(npairs, -1);
  for (std::size_t p = 0; p < pb.npairs(); ++p) in_problem[pb.member[p]] = static_cast<int32_t>(p);
  SplitOutput out;
  for (uint32_t m = 0; m < npairs; ++m) {
    if (placement.offset[m] == Placement::kUnplaced) continue;
    const CandidateSet& set = *placement.set[m];
    const uint32_t begin = static_cast<uint32_t>(out.bytes.size());
    out.bytes.resize(begin + set.size(), 0);
    const uint64_t bytes = in.pairs[m].bytes;
    if (const int32_t p = in_problem[m]; p >= 0) {
      const uint64_t rest = bytes - bytes / in.piece_bytes * in.piece_bytes;
      for (uint32_t c = pb.cand_begin[static_cast<std::size_t>(p)];
           c < pb.cand_begin[static_cast<std::size_t>(p) + 1]; ++c)
        out.bytes[begin + pb.cand_index[c]] =
            units[c] * in.piece_bytes + (c == remainder_at[static_cast<std::size_t>(p)] ? rest : 0);
    } else if (core[m] || !certified) {
      const double* px = placement.of(m);
      for (uint32_t c = 0; c < set.size(); ++c) out.bytes[begin + c] = static_cast<uint64_t>(px[c]);
    } else {
      out.bytes[begin] = bytes;  // only looked at
    }
    if (out.bytes[begin] == bytes) {  // all on its default path after all
      out.bytes.resize(begin);
      continue;
    }
    out.pairs.push_back(m);
    out.sets.push_back(&set);
    out.begin.push_back(begin);
  }
  return out;
}

}  // namespace efccl::balance::detail
