#include "symbolic_executor.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

namespace efccl::testing {
namespace {

using Value = std::vector<uint64_t>;  // sorted (rank << 32 | input chunk)

uint64_t enc(int64_t rank, int64_t index) {
  return (static_cast<uint64_t>(rank) << 32) | static_cast<uint64_t>(index);
}

struct Memory {
  // [rank][buffer kind] -> chunks; in-place aliasing redirects one buffer into the other.
  std::vector<std::vector<std::vector<std::optional<Value>>>> bufs;
  std::vector<std::optional<ef::InPlaceAlias>> alias;
  bool inplace = false;

  std::optional<Value>* at(int rank, ef::BufferKind kind, int64_t index) {
    auto b = kind;
    int64_t i = index;
    const auto& a = alias[static_cast<std::size_t>(rank)];
    if (inplace && a) {
      if (a->input_inside_output && kind == ef::BufferKind::kInput) {
        b = ef::BufferKind::kOutput;
        i += static_cast<int64_t>(a->offset_elements);
      } else if (!a->input_inside_output && kind == ef::BufferKind::kOutput) {
        b = ef::BufferKind::kInput;
        i += static_cast<int64_t>(a->offset_elements);
      }
    }
    auto& v = bufs[static_cast<std::size_t>(rank)][static_cast<std::size_t>(b)];
    if (i < 0 || static_cast<std::size_t>(i) >= v.size()) return nullptr;
    return &v[static_cast<std::size_t>(i)];
  }
};

std::vector<ef::Postcondition> expected(const ef::Program& p) {
  if (p.collective == ef::Collective::kCustom) return p.postconditions;
  const int n = p.nranks;
  const int64_t C = p.nchunksperloop;
  const int64_t b = C / n;
  std::vector<ef::Postcondition> out;
  auto all = [&](int64_t k) {
    std::vector<ef::ChunkSource> s;
    for (int q = 0; q < n; ++q) s.push_back({q, k});
    return s;
  };
  for (int r = 0; r < n; ++r) {
    switch (p.collective) {
      case ef::Collective::kAllReduce:
        for (int64_t k = 0; k < C; ++k) out.push_back({r, k, all(k)});
        break;
      case ef::Collective::kAllGather:
        for (int64_t k = 0; k < C; ++k)
          out.push_back({r, k, {{static_cast<int32_t>(k / b), k % b}}});
        break;
      case ef::Collective::kReduceScatter:
        for (int64_t k = 0; k < b; ++k) out.push_back({r, k, all(r * b + k)});
        break;
      case ef::Collective::kAllToAll:
        for (int64_t k = 0; k < C; ++k)
          out.push_back({r, k, {{static_cast<int32_t>(k / b), r * b + k % b}}});
        break;
      case ef::Collective::kBroadcast:
        for (int64_t k = 0; k < C; ++k) out.push_back({r, k, {{p.root, k}}});
        break;
      case ef::Collective::kReduce:
        if (r == p.root)
          for (int64_t k = 0; k < C; ++k) out.push_back({r, k, all(k)});
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace

std::string symbolic_check(const ef::Program& p, bool inplace, uint64_t seed) {
  Memory mem;
  mem.inplace = inplace;
  const uint64_t count = ef::count_granularity(p);  // one element per chunk
  for (int r = 0; r < p.nranks; ++r) {
    const auto& rk = p.ranks[static_cast<std::size_t>(r)];
    mem.bufs.push_back(
        {std::vector<std::optional<Value>>(static_cast<std::size_t>(rk.input_chunks)),
         std::vector<std::optional<Value>>(static_cast<std::size_t>(rk.output_chunks)),
         std::vector<std::optional<Value>>(static_cast<std::size_t>(rk.scratch_chunks))});
    mem.alias.push_back(ef::inplace_alias(p, r, count));
  }
  for (int r = 0; r < p.nranks; ++r) {
    const auto& rk = p.ranks[static_cast<std::size_t>(r)];
    for (int64_t i = 0; i < rk.input_chunks; ++i) {
      if (auto* v = mem.at(r, ef::BufferKind::kInput, i)) *v = Value{enc(r, i)};
    }
  }
  struct Tb {
    int rank, id;
    std::size_t pc = 0;
  };
  std::vector<Tb> tbs;
  std::vector<std::vector<std::size_t>> first_tb(static_cast<std::size_t>(p.nranks));
  for (int r = 0; r < p.nranks; ++r) {
    for (std::size_t t = 0; t < p.ranks[static_cast<std::size_t>(r)].threadblocks.size(); ++t) {
      first_tb[static_cast<std::size_t>(r)].push_back(tbs.size());
      tbs.push_back({r, static_cast<int>(t)});
    }
  }
  std::map<std::tuple<int, int, int>, std::deque<Value>> fifo;  // sender, receiver, channel
  std::mt19937_64 rng(seed);
  auto fail_at = [&](const Tb& t, const std::string& m) {
    return "rank " + std::to_string(t.rank) + " tb " + std::to_string(t.id) + " op " +
           std::to_string(t.pc) + ": " + m;
  };
  std::size_t done = 0, total = tbs.size();
  for (auto& t : tbs) {
    if (p.ranks[static_cast<std::size_t>(t.rank)]
            .threadblocks[static_cast<std::size_t>(t.id)]
            .ops.empty())
      ++done;
  }
  std::vector<std::size_t> order(tbs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  while (done < total) {
    if (seed != 0) std::shuffle(order.begin(), order.end(), rng);
    bool progress = false;
    for (std::size_t oi : order) {
      Tb& t = tbs[oi];
      const auto& tb =
          p.ranks[static_cast<std::size_t>(t.rank)].threadblocks[static_cast<std::size_t>(t.id)];
      if (t.pc >= tb.ops.size()) continue;
      const ef::Op& op = tb.ops[t.pc];
      bool ready = true;
      for (const auto& d : op.deps) {
        if (tbs[first_tb[static_cast<std::size_t>(t.rank)][static_cast<std::size_t>(d.tb)]].pc <=
            static_cast<std::size_t>(d.op))
          ready = false;
      }
      auto in_key = std::make_tuple(tb.recv_peer, t.rank, tb.channel);
      if (ef::op_receives(op.code) && fifo[in_key].size() < static_cast<std::size_t>(op.count))
        ready = false;
      if (!ready) continue;
      for (int64_t u = 0; u < op.count; ++u) {
        std::optional<Value> v;
        auto read = [&](const ef::BufferRef& ref) -> std::optional<Value> {
          auto* s = mem.at(t.rank, ref.buffer, ref.offset + u);
          return s ? *s : std::nullopt;
        };
        if (ef::op_receives(op.code)) {
          v = std::move(fifo[in_key].front());
          fifo[in_key].pop_front();
        }
        if (op.code == ef::OpCode::kSend || op.code == ef::OpCode::kCopy) v = read(*op.src);
        if (op.code == ef::OpCode::kReduce) {
          auto a = read(*op.dst), b = read(*op.src);
          if (!a || !b) return fail_at(t, "reduce of an unwritten chunk");
          v = Value();
          std::merge(a->begin(), a->end(), b->begin(), b->end(), std::back_inserter(*v));
        }
        if (op.code == ef::OpCode::kRecvReduceCopy || op.code == ef::OpCode::kRecvReduceSend ||
            op.code == ef::OpCode::kRecvReduceCopySend) {
          auto b = read(*op.src);
          if (!b) return fail_at(t, "reduce of an unwritten chunk");
          Value m;
          std::merge(v->begin(), v->end(), b->begin(), b->end(), std::back_inserter(m));
          v = std::move(m);
        }
        if (op.code == ef::OpCode::kNop) break;
        if (op.code == ef::OpCode::kMultiReduceCopy) {
          // Every source of every rank read, then every target written (one unit).
          Value m;
          for (const ef::RankBufferRef& ref : op.sources) {
            auto* s = mem.at(ref.rank, ref.buffer, ref.offset + u);
            if (s == nullptr || !*s) return fail_at(t, "mrc reads an unwritten chunk");
            Value merged;
            std::merge(m.begin(), m.end(), (*s)->begin(), (*s)->end(),
                       std::back_inserter(merged));
            m = std::move(merged);
          }
          for (const ef::RankBufferRef& ref : op.targets) {
            auto* s = mem.at(ref.rank, ref.buffer, ref.offset + u);
            if (s == nullptr) return fail_at(t, "mrc writes outside a buffer");
            *s = m;
          }
          continue;
        }
        if (!v) return fail_at(t, "reads an unwritten chunk");
        if (op.dst && ef::op_writes_dst(op.code)) {
          auto* s = mem.at(t.rank, op.dst->buffer, op.dst->offset + u);
          if (s == nullptr) return fail_at(t, "write outside the buffer");
          *s = *v;
        }
        if (ef::op_sends(op.code))
          fifo[std::make_tuple(t.rank, tb.send_peer, tb.channel)].push_back(*v);
      }
      ++t.pc;
      if (t.pc == tb.ops.size()) ++done;
      progress = true;
      if (seed != 0) break;  // re-shuffle after every op
    }
    if (!progress) return "deadlock";
  }
  for (const auto& pc : expected(p)) {
    Value want;
    for (const auto& s : pc.sources) want.push_back(enc(s.rank, s.index));
    std::sort(want.begin(), want.end());
    auto* got = mem.at(pc.rank, ef::BufferKind::kOutput, pc.index);
    if (got == nullptr || !*got || **got != want) {
      std::string g = "nothing";
      if (got != nullptr && *got) {
        g = "{";
        for (auto x : **got)
          g += std::to_string(x >> 32) + ":" + std::to_string(x & 0xffffffffu) + " ";
        g += "}";
      }
      return "rank " + std::to_string(pc.rank) + " output " + std::to_string(pc.index) +
             " wrong: got " + g;
    }
  }
  return "";
}

}  // namespace efccl::testing
