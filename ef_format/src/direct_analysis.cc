// Direct transfers between ranks that address each other's buffers (direct_analysis.h).
#include "efccl/ef/direct_analysis.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "inplace_shift.h"
#include "wait_for_graph.h"

namespace efccl::ef {
namespace {

/// Ranks with more ops than this keep their slots: the checks below compare every pair with
/// every access of its rank (quadratic), and programs this large gain little from it.
constexpr std::size_t kMaxOpsPerRank = 4096;

/// A range of a rank's memory in chunks, after in-place aliasing: output chunks that alias
/// the input are named as input chunks.
struct Region {
  BufferKind buffer = BufferKind::kInput;
  int64_t begin = 0;
  int64_t end = 0;
  bool overlaps(const Region& o) const {
    return buffer == o.buffer && begin < o.end && o.begin < end;
  }
};

/// One read or write of an op. A direct transfer moves it in time: a pushed pop's write of its
/// dst happens when its sender writes (`earlier`), a pulled push's read of its value happens
/// when its receiver reads (`later`). Every pair that may become direct is counted so, whatever
/// the other pairs are decided, so that two pairs judged apart cannot race.
struct Access {
  int32_t tb = 0;
  int32_t op = 0;
  bool write = false;
  Region region;
  std::optional<detail::OpPosition> earlier;  ///< the sender that may write it first
  std::optional<detail::OpPosition> later;    ///< the receiver that may read it last
};

/// Op (rank, tb, op) -> the op at the other end of its pop or push, for the pairs that may be
/// direct.
using Partners = std::map<std::tuple<int32_t, int32_t, int32_t>, detail::OpPosition>;

std::optional<detail::OpPosition> partner_of(const Partners& partners, std::size_t rank,
                                             std::size_t tb, std::size_t op) {
  const auto it = partners.find({static_cast<int32_t>(rank), static_cast<int32_t>(tb),
                                 static_cast<int32_t>(op)});
  if (it == partners.end()) return std::nullopt;
  return it->second;
}

/// Every op's memory accesses on one rank.
class RankAccesses {
 public:
  /// `pushers`: a pop's sender, `pullers`: a push's receiver, where the pair may be direct.
  RankAccesses(const Program& p, std::size_t rank, bool inplace, const Partners& pushers,
               const Partners& pullers) {
    if (inplace) shift_ = detail::output_to_input_shift(p, rank);
    const auto& tbs = p.ranks[rank].threadblocks;
    for (std::size_t t = 0; t < tbs.size(); ++t)
      for (std::size_t o = 0; o < tbs[t].ops.size(); ++o) {
        const Op& op = tbs[t].ops[o];
        const auto add = [&](const BufferRef& ref, bool write) -> Access& {
          list_.push_back({static_cast<int32_t>(t), static_cast<int32_t>(o), write,
                           region(ref, op.count), std::nullopt, std::nullopt});
          return list_.back();
        };
        const bool push_target = op.code == OpCode::kRecv || op.code == OpCode::kRecvCopySend;
        const bool holds_value =
            op.code == OpCode::kRecvCopySend || op.code == OpCode::kRecvReduceCopySend;
        if (op.src && op_reads_src(op.code)) {
          Access& a = add(*op.src, false);
          if (op.code == OpCode::kSend) a.later = partner_of(pullers, rank, t, o);
        }
        if (op.dst && op.code == OpCode::kReduce) add(*op.dst, false);
        if (op.dst && op_writes_dst(op.code)) {
          Access& a = add(*op.dst, true);
          if (push_target) a.earlier = partner_of(pushers, rank, t, o);
        }
        if (op.dst && holds_value) {  // its receiver may read the value from its dst
          const auto puller = partner_of(pullers, rank, t, o);
          if (puller) add(*op.dst, false).later = puller;
        }
      }
  }

  Region region(const BufferRef& ref, int64_t count) const {
    Region r{ref.buffer, ref.offset, ref.offset + count};
    if (ref.buffer == BufferKind::kOutput && shift_) {
      r.buffer = BufferKind::kInput;
      r.begin += *shift_;
      r.end += *shift_;
    }
    return r;
  }

  const std::vector<Access>& list() const { return list_; }

 private:
  std::optional<int64_t> shift_;
  std::vector<Access> list_;
};

/// Happens-before between ops, tile by tile, over the wait-for graph (threadblock order,
/// dependencies, k-th push -> k-th pop). An edge inside a rank (threadblock order, a
/// dependency) orders all of an op's units of an iteration before the next op's; an edge
/// between ranks (a push and its pop) orders unit u before unit u only. So a path of push/pop
/// edges alone orders only the same unit: it orders two accesses of one tile only when both
/// ops touch the same chunks.
class HappensBefore {
 public:
  explicit HappensBefore(const Program& p) : graph_(p) {
    stamp_[0].assign(graph_.size(), 0);
    stamp_[1].assign(graph_.size(), 0);
  }

  /// Whether every access of op `from` to a tile precedes op `to`'s access to it (for one op:
  /// its reads precede its writes). `aligned`:
  /// the two accesses cover the same chunks (then unit-wise order suffices). False when the
  /// search budget is spent (the caller keeps the slots).
  bool before(const detail::OpPosition& from, const detail::OpPosition& to, bool aligned) {
    const std::size_t a = graph_.id(from.rank, from.tb, from.op);
    const std::size_t b = graph_.id(to.rank, to.tb, to.op);
    // One op: within a unit each thread loads an element before it stores it, so its reads of
    // a tile precede its writes of the same tile (and nothing else is ordered).
    if (a == b) return aligned;
    if (++generation_ == 0) {  // wrapped: no stamp may look current
      for (auto& stamps : stamp_) std::fill(stamps.begin(), stamps.end(), 0);
      generation_ = 1;
    }
    // (node, whole): whole = every unit of `from` is ordered before the node's first unit.
    std::vector<std::pair<std::size_t, int>> frontier{{a, 0}};
    stamp_[0][a] = generation_;
    while (!frontier.empty()) {
      const auto [x, whole] = frontier.back();
      frontier.pop_back();
      for (std::size_t y : graph_.successors(x)) {
        if (visits_++ > kBudget) return false;
        const int w = whole | (graph_.position(x).rank == graph_.position(y).rank ? 1 : 0);
        if (y == b && (w || aligned)) return true;
        if (stamp_[w][y] == generation_) continue;
        stamp_[w][y] = generation_;
        frontier.emplace_back(y, w);
      }
    }
    return false;
  }

 private:
  /// Edge visits over one analysis; past it every undecided pair keeps its slots.
  static constexpr std::size_t kBudget = std::size_t{1} << 24;
  detail::WaitForGraph graph_;
  std::vector<uint32_t> stamp_[2];
  uint32_t generation_ = 0;
  std::size_t visits_ = 0;
};

/// Where the value an op pushes is held in its rank's memory once the op has run: a send's
/// src, an rcs's or rrcs's dst; nullopt for rrs (its value exists only in flight).
std::optional<BufferRef> pushed_value_home(const Op& op) {
  switch (op.code) {
    case OpCode::kSend:
      return op.src;
    case OpCode::kRecvCopySend:
    case OpCode::kRecvReduceCopySend:
      return op.dst;
    default:
      return std::nullopt;
  }
}

}  // namespace

DirectMap analyze_direct(const Program& p, bool inplace, const std::vector<bool>& addressable) {
  DirectMap map(p.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    map[r].resize(p.ranks[r].threadblocks.size());
    for (std::size_t t = 0; t < p.ranks[r].threadblocks.size(); ++t)
      map[r][t].resize(p.ranks[r].threadblocks[t].ops.size());
  }
  if (p.protocol != Protocol::kSimple) return map;
  const auto marked = [&](int32_t rank) {
    return rank >= 0 && static_cast<std::size_t>(rank) < addressable.size() &&
           addressable[static_cast<std::size_t>(rank)];
  };
  std::vector<bool> small(p.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    std::size_t ops = 0;
    for (const auto& tb : p.ranks[r].threadblocks) ops += tb.ops.size();
    small[r] = ops <= kMaxOpsPerRank;
  }
  // The matched pairs that may be direct, and each end's partner.
  struct Pair {
    detail::ConnectionEnds c;
    std::size_t push, pop;
  };
  std::vector<Pair> pairs;
  Partners pushers, pullers;
  for (const detail::ConnectionEnds& c : detail::find_connections(p)) {
    if (c.send_tb < 0 || c.recv_tb < 0 || !marked(c.sender) || !marked(c.receiver) ||
        !small[static_cast<std::size_t>(c.sender)] ||
        !small[static_cast<std::size_t>(c.receiver)] ||
        placement_of(p, c.sender, c.receiver, c.channel).location != SlotLocation::kReceiver)
      continue;
    detail::for_each_matched_pair(p, c, [&](std::size_t push, std::size_t pop) {
      pairs.push_back({c, push, pop});
      pushers[{c.receiver, c.recv_tb, static_cast<int32_t>(pop)}] = {c.sender, c.send_tb,
                                                                    static_cast<int32_t>(push)};
      pullers[{c.sender, c.send_tb, static_cast<int32_t>(push)}] = {c.receiver, c.recv_tb,
                                                                   static_cast<int32_t>(pop)};
    });
  }
  std::vector<std::optional<RankAccesses>> accesses(p.ranks.size());
  std::optional<HappensBefore> order;  // built at the first access that needs it
  const auto of = [&](int32_t rank) -> const RankAccesses& {
    auto& slot = accesses[static_cast<std::size_t>(rank)];
    if (!slot) slot.emplace(p, static_cast<std::size_t>(rank), inplace, pushers, pullers);
    return *slot;
  };

  for (const Pair& pair : pairs) {
    const detail::ConnectionEnds& c = pair.c;
    const auto s = static_cast<std::size_t>(c.sender);
    const auto r = static_cast<std::size_t>(c.receiver);
    const Op& x = p.ranks[s].threadblocks[static_cast<std::size_t>(c.send_tb)].ops[pair.push];
    const Op& y = p.ranks[r].threadblocks[static_cast<std::size_t>(c.recv_tb)].ops[pair.pop];
    DirectFlags& fx = map[s][static_cast<std::size_t>(c.send_tb)][pair.push];
    DirectFlags& fy = map[r][static_cast<std::size_t>(c.recv_tb)][pair.pop];
    const auto xi = static_cast<int32_t>(pair.push);
    const auto yi = static_cast<int32_t>(pair.pop);
    const detail::OpPosition xp{c.sender, c.send_tb, xi};
    const detail::OpPosition yp{c.receiver, c.recv_tb, yi};
    // Every access of `rank` that conflicts with `region` must happen before X (which writes
    // or publishes the region's value) or after Y (which consumes it): then the data is where
    // the slot would have carried it, when it is read.
    const auto ordered = [&](int32_t rank, const Region& region, bool writes_only) {
      for (const Access& a : of(rank).list()) {
        if (!a.region.overlaps(region) || (writes_only && !a.write)) continue;
        const detail::OpPosition ap{rank, a.tb, a.op};
        if ((rank == c.sender && a.tb == c.send_tb && a.op == xi) ||
            (rank == c.receiver && a.tb == c.recv_tb && a.op == yi))
          continue;  // X's own write of its value, Y's own access
        const bool aligned = a.region.begin == region.begin && a.region.end == region.end;
        const auto before = [&](const detail::OpPosition& from, const detail::OpPosition& to) {
          if (!order) order.emplace(p);
          return order->before(from, to, aligned);
        };
        // Before X: the access, and a receiver that may read it later, precede X.
        const bool ahead = rank == c.sender && a.tb == c.send_tb && a.op < xi;
        if ((ahead || before(ap, xp)) && (!a.later || before(*a.later, xp))) continue;
        // After Y: the access, and a sender that may write it earlier, follow Y.
        const bool behind = rank == c.receiver && a.tb == c.recv_tb && a.op > yi;
        if (!(behind || before(yp, ap)) || (a.earlier && !before(yp, *a.earlier))) return false;
      }
      return true;
    };
    // Push: the value lands in Y's dst as it is (recv, rcs); nothing else of the receiver may
    // read or write it between.
    if ((y.code == OpCode::kRecv || y.code == OpCode::kRecvCopySend) && y.dst &&
        ordered(c.receiver, of(c.receiver).region(*y.dst, y.count), false)) {
      fx.push = DirectPush::kPush;
      fx.push_to = y.dst;
      fy.pop = DirectPop::kPushed;
      continue;
    }
    // Pull: Y reads X's value where X's rank holds it; nothing may overwrite it between.
    const std::optional<BufferRef> home = pushed_value_home(x);
    if (home && ordered(c.sender, of(c.sender).region(*home, x.count), true)) {
      fx.push = DirectPush::kPulled;
      fy.pop = DirectPop::kPull;
      fy.pull_from = home;
    }
  }
  return map;
}

}  // namespace efccl::ef
