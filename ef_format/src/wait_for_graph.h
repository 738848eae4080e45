// The wait-for graph of a program (docs/ef-format.md §8, "deadlock"): one node per op and an
// edge P -> X when X cannot complete before P under unbounded buffering (threadblock order,
// dependencies, the k-th push on a connection before its k-th pop). Validation looks for
// cycles in it; the premul analysis uses it as the happens-before order.
//
// Building it is safe on any program: peers, channels and dependency targets that are out of
// range, and pushes or pops beyond the shorter side of a connection, contribute no edges.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::ef::detail {

/// A threadblock's peer is usable when it names another existing rank.
inline bool is_usable_peer(const Program& program, std::size_t rank, int32_t peer) {
  return peer >= 0 && static_cast<std::size_t>(peer) < program.ranks.size() &&
         static_cast<std::size_t>(peer) != rank;
}

/// One connection (sender, receiver, channel) and the threadblocks at its ends (-1: none).
struct ConnectionEnds {
  int32_t sender = 0;
  int32_t receiver = 0;
  int32_t channel = 0;
  int32_t send_tb = -1;  ///< threadblock of `sender` with send = receiver on `channel`
  int32_t recv_tb = -1;  ///< threadblock of `receiver` with recv = sender on `channel`
};

/// Every connection some threadblock declares (usable peer, channel >= 0), ordered by
/// (sender, receiver, channel). Where two threadblocks claim the same end, the first is kept.
inline std::vector<ConnectionEnds> find_connections(const Program& program) {
  std::map<std::tuple<int32_t, int32_t, int32_t>, ConnectionEnds> by_key;
  for (std::size_t r = 0; r < program.ranks.size(); ++r) {
    const auto rank = static_cast<int32_t>(r);
    const auto& tbs = program.ranks[r].threadblocks;
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      const Threadblock& tb = tbs[t];
      if (tb.channel < 0) continue;
      if (is_usable_peer(program, r, tb.send_peer)) {
        auto& ends = by_key.try_emplace({rank, tb.send_peer, tb.channel},
                                        ConnectionEnds{rank, tb.send_peer, tb.channel})
                         .first->second;
        if (ends.send_tb < 0) ends.send_tb = static_cast<int32_t>(t);
      }
      if (is_usable_peer(program, r, tb.recv_peer)) {
        auto& ends = by_key.try_emplace({tb.recv_peer, rank, tb.channel},
                                        ConnectionEnds{tb.recv_peer, rank, tb.channel})
                         .first->second;
        if (ends.recv_tb < 0) ends.recv_tb = static_cast<int32_t>(t);
      }
    }
  }
  std::vector<ConnectionEnds> out;
  out.reserve(by_key.size());
  for (const auto& [key, ends] : by_key) out.push_back(ends);
  return out;
}

/// Calls fn(push, pop) for connection `c`'s matched ops: the k-th op of its sending
/// threadblock that pushes and the k-th op of its receiving threadblock that pops (indexes in
/// their threadblocks), up to the shorter side. `c` must have both ends.
template <typename F>
void for_each_matched_pair(const Program& program, const ConnectionEnds& c, F&& fn) {
  const auto& push_ops = program.ranks[static_cast<std::size_t>(c.sender)]
                             .threadblocks[static_cast<std::size_t>(c.send_tb)]
                             .ops;
  const auto& pop_ops = program.ranks[static_cast<std::size_t>(c.receiver)]
                            .threadblocks[static_cast<std::size_t>(c.recv_tb)]
                            .ops;
  std::size_t pop = 0;
  for (std::size_t push = 0; push < push_ops.size(); ++push) {
    if (!op_sends(push_ops[push].code)) continue;
    while (pop < pop_ops.size() && !op_receives(pop_ops[pop].code)) ++pop;
    if (pop == pop_ops.size()) return;
    fn(push, pop);
    ++pop;
  }
}

/// Where an op sits in the program.
struct OpPosition {
  int32_t rank = 0;
  int32_t tb = 0;
  int32_t op = 0;
};

/// Ops numbered densely (rank by rank, threadblock by threadblock, in op order) with their
/// wait-for edges in both directions.
class WaitForGraph {
 public:
  explicit WaitForGraph(const Program& program) : program_(program) {
    for (std::size_t r = 0; r < program.ranks.size(); ++r) {
      const auto& tbs = program.ranks[r].threadblocks;
      rank_first_tb_.push_back(tb_first_op_.size());
      for (std::size_t t = 0; t < tbs.size(); ++t) {
        tb_first_op_.push_back(position_.size());
        for (std::size_t i = 0; i < tbs[t].ops.size(); ++i)
          position_.push_back(
              {static_cast<int32_t>(r), static_cast<int32_t>(t), static_cast<int32_t>(i)});
      }
    }
    rank_first_tb_.push_back(tb_first_op_.size());
    tb_first_op_.push_back(position_.size());
    build_edges();
  }

  std::size_t size() const { return position_.size(); }
  /// Dense id of an existing op.
  std::size_t id(std::size_t rank, std::size_t tb, std::size_t op) const {
    return tb_first_op_[rank_first_tb_[rank] + tb] + op;
  }
  const OpPosition& position(std::size_t id) const { return position_[id]; }
  const Op& op(std::size_t id) const {
    const OpPosition& p = position_[id];
    return program_.ranks[p.rank].threadblocks[p.tb].ops[p.op];
  }
  std::span<const std::size_t> predecessors(std::size_t id) const {
    return {preds_.data() + pred_begin_[id], preds_.data() + pred_begin_[id + 1]};
  }
  std::span<const std::size_t> successors(std::size_t id) const {
    return {succs_.data() + succ_begin_[id], succs_.data() + succ_begin_[id + 1]};
  }

  /// Kahn's algorithm: every op after all its predecessors, smallest id first among the
  /// ready ones. Ops on or behind a cycle are missing, so the result is shorter than size().
  std::vector<std::size_t> topological_order() const {
    std::vector<std::size_t> waiting(size());
    for (std::size_t x = 0; x < size(); ++x) waiting[x] = pred_begin_[x + 1] - pred_begin_[x];
    std::vector<std::size_t> order;
    order.reserve(size());
    for (std::size_t x = 0; x < size(); ++x)
      if (waiting[x] == 0) order.push_back(x);
    for (std::size_t next = 0; next < order.size(); ++next)
      for (std::size_t s : successors(order[next]))
        if (--waiting[s] == 0) order.push_back(s);
    return order;
  }

  /// A cycle among the ops that `order` (a topological_order()) is missing, in edge
  /// direction and starting at its smallest id; empty when `order` is complete. Every op left
  /// out by Kahn's algorithm has a predecessor that was left out too, so walking predecessors
  /// must revisit an op.
  std::vector<std::size_t> find_cycle(const std::vector<std::size_t>& order) const {
    std::vector<char> ordered(size(), 0);
    for (std::size_t x : order) ordered[x] = 1;
    std::size_t start = 0;
    while (start < size() && ordered[start]) ++start;
    if (start == size()) return {};
    constexpr std::size_t kNotOnWalk = SIZE_MAX;
    std::vector<std::size_t> walk_index(size(), kNotOnWalk);
    std::vector<std::size_t> walk;
    std::size_t x = start;
    while (walk_index[x] == kNotOnWalk) {
      walk_index[x] = walk.size();
      walk.push_back(x);
      for (std::size_t p : predecessors(x)) {
        if (!ordered[p]) {
          x = p;
          break;
        }
      }
    }
    // walk[walk_index[x]..] follows edges backwards; reverse it into edge direction.
    std::vector<std::size_t> cycle(walk.rbegin(),
                                   walk.rend() - static_cast<std::ptrdiff_t>(walk_index[x]));
    std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
    return cycle;
  }

 private:
  void build_edges() {
    std::vector<std::pair<std::size_t, std::size_t>> edges;  // (from, to)
    for (std::size_t x = 0; x < size(); ++x) {
      const OpPosition& p = position_[x];
      if (p.op > 0) edges.emplace_back(x - 1, x);
      const auto& tbs = program_.ranks[p.rank].threadblocks;
      for (const Dependency& d : op(x).deps) {
        if (d.tb < 0 || static_cast<std::size_t>(d.tb) >= tbs.size()) continue;
        if (d.op < 0 || static_cast<std::size_t>(d.op) >= tbs[d.tb].ops.size()) continue;
        edges.emplace_back(id(p.rank, d.tb, d.op), x);
      }
    }
    for (const ConnectionEnds& c : find_connections(program_)) {
      if (c.send_tb < 0 || c.recv_tb < 0) continue;
      for_each_matched_pair(program_, c, [&](std::size_t push, std::size_t pop) {
        edges.emplace_back(id(c.sender, c.send_tb, push), id(c.receiver, c.recv_tb, pop));
      });
    }
    to_csr(edges, /*by_target=*/true, pred_begin_, preds_);
    to_csr(edges, /*by_target=*/false, succ_begin_, succs_);
  }

  /// Compressed adjacency lists: for each op, the other end of its incoming (by_target) or
  /// outgoing edges.
  void to_csr(const std::vector<std::pair<std::size_t, std::size_t>>& edges, bool by_target,
              std::vector<std::size_t>& begin, std::vector<std::size_t>& ends) const {
    begin.assign(size() + 1, 0);
    for (const auto& [from, to] : edges) ++begin[(by_target ? to : from) + 1];
    for (std::size_t x = 0; x < size(); ++x) begin[x + 1] += begin[x];
    ends.resize(edges.size());
    std::vector<std::size_t> fill(begin.begin(), begin.end() - 1);
    for (const auto& [from, to] : edges) ends[fill[by_target ? to : from]++] = by_target ? from : to;
  }

  const Program& program_;
  std::vector<std::size_t> rank_first_tb_;  ///< global threadblock index of each rank's tb 0
  std::vector<std::size_t> tb_first_op_;    ///< op id of each global threadblock's op 0
  std::vector<OpPosition> position_;
  std::vector<std::size_t> pred_begin_, preds_, succ_begin_, succs_;
};

}  // namespace efccl::ef::detail
