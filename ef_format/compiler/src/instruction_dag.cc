// Lowering (instances, then chunk ops -> instructions), the symbolic check of the result
// against the collective, and the dependency edges of the instruction DAG.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {
namespace {

using ef::BufferKind;
using ef::BufferRef;
using ef::OpCode;

/// A symbolic chunk value: the sorted multiset of input chunks reduced into it.
using Value = std::vector<uint64_t>;

uint64_t encode(int32_t rank, int64_t index) {
  return (static_cast<uint64_t>(rank) << 40) | static_cast<uint64_t>(index);
}

std::string format_value(const std::optional<Value>& v) {
  if (!v) return "nothing (never written)";
  std::string s = "{";
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (i == 8) {
      s += ", ... (" + std::to_string(v->size()) + " in all)";
      break;
    }
    if (i > 0) s += ", ";
    s += "rank " + std::to_string((*v)[i] >> 40) + " input[" +
         std::to_string((*v)[i] & ((uint64_t{1} << 40) - 1)) + "]";
  }
  return s + "}";
}

std::string describe_ref(const BufferRef& r, int64_t count) {
  std::string s = std::string(ef::to_string(r.buffer)) + "[" + std::to_string(r.offset);
  if (count != 1) s += ".." + std::to_string(r.offset + count - 1);
  return s + "]";
}

std::string describe_instr(const Instr& ins) {
  std::string s = "rank " + std::to_string(ins.rank) + " " + std::string(ef::to_string(ins.code));
  if (ins.src) s += " src " + describe_ref(*ins.src, ins.count);
  if (ins.dst) s += " dst " + describe_ref(*ins.dst, ins.count);
  return s + " (from trace op " + std::to_string(ins.trace_op) + ")";
}

/// Keys of `count` consecutive chunks starting at `ref`.
template <typename F>
void for_each_key(const Spec& spec, const Layout& layout, int32_t rank, const BufferRef& ref,
                  int64_t count, bool aliased, F&& f) {
  for (int64_t i = 0; i < count; ++i) {
    f(layout.key(spec, rank, {ref.buffer, ref.offset + i}, aliased));
  }
}

bool reads_dst(OpCode c) { return c == OpCode::kReduce; }

}  // namespace

int64_t Layout::key(const Spec& spec, int32_t rank, BufferRef ref, bool aliased) const {
  if (aliased && ref.buffer != BufferKind::kScratch) {
    ref = canonical_inplace(spec.collective, spec.nranks, nchunks, spec.options.root, rank, ref);
  }
  // Input and output regions both get max(input, output) keys, so that the aliased name of
  // a chunk stays inside its region whatever the two sizes are (e.g. broadcast non-roots).
  const auto r = static_cast<std::size_t>(rank);
  const int64_t region = std::max(input_chunks[r], output_chunks[r]);
  int64_t base = rank_base[r];
  if (ref.buffer != BufferKind::kInput) base += region;
  if (ref.buffer == BufferKind::kScratch) base += region;
  return base + ref.offset;
}

StatusOr<Dag> lower(const Spec& spec, const std::vector<TraceOp>& trace) {
  Dag dag;
  Layout& L = dag.layout;
  const int32_t n = spec.nranks;
  const int32_t r = spec.instances;
  const Replication rep{r, spec.options.interleaved_replication};
  L.nranks = n;
  L.nchunks = spec.nchunks * r;
  const int64_t rank_block = rank_block_chunks(spec.collective, n, spec.nchunks);

  // Per rank: replicated sizes; scratch buffers laid out one after another.
  std::vector<std::vector<int64_t>> scratch_base(static_cast<std::size_t>(n));
  int64_t next_key = 0;
  for (int32_t q = 0; q < n; ++q) {
    const auto qi = static_cast<std::size_t>(q);
    L.input_chunks.push_back(spec.input_chunks[qi] * r);
    L.output_chunks.push_back(spec.output_chunks[qi] * r);
    int64_t scratch = 0;
    for (int64_t used : spec.scratch_used[qi]) {
      scratch_base[qi].push_back(scratch);
      scratch += used * r;
    }
    L.scratch_chunks.push_back(scratch);
    L.rank_base.push_back(next_key);
    next_key += 2 * std::max(L.input_chunks.back(), L.output_chunks.back()) + scratch;
  }
  L.total_slots = next_key;

  // The replication block of a buffer: a rank-block for per-block collectives (so that each
  // instance's chunks stay inside the block the collective gives them), else the buffer.
  auto block_of = [&](int32_t rank, Buffer b) -> int64_t {
    const auto ri = static_cast<std::size_t>(rank);
    if (b.kind == BufferKind::kScratch)
      return spec.scratch_used[ri][static_cast<std::size_t>(b.scratch_id + 1)];
    if (rank_block > 0) return rank_block;
    return b.kind == BufferKind::kInput ? spec.input_chunks[ri] : spec.output_chunks[ri];
  };
  auto final_ref = [&](int32_t rank, Buffer b, int64_t index, int32_t k) -> BufferRef {
    const int64_t mapped = rep.map(index, block_of(rank, b), k);
    if (b.kind != BufferKind::kScratch) return {b.kind, mapped};
    return {
        BufferKind::kScratch,
        scratch_base[static_cast<std::size_t>(rank)][static_cast<std::size_t>(b.scratch_id + 1)] +
            mapped};
  };

  int32_t base_channels = 1;
  for (const auto& op : trace) base_channels = std::max(base_channels, op.channel + 1);

  auto add = [&](Instr ins) {
    ins.order = static_cast<int64_t>(dag.instrs.size());
    dag.instrs.push_back(std::move(ins));
    return static_cast<int32_t>(dag.instrs.size() - 1);
  };
  auto same_slot = [&](int32_t rank, const BufferRef& x, const BufferRef& y) {
    return L.key(spec, rank, x, spec.inplace) == L.key(spec, rank, y, spec.inplace);
  };

  for (std::size_t t = 0; t < trace.size(); ++t) {
    const TraceOp& op = trace[t];
    const bool is_reduce = op.kind == TraceOp::Kind::kReduce;
    for (int32_t k = 0; k < r; ++k) {
      const int32_t channel = (op.channel < 0 ? 0 : op.channel) + k * base_channels;
      auto label = [&](int32_t l) { return l < 0 ? -1 : l * r + k; };
      // Split the range where any operand stops being contiguous after replication.
      int64_t start = 0;
      while (start < op.count) {
        const BufferRef a0 = final_ref(op.a_rank, op.a_buffer, op.a_index + start, k);
        const BufferRef d0 = final_ref(op.dst_rank, op.dst_buffer, op.dst_index + start, k);
        const BufferRef b0 =
            is_reduce ? final_ref(op.b_rank, op.b_buffer, op.b_index + start, k) : a0;
        int64_t len = 1;
        while (start + len < op.count) {
          const int64_t j = start + len;
          if (final_ref(op.a_rank, op.a_buffer, op.a_index + j, k).offset != a0.offset + len) break;
          if (final_ref(op.dst_rank, op.dst_buffer, op.dst_index + j, k).offset != d0.offset + len)
            break;
          if (is_reduce &&
              final_ref(op.b_rank, op.b_buffer, op.b_index + j, k).offset != b0.offset + len)
            break;
          ++len;
        }
        Instr base;
        base.count = len;
        base.trace_op = static_cast<int32_t>(t);
        base.channel = channel;
        auto local = [&](OpCode code, BufferRef src, BufferRef dst) {
          Instr ins = base;
          ins.code = code;
          ins.rank = op.dst_rank;
          ins.src = src;
          ins.dst = dst;
          ins.has_channel = op.channel >= 0;
          ins.send_label = label(op.sendtb >= 0 ? op.sendtb : op.recvtb);
          add(ins);
        };
        auto remote = [&](int32_t from, BufferRef send_src, OpCode recv_code,
                          std::optional<BufferRef> recv_src, BufferRef recv_dst) {
          Instr s = base;
          s.code = OpCode::kSend;
          s.rank = from;
          s.src = send_src;
          s.send_peer = op.dst_rank;
          s.has_channel = true;
          s.send_label = label(op.sendtb);
          Instr v = base;
          v.code = recv_code;
          v.rank = op.dst_rank;
          v.src = recv_src;
          v.dst = recv_dst;
          v.recv_peer = from;
          v.has_channel = true;
          v.recv_label = label(op.recvtb);
          const int32_t si = add(s);
          const int32_t vi = add(v);
          dag.instrs[static_cast<std::size_t>(si)].pushes_to = vi;
          dag.instrs[static_cast<std::size_t>(vi)].pops_from = si;
        };
        if (!is_reduce) {
          if (op.a_rank != op.dst_rank) {
            remote(op.a_rank, a0, OpCode::kRecv, std::nullopt, d0);
          } else if (!same_slot(op.a_rank, a0, d0)) {
            local(OpCode::kCopy, a0, d0);
          }
        } else if (op.b_rank != op.a_rank) {
          remote(op.b_rank, b0, OpCode::kRecvReduceCopy, a0, d0);
        } else if (same_slot(op.a_rank, d0, a0)) {
          local(OpCode::kReduce, b0, d0);
        } else if (same_slot(op.a_rank, d0, b0)) {
          local(OpCode::kReduce, a0, d0);
        } else {
          local(OpCode::kCopy, a0, d0);
          local(OpCode::kReduce, b0, d0);
        }
        start += len;
      }
    }
  }

  // Postconditions in final indices.
  if (spec.collective == ef::Collective::kCustom) {
    auto out_block = [&](int32_t rank) {
      return spec.output_chunks[static_cast<std::size_t>(rank)];
    };
    auto in_block = [&](int32_t rank) { return spec.input_chunks[static_cast<std::size_t>(rank)]; };
    for (const auto& pc : spec.custom_postconditions) {
      if (pc.rank < 0 || pc.rank >= n || pc.index < 0 ||
          pc.index >= spec.output_chunks[static_cast<std::size_t>(pc.rank)] || pc.sources.empty()) {
        return Status::error("postcondition for rank " + std::to_string(pc.rank) +
                             " output chunk " + std::to_string(pc.index) +
                             ": outside the output buffer, or no sources");
      }
      for (const auto& s : pc.sources) {
        if (s.rank < 0 || s.rank >= n || s.index < 0 ||
            s.index >= spec.input_chunks[static_cast<std::size_t>(s.rank)]) {
          return Status::error("postcondition for rank " + std::to_string(pc.rank) +
                               " output chunk " + std::to_string(pc.index) + ": source rank " +
                               std::to_string(s.rank) + " input chunk " + std::to_string(s.index) +
                               " is outside the input buffer");
        }
      }
      for (int32_t k = 0; k < r; ++k) {
        ef::Postcondition p{pc.rank, rep.map(pc.index, out_block(pc.rank), k), {}};
        for (const auto& s : pc.sources)
          p.sources.push_back({s.rank, rep.map(s.index, in_block(s.rank), k)});
        dag.postconditions.push_back(std::move(p));
      }
    }
  } else {
    dag.postconditions = standard_postconditions(spec.collective, n, L.nchunks, spec.options.root);
  }
  dag.modes[spec.inplace ? 1 : 0] = true;
  return dag;
}

Status check_postconditions(const Spec& spec, const Dag& dag, bool aliased) {
  const Layout& L = dag.layout;
  std::vector<std::optional<Value>> values(static_cast<std::size_t>(L.total_slots));
  auto at = [&](int32_t rank, BufferRef ref) -> std::optional<Value>& {
    return values[static_cast<std::size_t>(L.key(spec, rank, ref, aliased))];
  };
  for (int32_t q = 0; q < L.nranks; ++q) {
    for (int64_t i = 0; i < L.input_chunks[static_cast<std::size_t>(q)]; ++i) {
      at(q, {BufferKind::kInput, i}) = Value{encode(q, i)};
    }
  }
  std::vector<std::vector<Value>> in_flight(dag.instrs.size());
  auto read = [&](const Instr& ins, const BufferRef& ref, std::vector<Value>& out) -> Status {
    out.clear();
    for (int64_t i = 0; i < ins.count; ++i) {
      const auto& v = at(ins.rank, {ref.buffer, ref.offset + i});
      if (!v) {
        return Status::error(describe_instr(ins) + " reads " +
                             describe_ref({ref.buffer, ref.offset + i}, 1) + " of rank " +
                             std::to_string(ins.rank) + " before it holds a value");
      }
      out.push_back(*v);
    }
    return Status::ok();
  };
  // Ops run unit by unit, so a source and a destination that overlap without coinciding
  // (possible only through aliasing: the trace rejects it otherwise) would read chunks the
  // op itself already overwrote. Such a layout is simply not supported.
  auto partial_overlap = [&](const Instr& ins) {
    if (!ins.src || !ins.dst) return false;
    const int64_t s = L.key(spec, ins.rank, *ins.src, aliased);
    const int64_t d = L.key(spec, ins.rank, *ins.dst, aliased);
    for (int64_t i = 1; i < ins.count; ++i) {
      // Keys of a range are contiguous unless aliasing maps across buffers; compare per unit.
      const int64_t si = L.key(spec, ins.rank, {ins.src->buffer, ins.src->offset + i}, aliased);
      const int64_t di = L.key(spec, ins.rank, {ins.dst->buffer, ins.dst->offset + i}, aliased);
      if (si != s + i || di != d + i) return true;  // not contiguous: be conservative
    }
    return s != d && s < d + ins.count && d < s + ins.count;
  };
  std::vector<Value> src, other;
  for (std::size_t id = 0; id < dag.instrs.size(); ++id) {
    const Instr& ins = dag.instrs[id];
    if (partial_overlap(ins)) {
      return Status::error(describe_instr(ins) + ": source and destination overlap in part");
    }
    switch (ins.code) {
      case OpCode::kSend:
        if (Status s = read(ins, *ins.src, in_flight[id]); !s) return s;
        continue;
      case OpCode::kRecv:
        src = std::move(in_flight[static_cast<std::size_t>(ins.pops_from)]);
        break;
      case OpCode::kCopy:
        if (Status s = read(ins, *ins.src, src); !s) return s;
        break;
      case OpCode::kReduce:
      case OpCode::kRecvReduceCopy: {
        if (ins.code == OpCode::kReduce) {
          if (Status s = read(ins, *ins.dst, other); !s) return s;
        } else {
          other = std::move(in_flight[static_cast<std::size_t>(ins.pops_from)]);
        }
        if (Status s = read(ins, *ins.src, src); !s) return s;
        for (std::size_t i = 0; i < src.size(); ++i) {
          Value merged;
          std::merge(src[i].begin(), src[i].end(), other[i].begin(), other[i].end(),
                     std::back_inserter(merged));
          src[i] = std::move(merged);
        }
        break;
      }
      default:
        continue;  // fused ops do not exist before fusion
    }
    for (int64_t i = 0; i < ins.count; ++i) {
      at(ins.rank, {ins.dst->buffer, ins.dst->offset + i}) =
          std::move(src[static_cast<std::size_t>(i)]);
    }
  }
  for (const auto& pc : dag.postconditions) {
    Value expected;
    for (const auto& s : pc.sources) expected.push_back(encode(s.rank, s.index));
    std::sort(expected.begin(), expected.end());
    const auto& got = at(pc.rank, {BufferKind::kOutput, pc.index});
    if (!got || *got != expected) {
      return Status::error("the trace does not compute " +
                           std::string(ef::to_string(spec.collective)) +
                           (aliased ? " (in-place)" : "") + ": rank " + std::to_string(pc.rank) +
                           " output chunk " + std::to_string(pc.index) + " must hold " +
                           format_value(expected) + " but holds " + format_value(got));
    }
  }
  return Status::ok();
}

void build_edges(const Spec& spec, Dag& dag) {
  auto& instrs = dag.instrs;
  const Layout& L = dag.layout;
  auto edge = [&](int32_t from, int32_t to) {
    if (from < 0 || from == to) return;
    instrs[static_cast<std::size_t>(from)].succs.push_back(to);
    instrs[static_cast<std::size_t>(to)].preds.push_back(from);
  };
  for (auto& ins : instrs) ins.writes_dead = ins.dst.has_value();
  for (int m = 0; m < 2; ++m) {
    if (!dag.modes[m]) continue;
    const bool aliased = m == 1;
    std::vector<int32_t> last_writer(static_cast<std::size_t>(L.total_slots), -1);
    std::vector<std::vector<int32_t>> readers(static_cast<std::size_t>(L.total_slots));
    for (std::size_t id = 0; id < instrs.size(); ++id) {
      const auto i = static_cast<int32_t>(id);
      const Instr ins = instrs[id];  // a copy: `edge` appends to instrs' vectors
      auto on_read = [&](int64_t key) {
        const auto k = static_cast<std::size_t>(key);
        if (last_writer[k] >= 0 && last_writer[k] != i) {
          edge(last_writer[k], i);
          instrs[static_cast<std::size_t>(last_writer[k])].value_readers.push_back(i);
        }
        readers[k].push_back(i);
      };
      auto on_write = [&](int64_t key) {
        const auto k = static_cast<std::size_t>(key);
        edge(last_writer[k], i);
        for (int32_t rd : readers[k]) edge(rd, i);
        readers[k].clear();
        last_writer[k] = i;
      };
      if (ins.src && ef::op_reads_src(ins.code))
        for_each_key(spec, L, ins.rank, *ins.src, ins.count, aliased, on_read);
      if (ins.dst && reads_dst(ins.code))
        for_each_key(spec, L, ins.rank, *ins.dst, ins.count, aliased, on_read);
      if (ins.dst) for_each_key(spec, L, ins.rank, *ins.dst, ins.count, aliased, on_write);
    }
    // Dead writes: overwritten later by an instruction that keeps its write (an rrc may turn
    // into an rrs and lose it), or never observed as an output.
    std::vector<bool> observed(static_cast<std::size_t>(L.total_slots), false);
    for (const auto& pc : dag.postconditions) {
      observed[static_cast<std::size_t>(
          L.key(spec, pc.rank, {BufferKind::kOutput, pc.index}, aliased))] = true;
    }
    std::vector<bool> overwritten(static_cast<std::size_t>(L.total_slots), false);
    for (std::size_t id = instrs.size(); id-- > 0;) {
      Instr& ins = instrs[id];
      if (!ins.dst) continue;
      for_each_key(spec, L, ins.rank, *ins.dst, ins.count, aliased, [&](int64_t key) {
        const auto k = static_cast<std::size_t>(key);
        if (!overwritten[k] && observed[k]) ins.writes_dead = false;
      });
      if (ins.code != OpCode::kRecvReduceCopy) {
        for_each_key(spec, L, ins.rank, *ins.dst, ins.count, aliased,
                     [&](int64_t key) { overwritten[static_cast<std::size_t>(key)] = true; });
      }
    }
  }
  for (std::size_t id = 0; id < instrs.size(); ++id) {
    if (instrs[id].pops_from >= 0) edge(instrs[id].pops_from, static_cast<int32_t>(id));
  }
  auto unique = [](std::vector<int32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  for (auto& ins : instrs) {
    unique(ins.preds);
    unique(ins.succs);
    unique(ins.value_readers);
  }
}

}  // namespace efccl::compiler::detail
