// A unit-level simulator of EF programs under random schedules, for the direct-transfer
// analysis (ef::analyze_direct): threadblocks advance one unit at a time in a random order,
// connections are FIFOs of a given depth, and a DirectMap makes pops read the sender's memory
// or find their value written by the sender, and pushes write the receiver's memory or nothing,
// as the GPU interpreter does. Values are 64-bit sums (order-free), so any schedule of a correct
// program gives the same outputs. A vector-clock race detector (happens-before: threadblock
// order, dependencies, push -> pop) reports the first unordered conflicting access, including
// the direct ones. Written for a review of the analysis (docs/device-executor.md, "Direct
// transfers"); the engine's own semantics are docs/ef-format.md's.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/ef/direct_analysis.h"
#include "efccl/ef/program.h"
#include "efccl/ef/validate.h"

namespace efccl::test_support::sim {
using namespace efccl::ef;  // NOLINT(google-build-using-namespace): test helper

/// In-place aliasing in chunks (docs/ef-format.md §2), written again from the format's text
/// rather than taken from ef_format/src/inplace_shift.h: the simulator is the analysis's
/// independent check.
inline std::optional<int64_t> shift_of(const Program& p, std::size_t rank) {
  const auto n = (int64_t)p.ranks.size();
  const bool is_root = (int64_t)rank == p.root;
  const bool hb = n > 0 && p.nchunksperloop % n == 0;
  const int64_t rb = hb ? (int64_t)rank * (p.nchunksperloop / n) : 0;
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllToAll:
    case Collective::kCustom:
      return 0;
    case Collective::kReduce:
      if (is_root) return 0;
      return std::nullopt;
    case Collective::kAllGather:
      if (hb) return -rb;
      return std::nullopt;
    case Collective::kGather:
      if (hb && is_root) return -rb;
      return std::nullopt;
    case Collective::kReduceScatter:
      if (hb) return rb;
      return std::nullopt;
    case Collective::kScatter:
      if (hb && is_root) return rb;
      return std::nullopt;
  }
  return std::nullopt;
}

struct Mem {
  // physical cells: [0, region) input/output region, then scratch
  std::vector<uint64_t> cells;
  int64_t off_in = 0, off_out = 0, off_scr = 0;
  int64_t idx(BufferKind b, int64_t k) const {
    return b == BufferKind::kInput    ? off_in + k
           : b == BufferKind::kOutput ? off_out + k
                                      : off_scr + k;
  }
};

struct Result {
  std::vector<Mem> mem;
  bool deadlock = false;
  std::string race;  // first race found (vector clocks; HB = tb order, deps, push->pop)
};
using VC = std::vector<uint32_t>;
struct CellHist {
  int wtb = -1;
  uint32_t wc = 0;
  std::vector<std::pair<int, uint32_t>> reads;
};

inline Result run(const Program& p, bool inplace, const DirectMap* dm, uint64_t seed,
                  uint64_t data_seed, int slots) {
  std::mt19937_64 rng(seed), drng(data_seed);
  Result res;
  const std::size_t n = p.ranks.size();
  res.mem.resize(n);
  for (std::size_t r = 0; r < n; ++r) {
    const Rank& R = p.ranks[r];
    Mem& m = res.mem[r];
    auto sh = inplace ? shift_of(p, r) : std::nullopt;
    int64_t region;
    if (sh) {
      m.off_in = std::max<int64_t>(0, -*sh);
      m.off_out = m.off_in + *sh;
      region = std::max(m.off_in + R.input_chunks, m.off_out + R.output_chunks);
    } else {
      m.off_in = 0;
      m.off_out = R.input_chunks;
      region = R.input_chunks + R.output_chunks;
    }
    m.off_scr = region;
    m.cells.resize(region + R.scratch_chunks);
    for (auto& c : m.cells) c = drng();
  }
  // connections
  std::map<std::tuple<int, int, int>, std::deque<uint64_t>> q;
  struct TbState {
    std::size_t op = 0;
    int64_t u = 0;
  };
  std::vector<std::vector<TbState>> st(n);
  std::vector<std::vector<std::vector<char>>> done(n);
  for (std::size_t r = 0; r < n; ++r) {
    st[r].resize(p.ranks[r].threadblocks.size());
    done[r].resize(p.ranks[r].threadblocks.size());
    for (std::size_t t = 0; t < done[r].size(); ++t)
      done[r][t].assign(p.ranks[r].threadblocks[t].ops.size(), 0);
  }
  auto flags = [&](std::size_t r, std::size_t t, std::size_t o) -> DirectFlags {
    if (!dm) return {};
    return (*dm)[r][t][o];
  };
  // vector clocks
  std::vector<std::vector<int>> gid(n);
  int ntbs = 0;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t t = 0; t < p.ranks[r].threadblocks.size(); ++t) gid[r].push_back(ntbs++);
  std::vector<VC> clk(ntbs, VC(ntbs, 0));
  std::map<std::tuple<int, int, int>, VC> flagvc;
  std::map<std::tuple<int, int, int>, std::deque<VC>> qvc;
  std::vector<std::vector<CellHist>> hist(n);
  for (std::size_t r = 0; r < n; ++r) hist[r].resize(res.mem[r].cells.size());
  auto join = [](VC& a, const VC& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::max(a[i], b[i]);
  };
  std::vector<std::pair<int, int>> ready;
  for (;;) {
    ready.clear();
    bool all_done = true;
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t t = 0; t < st[r].size(); ++t) {
        const Threadblock& tb = p.ranks[r].threadblocks[t];
        TbState& s = st[r][t];
        if (s.op >= tb.ops.size()) continue;
        all_done = false;
        const Op& op = tb.ops[s.op];
        bool ok = true;
        if (s.u == 0)
          for (auto& d : op.deps) ok = ok && done[r][d.tb][d.op];
        if (op_receives(op.code)) ok = ok && !q[{tb.recv_peer, (int)r, tb.channel}].empty();
        if (op_sends(op.code)) ok = ok && (int)q[{(int)r, tb.send_peer, tb.channel}].size() < slots;
        if (ok) ready.push_back({(int)r, (int)t});
      }
    if (all_done) break;
    if (ready.empty()) {
      res.deadlock = true;
      break;
    }
    // Not a structured binding: the lambdas below capture r, which Clang 14 does not allow.
    const auto [picked_rank, picked_tb] = ready[rng() % ready.size()];
    const int r = picked_rank, t = picked_tb;
    const Threadblock& tb = p.ranks[r].threadblocks[t];
    TbState& s = st[r][t];
    const Op& op = tb.ops[s.op];
    Mem& m = res.mem[r];
    const DirectFlags f = flags(r, t, s.op);
    const int64_t u = s.u;
    const int me = gid[r][t];
    VC& my = clk[me];
    my[me]++;
    if (u == 0)
      for (auto& d : op.deps) join(my, flagvc[{r, d.tb, d.op}]);
    auto access = [&](int rank, int64_t cell, bool write) {
      CellHist& h = hist[rank][cell];
      auto hb = [&](int tb, uint32_t c) { return tb == me || my[tb] >= c; };
      if (res.race.empty()) {
        if (h.wtb >= 0 && !hb(h.wtb, h.wc))
          res.race = "rank " + std::to_string(rank) + " cell " + std::to_string(cell) +
                     (write ? " write" : " read") + " after unordered write";
        if (write)
          for (auto& [tb, c] : h.reads)
            if (!hb(tb, c)) {
              res.race = "rank " + std::to_string(rank) + " cell " + std::to_string(cell) +
                         " write after unordered read";
              break;
            }
      }
      if (write) {
        h.wtb = me;
        h.wc = my[me];
        h.reads.clear();
      } else
        h.reads.push_back({me, my[me]});
    };
    auto rd = [&](const BufferRef& b) {
      access(r, m.idx(b.buffer, b.offset + u), false);
      return m.cells[m.idx(b.buffer, b.offset + u)];
    };
    auto wr = [&](const BufferRef& b, uint64_t v) {
      access(r, m.idx(b.buffer, b.offset + u), true);
      m.cells[m.idx(b.buffer, b.offset + u)] = v;
    };
    auto pop = [&]() -> uint64_t {
      auto& dq = q[{tb.recv_peer, r, tb.channel}];
      uint64_t v = dq.front();
      dq.pop_front();
      auto& vq = qvc[{tb.recv_peer, r, tb.channel}];
      join(my, vq.front());
      vq.pop_front();
      if (f.pop == DirectPop::kPull) {
        Mem& sm = res.mem[tb.recv_peer];
        access(tb.recv_peer, sm.idx(f.pull_from->buffer, f.pull_from->offset + u), false);
        return sm.cells[sm.idx(f.pull_from->buffer, f.pull_from->offset + u)];
      }
      if (f.pop == DirectPop::kPushed) return rd(*op.dst);
      return v;
    };
    auto push = [&](uint64_t v) {
      auto& dq = q[{r, tb.send_peer, tb.channel}];
      if (f.push == DirectPush::kPush) {
        Mem& rm = res.mem[tb.send_peer];
        access(tb.send_peer, rm.idx(f.push_to->buffer, f.push_to->offset + u), true);
        rm.cells[rm.idx(f.push_to->buffer, f.push_to->offset + u)] = v;
        dq.push_back(0xdeadbeef);
      } else if (f.push == DirectPush::kPulled) {
        dq.push_back(0xfeedface);
      } else {
        dq.push_back(v);
      }
      qvc[{r, tb.send_peer, tb.channel}].push_back(my);
    };
    switch (op.code) {
      case OpCode::kSend:
        push(rd(*op.src));
        break;
      case OpCode::kRecv: {
        if (f.pop == DirectPop::kPushed) {
          auto& dq = q[{tb.recv_peer, r, tb.channel}];
          dq.pop_front();
          auto& vq = qvc[{tb.recv_peer, r, tb.channel}];
          join(my, vq.front());
          vq.pop_front();
          break;
        }
        uint64_t v = pop();
        wr(*op.dst, v);
        break;
      }
      case OpCode::kCopy:
        wr(*op.dst, rd(*op.src));
        break;
      case OpCode::kReduce:
        wr(*op.dst, rd(*op.dst) + rd(*op.src));
        break;
      case OpCode::kRecvCopySend: {
        uint64_t v = pop();
        if (f.pop != DirectPop::kPushed) wr(*op.dst, v);
        push(v);
        break;
      }
      case OpCode::kRecvReduceCopy: {
        uint64_t v = pop() + rd(*op.src);
        wr(*op.dst, v);
        break;
      }
      case OpCode::kRecvReduceSend: {
        uint64_t v = pop() + rd(*op.src);
        push(v);
        break;
      }
      case OpCode::kRecvReduceCopySend: {
        uint64_t v = pop() + rd(*op.src);
        wr(*op.dst, v);
        push(v);
        break;
      }
      case OpCode::kNop:
        break;
      case OpCode::kMultiReduceCopy: {
        // Every rank's operand through that rank's memory and race history.
        uint64_t v = 0;
        for (const RankBufferRef& ref : op.sources) {
          Mem& om = res.mem[ref.rank];
          access(ref.rank, om.idx(ref.buffer, ref.offset + u), false);
          v += om.cells[om.idx(ref.buffer, ref.offset + u)];
        }
        for (const RankBufferRef& ref : op.targets) {
          Mem& om = res.mem[ref.rank];
          access(ref.rank, om.idx(ref.buffer, ref.offset + u), true);
          om.cells[om.idx(ref.buffer, ref.offset + u)] = v;
        }
        break;
      }
    }
    s.u++;
    if (s.u >= op.count) {
      done[r][t][s.op] = 1;
      flagvc[{r, t, (int)s.op}] = my;
      s.op++;
      s.u = 0;
    }
  }
  return res;
}

// Compares output region of every rank (program output buffer, aliased as run maps it).
inline std::string compare(const Program& p, const Result& a, const Result& b, bool all_cells) {
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const Mem& ma = a.mem[r];
    const Mem& mb = b.mem[r];
    if (all_cells) {
      for (std::size_t i = 0; i < ma.cells.size(); ++i)
        if (ma.cells[i] != mb.cells[i])
          return "rank " + std::to_string(r) + " cell " + std::to_string(i);
    } else {
      for (int64_t k = 0; k < p.ranks[r].output_chunks; ++k)
        if (ma.cells[ma.idx(BufferKind::kOutput, k)] != mb.cells[mb.idx(BufferKind::kOutput, k)])
          return "rank " + std::to_string(r) + " output chunk " + std::to_string(k);
    }
  }
  return "";
}

}  // namespace efccl::test_support::sim
