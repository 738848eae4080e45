// Automatic channel search (MSCCLang's channel assignment, GC3 §5.3): remote copies and
// reduces traced with ch = -1 get a channel here, before the final lowering.
//
// A rank may hold only one threadblock per connection (peer, channel) and direction, and a
// fused op (rcs, rrcs, rrs) joins its receive and its send connection into one threadblock.
// A *flow* is a chain of transfers w -> x -> y -> ... whose receive at each intermediate rank
// can fuse with the next send; it must use one channel throughout, or it cannot fuse. At an
// intermediate rank x a flow binds, on its channel c, the receive connection (w, c) to the
// send connection (y, c). Another flow through x on c that binds (w, c) to another send peer,
// or (y, c) to another receive peer, conflicts: both fused ops would need the same
// connection in two threadblocks, so one of them could not fuse. Each flow takes the lowest
// channel on which it binds nothing in a conflicting way (the channel its explicitly placed
// members use, if it has one, is tried first). Transfers that fuse with nothing bind nothing
// and take channel 0. Explicit channels are never changed.
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {
namespace {

constexpr int32_t kMaxChannels = 1024;

bool is_remote(const TraceOp& op) {
  return op.kind == TraceOp::Kind::kCopy ? op.a_rank != op.dst_rank : op.b_rank != op.a_rank;
}

int32_t sender(const TraceOp& op) {
  return op.kind == TraceOp::Kind::kCopy ? op.a_rank : op.b_rank;
}

/// A fused position of a flow: rank `rank` receives trace op `in` from `from` and forwards it
/// as trace op `out` to `to`.
struct Junction {
  std::size_t in = 0, out = 0;
  int32_t rank = 0, from = 0, to = 0;
};

/// Which receive peer is bound to which send peer inside fused threadblocks, per (rank,
/// channel), in both directions.
class Bindings {
 public:
  /// True when binding (from -> to) at (rank, channel) agrees with what is bound there.
  bool compatible(int32_t rank, int32_t channel, int32_t from, int32_t to) const {
    auto f = recv_to_send_.find({rank, channel, from});
    if (f != recv_to_send_.end() && f->second != to) return false;
    auto t = send_to_recv_.find({rank, channel, to});
    return t == send_to_recv_.end() || t->second == from;
  }
  void bind(int32_t rank, int32_t channel, int32_t from, int32_t to) {
    recv_to_send_.emplace(Key{rank, channel, from}, to);
    send_to_recv_.emplace(Key{rank, channel, to}, from);
  }

 private:
  using Key = std::tuple<int32_t, int32_t, int32_t>;
  std::map<Key, int32_t> recv_to_send_, send_to_recv_;
};

/// Trace-op pairs (receiving op, forwarding op) whose instructions the fusion pass can turn
/// into one rcs / rrcs / rrs, found on the instruction DAG with the same rules as fuse(),
/// except that the two channels may still differ.
std::vector<std::pair<std::size_t, std::size_t>> fusable_pairs(const Spec& spec, Dag dag) {
  build_edges(spec, dag);
  const auto& opt = spec.options;
  std::set<std::pair<std::size_t, std::size_t>> pairs;
  std::set<std::size_t> used_in, used_out;
  for (std::size_t id = 0; id < dag.instrs.size(); ++id) {
    const Instr& r = dag.instrs[id];
    const bool is_recv = r.code == ef::OpCode::kRecv && opt.fuse_rcs;
    const bool is_rrc = r.code == ef::OpCode::kRecvReduceCopy && (opt.fuse_rrcs || opt.fuse_rrs);
    if (!is_recv && !is_rrc) continue;
    for (int32_t sid : r.succs) {
      const Instr& s = dag.instrs[static_cast<std::size_t>(sid)];
      if (s.code != ef::OpCode::kSend || s.rank != r.rank) continue;
      if (s.preds.size() != 1 || s.preds[0] != static_cast<int32_t>(id)) continue;
      if (s.count != r.count || !s.src || !r.dst || !(*s.src == *r.dst)) continue;
      const auto in = static_cast<std::size_t>(r.trace_op);
      const auto out = static_cast<std::size_t>(s.trace_op);
      // Each trace op fuses on at most one side per direction (splits and instances of one
      // trace op repeat the same pair).
      if (pairs.count({in, out}) == 0 && !used_in.count(in) && !used_out.count(out)) {
        pairs.insert({in, out});
        used_in.insert(in);
        used_out.insert(out);
      }
      break;  // fuse() takes the first candidate send
    }
  }
  return {pairs.begin(), pairs.end()};
}

}  // namespace

std::vector<TraceOp> assign_channels(const Spec& spec, const std::vector<TraceOp>& trace,
                                     const Dag& lowered) {
  std::vector<TraceOp> out = trace;
  auto is_auto = [&](std::size_t t) { return is_remote(trace[t]) && trace[t].channel < 0; };
  bool any_auto = false;
  for (std::size_t t = 0; t < trace.size(); ++t) any_auto |= is_auto(t);
  if (!any_auto) return out;

  // Flows: union-find over the trace ops joined by fusable pairs.
  std::vector<std::size_t> parent(trace.size());
  std::iota(parent.begin(), parent.end(), std::size_t{0});
  auto find = [&](std::size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::vector<Junction> junctions;
  for (const auto& [in, out_op] : fusable_pairs(spec, lowered)) {
    const TraceOp& a = trace[in];
    const TraceOp& b = trace[out_op];
    if (!is_remote(a) || !is_remote(b)) continue;
    junctions.push_back({in, out_op, a.dst_rank, sender(a), b.dst_rank});
    parent[find(in)] = find(out_op);
  }
  // Manual threadblock labels pin an op's threadblock; MSCCLang leaves such ops on channel 0.
  auto channel_of = [&](std::size_t t, int32_t automatic) -> int32_t {
    if (trace[t].channel >= 0) return trace[t].channel;
    if (trace[t].sendtb >= 0 || trace[t].recvtb >= 0) return 0;
    return automatic;
  };
  auto pinned = [&](std::size_t t) { return channel_of(t, -1) >= 0; };

  Bindings bindings;
  // Junctions between two explicitly placed ops on one channel bind first: they are fixed.
  for (const Junction& j : junctions) {
    const int32_t a = channel_of(j.in, -1), b = channel_of(j.out, -1);
    if (a >= 0 && a == b && bindings.compatible(j.rank, a, j.from, j.to))
      bindings.bind(j.rank, a, j.from, j.to);
  }
  // Flows in the order of their first trace op.
  std::map<std::size_t, std::vector<std::size_t>> members;  // root -> trace ops, ascending
  for (std::size_t t = 0; t < trace.size(); ++t) {
    if (is_remote(trace[t])) members[find(t)].push_back(t);
  }
  std::map<std::size_t, std::vector<const Junction*>> flow_junctions;
  for (const Junction& j : junctions) flow_junctions[find(j.in)].push_back(&j);
  std::vector<std::size_t> roots;
  for (const auto& [root, ops] : members) roots.push_back(root);
  std::sort(roots.begin(), roots.end(),
            [&](std::size_t a, std::size_t b) { return members[a].front() < members[b].front(); });

  for (std::size_t root : roots) {
    const auto& ops = members[root];
    if (std::none_of(ops.begin(), ops.end(), [&](std::size_t t) { return !pinned(t); })) continue;
    const auto& js = flow_junctions[root];
    // Junctions that fuse when the automatic members take channel c.
    auto fits = [&](int32_t c) {
      for (const Junction* j : js) {
        const int32_t a = channel_of(j->in, c), b = channel_of(j->out, c);
        if (a != b || (pinned(j->in) && pinned(j->out))) continue;
        if (!bindings.compatible(j->rank, a, j->from, j->to)) return false;
      }
      return true;
    };
    std::optional<int32_t> chosen;
    std::set<int32_t> explicit_channels;
    for (std::size_t t : ops) {
      if (pinned(t)) explicit_channels.insert(channel_of(t, -1));
    }
    if (explicit_channels.size() == 1 && fits(*explicit_channels.begin()))
      chosen = *explicit_channels.begin();
    for (int32_t c = 0; !chosen && c < kMaxChannels; ++c) {
      if (fits(c)) chosen = c;
    }
    const int32_t c = chosen.value_or(0);  // no channel fits: channel 0, some ops stay unfused
    for (const Junction* j : js) {
      const int32_t a = channel_of(j->in, c), b = channel_of(j->out, c);
      if (a == b && bindings.compatible(j->rank, a, j->from, j->to))
        bindings.bind(j->rank, a, j->from, j->to);
    }
    for (std::size_t t : ops) out[t].channel = channel_of(t, c);
  }
  return out;
}

}  // namespace efccl::compiler::detail
