// One global order of all instructions (GC3 §5.3): every threadblock runs its instructions in
// this order, so the program cannot deadlock through its dependencies. List scheduling over
// the instruction DAG, highest priority first: GC3's (smallest dependency depth, then largest
// reverse depth, i.e. the longest remaining chain), or the trace order. A receive is taken
// only when it is next on its connection, so that the k-th send and the k-th receive of every
// connection are the two halves of one transfer (docs/ef-format.md §3).
#include <algorithm>
#include <deque>
#include <map>
#include <queue>
#include <tuple>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {

std::vector<int32_t> schedule(const Dag& dag, bool gc3_priority) {
  const auto& instrs = dag.instrs;
  const std::size_t n = instrs.size();
  // Instructions are numbered in a topological order (edges go from lower to higher ids).
  std::vector<int64_t> depth(n, 0), rdepth(n, 0);
  std::size_t alive = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!instrs[i].alive) continue;
    ++alive;
    for (int32_t p : instrs[i].preds)
      depth[i] = std::max(depth[i], depth[static_cast<std::size_t>(p)] + 1);
  }
  for (std::size_t i = n; i-- > 0;) {
    if (!instrs[i].alive) continue;
    for (int32_t s : instrs[i].succs)
      rdepth[i] = std::max(rdepth[i], rdepth[static_cast<std::size_t>(s)] + 1);
  }
  using Key = std::tuple<int64_t, int64_t, int64_t, int32_t>;
  auto key = [&](int32_t i) {
    const auto u = static_cast<std::size_t>(i);
    if (!gc3_priority) return Key{instrs[u].order, 0, 0, i};
    return Key{depth[u], -rdepth[u], instrs[u].order, i};
  };
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;

  using ConnKey = std::tuple<int32_t, int32_t, int32_t>;  // sender, receiver, channel
  std::map<ConnKey, std::deque<int32_t>> fifo;            // scheduled pushes awaiting their pop
  std::vector<bool> parked(n, false);                     // pred-ready pops not yet at the head
  std::vector<int32_t> waiting(n, 0);
  auto push_conn = [&](const Instr& x) { return ConnKey{x.rank, x.send_peer, x.channel}; };
  auto at_head = [&](int32_t i) {
    const Instr& x = instrs[static_cast<std::size_t>(i)];
    auto it = fifo.find(ConnKey{x.recv_peer, x.rank, x.channel});
    return it != fifo.end() && !it->second.empty() && it->second.front() == x.pops_from;
  };
  auto make_ready = [&](int32_t i) {
    if (ef::op_receives(instrs[static_cast<std::size_t>(i)].code) && !at_head(i)) {
      parked[static_cast<std::size_t>(i)] = true;
    } else {
      ready.push(key(i));
    }
  };
  auto wake_head = [&](const ConnKey& c) {
    auto& q = fifo[c];
    if (q.empty()) return;
    const int32_t pop = instrs[static_cast<std::size_t>(q.front())].pushes_to;
    if (pop >= 0 && parked[static_cast<std::size_t>(pop)]) {
      parked[static_cast<std::size_t>(pop)] = false;
      ready.push(key(pop));
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (!instrs[i].alive) continue;
    waiting[i] = static_cast<int32_t>(instrs[i].preds.size());
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (instrs[i].alive && waiting[i] == 0) make_ready(static_cast<int32_t>(i));
  }
  std::vector<int32_t> order;
  order.reserve(alive);
  while (!ready.empty()) {
    const int32_t i = std::get<3>(ready.top());
    ready.pop();
    const Instr& x = instrs[static_cast<std::size_t>(i)];
    order.push_back(i);
    if (ef::op_receives(x.code)) {
      const ConnKey c{x.recv_peer, x.rank, x.channel};
      fifo[c].pop_front();
      wake_head(c);
    }
    if (ef::op_sends(x.code)) {
      const ConnKey c = push_conn(x);
      fifo[c].push_back(i);
      if (fifo[c].size() == 1) wake_head(c);
    }
    for (int32_t s : x.succs) {
      if (--waiting[static_cast<std::size_t>(s)] == 0) make_ready(s);
    }
  }
  if (order.size() != alive) return {};
  return order;
}

}  // namespace efccl::compiler::detail
