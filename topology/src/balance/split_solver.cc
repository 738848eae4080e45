// The planner's numeric core (split_solver.h; docs/balancer.md, "The method").
//
// 1. The core: the pairs whose default path crosses a link that, with every pair on its
//    default path, is above the limit (the proven lower bound plus kCertified). Only they are
//    placed; every other pair stays on its default path, part of the load outside.
// 2. Greedy: each core pair's bytes in two pieces, largest pair first, round-robin; each
//    piece to the candidate whose busiest link, with the piece added, is lightest (the
//    bottleneck metric of pipelined paths) plus the hop penalty.
// 3. Levelling: while the busiest link is above the limit, the largest move of one pair's bytes
//    from a candidate crossing it to one that does not, that levels the two. Done if every
//    link ends within the limit; else the pairs outside crossing a link above it join the
//    core, and again from 2.
// 4. When the core stops growing short of the limit, every pair becomes free, from where the
//    greedy left them, over the links that can matter (those that could reach the lower bound
//    were every pair able to cross them to put all its bytes there; a pair with a candidate
//    clear of them goes there whole): block-coordinate descent on a smoothed maximum of the
//    link loads, sum exp(beta * load / max), beta sharpened over the sweeps; pair by pair,
//    bytes move from the costliest used candidate (cost: the gradient) to the cheapest, by a
//    Newton step on the links the move touches. The same weights prove lower bounds (LP
//    duality: for weights y >= 0, sum y * fixed load + sum over pairs of bytes * cheapest
//    weighted path, over sum y); the descent stops once within kCertified of the best.
// 5. Shares become whole pieces (largest remainders), then while the busiest link carries a
//    piece that another candidate of its pair takes below that load, it moves.
// Every loop runs in one fixed order and the exponential is plain arithmetic, so equal inputs
// give equal bits everywhere. Buffers live in a per-thread workspace: a planner that plans
// again touches no fresh memory.
#include "split_solver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace efccl::balance::detail {
namespace {

/// A plan provably within this fraction of the optimum is final.
constexpr double kCertified = 0.01;
/// The greedy's pieces per pair (levelling does the fine work).
constexpr uint32_t kGreedyPieces = 2;
/// Levelling moves, at most, beyond 2 per pair.
constexpr std::size_t kLevelMoves = 32;
/// Moves per pair per sweep of the descent, and Newton steps per move.
constexpr int kMovesPerVisit = 2;
constexpr int kNewtonSteps = 2;
/// Sharpness of the smoothed maximum: kBetaFirst, times kBetaStep each sweep up to kBetaLast
/// (0.5 to 512 over 16 sweeps), then held; and the sharpness of the weights that prove lower
/// bounds. Products of constants, not pow(): the same bits on every machine.
constexpr double kBetaFirst = 0.5;
constexpr double kBetaStep = 1.5874010519681994;  // 2^(2/3)
constexpr double kBetaLast = 512;
constexpr double kBetaBound = 256;
/// Moves of the final refinement, at most, beyond 4 per pair; its finest move, in parts of a
/// piece.
constexpr std::size_t kRefineMoves = 64;
constexpr uint64_t kFinest = 64;

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

/// The pairs to place. Links keep the topology's numbering; a candidate's links are either
/// its set's own (every link) or a copy holding only the links that can matter.
struct Problem {
  std::span<const double> inv;        ///< per link: microseconds per byte
  std::vector<double> base;           ///< per link: bytes that stay
  std::vector<LinkIndex> active;      ///< the links that can be the busiest, ascending
  std::vector<double> bytes;          ///< per pair
  std::vector<uint32_t> member;       ///< per pair: its index in SplitInput::pairs
  std::vector<uint32_t> cand_begin;   ///< pair p's candidates: [cand_begin[p], cand_begin[p+1])
  std::vector<uint32_t> cand_index;   ///< per candidate: its index in the pair's set
  std::vector<uint32_t> cand_pair;    ///< per candidate: its pair
  std::vector<const LinkIndex*> first, last;  ///< per candidate: its links
  std::vector<double> penalty_us;     ///< per candidate: the hop penalty
  std::vector<LinkIndex> own_links;   ///< storage of the filtered candidates' links

  std::size_t npairs() const { return bytes.size(); }
  std::size_t ncandidates() const { return cand_index.size(); }
  void clear() {
    base.clear();
    active.clear();
    bytes.clear();
    member.clear();
    cand_begin.assign(1, 0);
    cand_index.clear();
    cand_pair.clear();
    first.clear();
    last.clear();
    penalty_us.clear();
    own_links.clear();
  }
};

/// Bytes per candidate of the input pairs that have been looked at: pair p's candidate c at
/// x[offset[p] + c], its candidates set[p]; offset[p] == kUnplaced for the others.
struct Placement {
  static constexpr uint32_t kUnplaced = ~uint32_t{0};
  std::vector<uint32_t> offset;
  std::vector<CandidateView> set;
  std::vector<double> x;
  double* of(uint32_t p) { return x.data() + offset[p]; }
};

/// Every buffer of one split, kept from one call to the next (per thread).
struct Workspace {
  Problem pb;
  Placement placement;
  std::vector<double> x, load, outside, reach, weight, cost;
  std::vector<uint8_t> over, core, relevant;
  std::vector<uint32_t> members, order, user_begin, users, fill, minus, plus;
  std::vector<int32_t> in_problem;
  std::vector<uint64_t> share, leftover;
  std::vector<double> fraction;
};

Workspace& workspace() {
  thread_local Workspace w;
  return w;
}

double max_us(const Problem& pb, const std::vector<double>& load) {
  double worst = 0;
  for (LinkIndex l : pb.active) worst = std::max(worst, load[l] * pb.inv[l]);
  return worst;
}

bool contains(const Problem& pb, uint32_t c, LinkIndex l) {
  return std::find(pb.first[c], pb.last[c], l) != pb.last[c];
}

void add_path(const Problem& pb, uint32_t c, double bytes, std::vector<double>& load) {
  for (const LinkIndex* l = pb.first[c]; l != pb.last[c]; ++l) load[*l] += bytes;
}

/// The smoothed maximum's weights of `load` on the active links: weight[l] = exp(beta *
/// (u_l / umax - 1)) and cost[l] = weight[l] * inv[l] (a byte's marginal cost on l).
void weigh(const Problem& pb, const std::vector<double>& load, double beta, double umax,
           std::vector<double>& weight, std::vector<double>& cost) {
  const double k = beta / umax;
  for (LinkIndex l : pb.active) {
    weight[l] = exp_fixed(k * load[l] * pb.inv[l] - beta);
    cost[l] = weight[l] * pb.inv[l];
  }
}

double path_cost(const Problem& pb, uint32_t c, const std::vector<double>& cost) {
  double s = 0;
  for (const LinkIndex* l = pb.first[c]; l != pb.last[c]; ++l) s += cost[*l];
  return s;
}

/// The LP dual's value at the weights of `load` (candidates holding active links only): a
/// lower bound on every plan's maximum load, microseconds.
double bound_at(const Problem& pb, const std::vector<double>& load, std::vector<double>& weight,
                std::vector<double>& cost) {
  const double umax = max_us(pb, load);
  if (!(umax > 0)) return 0;
  weigh(pb, load, kBetaBound, umax, weight, cost);
  double total = 0, value = 0;
  for (LinkIndex l : pb.active) {
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

/// Step 2: each pair's bytes in `pieces` pieces, largest pair first, round-robin.
void greedy(const Problem& pb, uint32_t pieces, std::vector<uint32_t>& order,
            std::vector<double>& x, std::vector<double>& load) {
  order.resize(pb.npairs());
  for (uint32_t p = 0; p < order.size(); ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return pb.bytes[a] > pb.bytes[b]; });
  for (uint32_t round = 0; round < pieces; ++round)
    for (uint32_t p : order) {
      const double piece = pb.bytes[p] / pieces;
      uint32_t chosen = pb.cand_begin[p];
      double chosen_cost = std::numeric_limits<double>::infinity();
      for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
        // The busiest link with the piece, two links at a time (two independent maxima), until
        // it cannot win.
        const double penalty = pb.penalty_us[c];
        double even = 0, odd = 0;
        const LinkIndex* l = pb.first[c];
        for (; l + 1 < pb.last[c] && std::max(even, odd) + penalty < chosen_cost; l += 2) {
          even = std::max(even, (load[l[0]] + piece) * pb.inv[l[0]]);
          odd = std::max(odd, (load[l[1]] + piece) * pb.inv[l[1]]);
        }
        if (l + 1 == pb.last[c]) even = std::max(even, (load[*l] + piece) * pb.inv[*l]);
        const double cost = std::max(even, odd) + penalty;
        if (cost < chosen_cost) {
          chosen_cost = cost;
          chosen = c;
        }
      }
      x[chosen] += piece;
      add_path(pb, chosen, piece, load);
    }
}

/// Which candidates cross each link: users[user_begin[l] .. user_begin[l + 1]).
void index_users(const Problem& pb, std::size_t nlinks, Workspace& w) {
  w.user_begin.assign(nlinks + 1, 0);
  for (uint32_t c = 0; c < pb.ncandidates(); ++c)
    for (const LinkIndex* l = pb.first[c]; l != pb.last[c]; ++l) ++w.user_begin[*l + 1];
  for (std::size_t l = 0; l < nlinks; ++l) w.user_begin[l + 1] += w.user_begin[l];
  w.users.resize(w.user_begin[nlinks]);
  w.fill.assign(w.user_begin.begin(), w.user_begin.end() - 1);
  for (uint32_t c = 0; c < pb.ncandidates(); ++c)
    for (const LinkIndex* l = pb.first[c]; l != pb.last[c]; ++l) w.users[w.fill[*l]++] = c;
}

/// The busiest active link and its load, microseconds.
std::pair<LinkIndex, double> hottest(const Problem& pb, const std::vector<double>& load) {
  LinkIndex hot = 0;
  double hot_us = -1;
  for (LinkIndex l : pb.active)
    if (load[l] * pb.inv[l] > hot_us) {
      hot_us = load[l] * pb.inv[l];
      hot = l;
    }
  return {hot, hot_us};
}

/// Step 3: while the busiest link is above `limit`, the largest move that levels it with
/// another candidate's busiest link. Returns whether every link ended within the limit.
bool level(const Problem& pb, std::size_t nlinks, double limit, Workspace& w) {
  std::vector<double>& x = w.x;
  std::vector<double>& load = w.load;
  if (hottest(pb, load).second <= limit) return true;
  index_users(pb, nlinks, w);
  const std::size_t max_moves = kLevelMoves + 2 * pb.npairs();
  for (std::size_t move = 0; move < max_moves; ++move) {
    const auto [hot, hot_us] = hottest(pb, load);
    if (hot_us <= limit) return true;
    uint32_t best_from = 0, best_to = 0;
    double best = 0;
    for (uint32_t i = w.user_begin[hot]; i < w.user_begin[hot + 1]; ++i) {
      const uint32_t from = w.users[i];
      if (!(x[from] > best)) continue;
      const uint32_t p = pb.cand_pair[from];
      for (uint32_t to = pb.cand_begin[p]; to < pb.cand_begin[p + 1]; ++to) {
        if (to == from || contains(pb, to, hot)) continue;
        // (load_hot - d) / cap_hot = (load_l + d) / cap_l for the first link l of `to` there.
        double d = x[from];
        for (const LinkIndex* l = pb.first[to]; l != pb.last[to] && d > best; ++l)
          d = std::min(d, (hot_us - load[*l] * pb.inv[*l]) / (pb.inv[hot] + pb.inv[*l]));
        if (d > best) {
          best = d;
          best_from = from;
          best_to = to;
        }
      }
    }
    if (!(best > 0)) return false;
    x[best_from] -= best;
    x[best_to] += best;
    add_path(pb, best_from, -best, load);
    add_path(pb, best_to, best, load);
  }
  return hottest(pb, load).second <= limit;
}

/// Step 4. Returns the best lower bound it proved.
double descend(const Problem& pb, int sweeps, double known_bound, Workspace& w) {
  std::vector<double>& x = w.x;
  std::vector<double>& load = w.load;
  std::vector<double>& weight = w.weight;
  std::vector<double>& cost = w.cost;
  double bound = known_bound;
  double beta = kBetaFirst;
  for (int sweep = 0; sweep < sweeps; ++sweep, beta = std::min(kBetaLast, beta * kBetaStep)) {
    const double umax = max_us(pb, load);
    if (!(umax > 0)) break;
    const double k = beta / umax;
    weigh(pb, load, beta, umax, weight, cost);
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
        w.minus.clear();
        w.plus.clear();
        for (const LinkIndex* l = pb.first[worst]; l != pb.last[worst]; ++l)
          if (!contains(pb, best, *l)) w.minus.push_back(*l);
        for (const LinkIndex* l = pb.first[best]; l != pb.last[best]; ++l)
          if (!contains(pb, worst, *l)) w.plus.push_back(*l);
        // f(d): the smoothed maximum over the links the move touches, d bytes moved; convex.
        // Its derivatives at 0 come from the weights in hand.
        double g1 = 0, g2 = 0, f0 = 0;
        for (uint32_t l : w.minus) {
          const double q = k * pb.inv[l];
          f0 += weight[l];
          g1 -= q * weight[l];
          g2 += q * q * weight[l];
        }
        for (uint32_t l : w.plus) {
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
          for (uint32_t l : w.minus) {
            const double q = k * pb.inv[l];
            const double e = exp_fixed(q * (load[l] - d) - beta);
            fd += e;
            g1 -= q * e;
            g2 += q * q * e;
          }
          for (uint32_t l : w.plus) {
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
        const auto reweigh = [&](uint32_t l) {
          weight[l] = exp_fixed(k * load[l] * pb.inv[l] - beta);
          cost[l] = weight[l] * pb.inv[l];
        };
        for (uint32_t l : w.minus) {
          load[l] -= d;
          reweigh(l);
        }
        for (uint32_t l : w.plus) {
          load[l] += d;
          reweigh(l);
        }
      }
    }
    // The weights of the loads now prove a bound; stop once the plan is within reach of it.
    if (beta >= kBetaBound / 8 || sweep + 1 == sweeps) {
      bound = std::max(bound, bound_at(pb, load, weight, cost));
      if (max_us(pb, load) <= bound * (1 + kCertified)) break;
    }
  }
  return bound;
}

/// Step 5: bytes per candidate (w.share). Each share is rounded down to whole pieces; the
/// pieces left over go, one per pair per round, to the candidate with a fractional part whose
/// busiest link takes one best (with coarse pieces the rounding decides much of the plan); a
/// pair's last, partial piece goes with its largest share. Then, while the busiest link is
/// above the certified limit, a piece of a pair crossing it moves to another of its candidates
/// that stays below: a whole piece, else half of one, ..., down to 1/kFinest of one (whole
/// pieces of a small pair can be too coarse to come near the optimum).
void round_and_refine(const Problem& pb, const SplitInput& in, std::size_t nlinks, double bound,
                      Workspace& w) {
  const double unit = static_cast<double>(in.piece_bytes);
  std::vector<double>& load = w.load;
  load = pb.base;
  w.share.assign(pb.ncandidates(), 0);
  w.fraction.assign(pb.ncandidates(), 0.0);
  w.leftover.assign(pb.npairs(), 0);
  for (std::size_t p = 0; p < pb.npairs(); ++p) {
    const uint64_t bytes = in.pairs[pb.member[p]].bytes;
    const uint64_t whole = bytes / in.piece_bytes;
    uint64_t assigned = 0;
    uint32_t largest = pb.cand_begin[p];
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
      const double q = std::max(0.0, w.x[c]) / unit;
      w.share[c] = std::min<uint64_t>(static_cast<uint64_t>(q), whole);
      w.fraction[c] = q - static_cast<double>(w.share[c]);
      assigned += w.share[c];
      if (w.x[c] > w.x[largest]) largest = c;
    }
    // Floating-point drift the other way: back from the smallest fractions.
    while (assigned > whole) {
      uint32_t smallest = pb.cand_begin[p + 1];
      for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c)
        if (w.share[c] > 0 && (smallest == pb.cand_begin[p + 1] || w.fraction[c] < w.fraction[smallest]))
          smallest = c;
      --w.share[smallest];
      --assigned;
    }
    w.leftover[p] = whole - assigned;
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) w.share[c] *= in.piece_bytes;
    w.share[largest] += bytes - whole * in.piece_bytes;
    for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c)
      if (w.share[c] > 0) add_path(pb, c, static_cast<double>(w.share[c]), load);
  }
  for (bool more = true; more;) {
    more = false;
    for (std::size_t p = 0; p < pb.npairs(); ++p) {
      if (w.leftover[p] == 0) continue;
      uint32_t chosen = pb.cand_begin[p + 1];
      double chosen_cost = std::numeric_limits<double>::infinity();
      for (int any = 0; any < 2 && chosen == pb.cand_begin[p + 1]; ++any)
        for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
          if (any == 0 && !(w.fraction[c] > 0)) continue;
          double cost = pb.penalty_us[c];
          for (const LinkIndex* l = pb.first[c]; l != pb.last[c] && cost < chosen_cost; ++l)
            cost = std::max(cost, (load[*l] + unit) * pb.inv[*l] + pb.penalty_us[c]);
          if (cost < chosen_cost) {
            chosen_cost = cost;
            chosen = c;
          }
        }
      w.share[chosen] += in.piece_bytes;
      w.fraction[chosen] = 0;
      add_path(pb, chosen, unit, load);
      more = --w.leftover[p] > 0 || more;
    }
  }
  const double limit = bound * (1 + kCertified);
  if (max_us(pb, load) <= limit) return;
  index_users(pb, nlinks, w);
  const uint64_t finest = std::max<uint64_t>(1, in.piece_bytes / kFinest);
  const std::size_t max_moves = kRefineMoves + 4 * pb.npairs();
  for (std::size_t move = 0; move < max_moves; ++move) {
    const auto [hot, hot_us] = hottest(pb, load);
    if (hot_us <= limit) break;
    bool moved = false;
    for (uint64_t step = in.piece_bytes; step >= finest && !moved; step /= 2) {
      const double amount = static_cast<double>(step);
      for (uint32_t i = w.user_begin[hot]; i < w.user_begin[hot + 1] && !moved; ++i) {
        const uint32_t from = w.users[i];
        if (w.share[from] < step) continue;
        const uint32_t p = pb.cand_pair[from];
        uint32_t to = from;
        double to_cost = std::numeric_limits<double>::infinity();
        for (uint32_t c = pb.cand_begin[p]; c < pb.cand_begin[p + 1]; ++c) {
          if (c == from || contains(pb, c, hot)) continue;
          double worst = 0;
          for (const LinkIndex* l = pb.first[c]; l != pb.last[c]; ++l)
            worst = std::max(worst, (load[*l] + amount) * pb.inv[*l]);
          if (worst < hot_us * (1 - 1e-9) && worst + pb.penalty_us[c] < to_cost) {
            to_cost = worst + pb.penalty_us[c];
            to = c;
          }
        }
        if (to == from) continue;
        w.share[from] -= step;
        w.share[to] += step;
        add_path(pb, from, -amount, load);
        add_path(pb, to, amount, load);
        moved = true;
      }
      if (step == 1) break;
    }
    if (!moved) break;
  }
}

/// Gives `members` their candidate sets and places in `placement`.
Status look_up(const SplitInput& in, std::span<const uint32_t> members, Placement& placement) {
  for (uint32_t m : members) {
    if (placement.offset[m] != Placement::kUnplaced) continue;
    auto set = in.candidates(m);
    if (!set) return set.status();
    placement.set[m] = *set;
    placement.offset[m] = static_cast<uint32_t>(placement.x.size());
    placement.x.resize(placement.x.size() + set->size(), 0.0);
  }
  return Status::ok();
}

/// The problem over `members` (indices into in.pairs, looked up), everything else being
/// `outside` (bytes per link). `filtered`: candidates keep only the links that can matter, and
/// members with a candidate clear of them, or with one useful candidate, are placed there (in
/// the placement) as base load; members keep their placement as the start. Unfiltered: every
/// link, every member free, starting from nothing.
void build(const SplitInput& in, std::span<const uint32_t> members,
           std::span<const double> outside, bool filtered, Workspace& w) {
  const std::size_t nlinks = in.us_per_byte.size();
  Problem& pb = w.pb;
  Placement& placement = w.placement;
  pb.clear();
  pb.inv = in.us_per_byte;
  pb.base.assign(outside.begin(), outside.end());
  w.relevant.assign(nlinks, 1);
  std::size_t total_candidates = 0, total_links = 0;
  for (uint32_t m : members) {
    total_candidates += placement.set[m].size();
    total_links += placement.set[m].total_links();
  }
  if (filtered) {
    w.reach.assign(outside.begin(), outside.end());
    for (uint32_t m : members)
      for (LinkIndex l : placement.set[m].union_links())
        w.reach[l] += static_cast<double>(in.pairs[m].bytes);
    for (LinkIndex l = 0; l < nlinks; ++l)
      w.relevant[l] = w.reach[l] * in.us_per_byte[l] > in.lower_bound_us ? 1 : 0;
    pb.own_links.reserve(total_links);  // pointers into it stay valid
  }
  for (LinkIndex l = 0; l < nlinks; ++l)
    if (w.relevant[l]) pb.active.push_back(l);
  pb.cand_index.reserve(total_candidates);
  pb.first.reserve(total_candidates);
  pb.last.reserve(total_candidates);
  for (uint32_t m : members) {
    const CandidateView set = placement.set[m];
    const double bytes = static_cast<double>(in.pairs[m].bytes);
    double* x = placement.of(m);
    if (!filtered) {
      std::fill(x, x + set.size(), 0.0);
      for (uint32_t c = 0; c < set.size(); ++c) {
        if (!set.useful(c)) continue;
        const auto links = set.links_of(c);
        pb.cand_index.push_back(c);
        pb.cand_pair.push_back(static_cast<uint32_t>(pb.bytes.size()));
        pb.first.push_back(links.data());
        pb.last.push_back(links.data() + links.size());
        pb.penalty_us.push_back(set.extra_links(c) * in.hop_penalty_us);
      }
      pb.bytes.push_back(bytes);
      pb.member.push_back(m);
      pb.cand_begin.push_back(static_cast<uint32_t>(pb.ncandidates()));
      continue;
    }
    const auto place = [&](uint32_t c) {
      std::fill(x, x + set.size(), 0.0);
      x[c] = bytes;
      for (LinkIndex l : set.links_of(c)) pb.base[l] += bytes;
    };
    // Clear of every link that matters: the shortest useful candidate.
    if (std::none_of(set.union_links().begin(), set.union_links().end(),
                     [&](LinkIndex l) { return w.relevant[l] != 0; })) {
      place(set.shortest_useful());
      continue;
    }
    const std::size_t first_cand = pb.ncandidates();
    const std::size_t first_link = pb.own_links.size();
    int32_t clear = -1;
    for (uint32_t c = 0; c < set.size(); ++c) {
      if (!set.useful(c)) continue;
      const std::size_t before = pb.own_links.size();
      for (LinkIndex l : set.links_of(c))
        if (w.relevant[l]) pb.own_links.push_back(l);
      if (pb.own_links.size() == before &&
          (clear < 0 || set.extra_links(c) < set.extra_links(static_cast<uint32_t>(clear))))
        clear = static_cast<int32_t>(c);
      pb.cand_index.push_back(c);
      pb.first.push_back(pb.own_links.data() + before);
      pb.last.push_back(pb.own_links.data() + pb.own_links.size());
      pb.penalty_us.push_back(set.extra_links(c) * in.hop_penalty_us);
    }
    if (clear >= 0 || pb.ncandidates() - first_cand == 1) {
      const uint32_t c = clear >= 0 ? static_cast<uint32_t>(clear) : pb.cand_index[first_cand];
      pb.cand_index.resize(first_cand);
      pb.first.resize(first_cand);
      pb.last.resize(first_cand);
      pb.penalty_us.resize(first_cand);
      pb.own_links.resize(first_link);
      place(c);
      continue;
    }
    for (std::size_t c = first_cand; c < pb.ncandidates(); ++c)
      pb.cand_pair.push_back(static_cast<uint32_t>(pb.bytes.size()));
    pb.bytes.push_back(bytes);
    pb.member.push_back(m);
    pb.cand_begin.push_back(static_cast<uint32_t>(pb.ncandidates()));
  }
}

}  // namespace

Status split(const SplitInput& in, SplitOutput& out) {
  Workspace& w = workspace();
  const std::size_t nlinks = in.us_per_byte.size();
  const uint32_t npairs = static_cast<uint32_t>(in.pairs.size());
  const double limit = in.lower_bound_us * (1 + kCertified);
  Placement& placement = w.placement;
  placement.offset.assign(npairs, Placement::kUnplaced);
  placement.set.assign(npairs, CandidateView{});
  placement.x.clear();
  // 1. The core: pairs whose default path crosses a link above the limit.
  w.over.assign(nlinks, 0);
  w.core.assign(npairs, 0);
  for (LinkIndex l = 0; l < nlinks; ++l)
    w.over[l] = in.direct[l] * in.us_per_byte[l] > limit ? 1 : 0;
  w.outside.assign(in.direct.begin(), in.direct.end());
  w.members.clear();
  const auto grow = [&]() {
    bool grew = false;
    for (uint32_t p = 0; p < npairs; ++p) {
      if (w.core[p]) continue;
      const auto path = in.pairs[p].path;
      if (std::none_of(path.begin(), path.end(), [&](LinkIndex l) { return w.over[l] != 0; }))
        continue;
      w.core[p] = 1;
      w.members.push_back(p);
      grew = true;
      for (LinkIndex l : path) w.outside[l] -= static_cast<double>(in.pairs[p].bytes);
    }
    std::sort(w.members.begin(), w.members.end());
    return grew;
  };
  grow();
  Problem& pb = w.pb;
  pb.clear();
  bool certified = false;
  // 2-3. Greedy and levelling over the core until every link is within the limit or the core
  // stops growing.
  for (bool grew = !w.members.empty(); grew;) {
    if (Status s = look_up(in, w.members, placement); !s) return s;
    build(in, w.members, w.outside, /*filtered=*/false, w);
    w.x.assign(pb.ncandidates(), 0.0);
    w.load = pb.base;
    greedy(pb, std::clamp<uint32_t>(in.max_pieces, 1, kGreedyPieces), w.order, w.x, w.load);
    if (level(pb, nlinks, limit, w)) {
      certified = true;
      break;
    }
    std::fill(w.over.begin(), w.over.end(), 0);
    for (LinkIndex l : pb.active) w.over[l] = w.load[l] * pb.inv[l] > limit ? 1 : 0;
    for (std::size_t c = 0; c < pb.ncandidates(); ++c)
      placement.of(pb.member[pb.cand_pair[c]])[pb.cand_index[c]] = w.x[c];
    grew = grow();
  }
  double bound = in.lower_bound_us;
  if (!certified) {
    // 4. Every pair free, from where the greedy left the core and the rest on their default.
    w.members.resize(npairs);
    for (uint32_t p = 0; p < npairs; ++p) w.members[p] = p;
    if (Status s = look_up(in, w.members, placement); !s) return s;
    for (uint32_t p = 0; p < npairs; ++p) {
      if (w.core[p]) continue;
      const CandidateView set = placement.set[p];
      placement.of(p)[set.useful(0) ? 0 : set.shortest_useful()] =
          static_cast<double>(in.pairs[p].bytes);
    }
    build(in, w.members, in.base, /*filtered=*/true, w);
    w.x.resize(pb.ncandidates());
    w.load = pb.base;
    for (std::size_t c = 0; c < pb.ncandidates(); ++c) {
      w.x[c] = placement.of(pb.member[pb.cand_pair[c]])[pb.cand_index[c]];
      add_path(pb, static_cast<uint32_t>(c), w.x[c], w.load);
    }
    w.weight.assign(nlinks, 0.0);
    w.cost.assign(nlinks, 0.0);
    bound = std::max(bound, bound_at(pb, w.load, w.weight, w.cost));
    if (max_us(pb, w.load) > bound * (1 + kCertified))
      bound = descend(pb, in.max_sweeps, bound, w);
  }
  // 5. Whole pieces.
  if (pb.npairs() > 0) round_and_refine(pb, in, nlinks, bound, w);
  // The pairs off their default path: the problem's (in whole pieces) and those placed whole
  // elsewhere on the way.
  w.in_problem.assign(npairs, -1);
  for (std::size_t p = 0; p < pb.npairs(); ++p) w.in_problem[pb.member[p]] = static_cast<int32_t>(p);
  out.pairs.clear();
  out.views.clear();
  out.begin.clear();
  out.bytes.clear();
  for (uint32_t m = 0; m < npairs; ++m) {
    if (placement.offset[m] == Placement::kUnplaced) continue;
    const CandidateView set = placement.set[m];
    const std::size_t begin = out.bytes.size();
    out.bytes.resize(begin + set.size(), 0);
    const uint64_t bytes = in.pairs[m].bytes;
    if (const int32_t p = w.in_problem[m]; p >= 0) {
      const auto i = static_cast<std::size_t>(p);
      for (uint32_t c = pb.cand_begin[i]; c < pb.cand_begin[i + 1]; ++c)
        out.bytes[begin + pb.cand_index[c]] = w.share[c];
    } else {  // placed whole on one candidate
      const double* px = placement.of(m);
      for (uint32_t c = 0; c < set.size(); ++c) out.bytes[begin + c] = static_cast<uint64_t>(px[c]);
    }
    if (out.bytes[begin] == bytes) {  // all on its default path after all
      out.bytes.resize(begin);
      continue;
    }
    out.pairs.push_back(m);
    out.views.push_back(set);
    out.begin.push_back(static_cast<uint32_t>(begin));
  }
  return Status::ok();
}

}  // namespace efccl::balance::detail
