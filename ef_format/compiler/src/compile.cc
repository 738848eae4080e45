// The compiler pipeline (GC3 §5): lower -> check -> automatic channels -> dependency edges ->
// fusion -> threadblocks -> schedule -> synchronization -> ef::Program, validated.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "efccl/ef/validate.h"
#include "ir.h"

namespace efccl::compiler::detail {
namespace {

/// Cross-threadblock dependencies of one rank (GC3's sync insertion). An op waits for the
/// last op of each other threadblock it depends on; a dependency already implied by the
/// threadblock's order or by the op's other dependencies (transitively, on this rank) is
/// dropped.
void insert_dependencies(const Dag& dag, const std::vector<int32_t>& order, int32_t rank,
                         std::vector<ef::Threadblock>& tbs) {
  const auto ntb = tbs.size();
  std::vector<int32_t> local;  // this rank's instructions in schedule order
  for (int32_t i : order) {
    if (dag.instrs[static_cast<std::size_t>(i)].rank == rank) local.push_back(i);
  }
  // after[i][t]: the last op of threadblock t known complete once instruction i completes.
  std::vector<std::vector<int32_t>> after(dag.instrs.size());
  std::vector<int32_t> last_of_tb(ntb, -1);
  std::vector<int64_t> sched_pos(dag.instrs.size(), 0);
  for (std::size_t k = 0; k < order.size(); ++k)
    sched_pos[static_cast<std::size_t>(order[k])] = static_cast<int64_t>(k);
  for (int32_t i : local) {
    const Instr& x = dag.instrs[static_cast<std::size_t>(i)];
    const auto t = static_cast<std::size_t>(x.tb);
    std::vector<int32_t> h = last_of_tb[t] >= 0 ? after[static_cast<std::size_t>(last_of_tb[t])]
                                                : std::vector<int32_t>(ntb, -1);
    // Candidates: the latest predecessor in each other threadblock.
    std::vector<int32_t> latest(ntb, -1);
    for (int32_t p : x.preds) {
      const Instr& y = dag.instrs[static_cast<std::size_t>(p)];
      if (!y.alive || y.rank != rank || y.tb == x.tb) continue;
      int32_t& l = latest[static_cast<std::size_t>(y.tb)];
      if (l < 0 || dag.instrs[static_cast<std::size_t>(l)].tb_pos < y.tb_pos) l = p;
    }
    std::vector<int32_t> cands;
    for (int32_t l : latest) {
      if (l >= 0) cands.push_back(l);
    }
    std::sort(cands.begin(), cands.end(), [&](int32_t a, int32_t b) {
      return sched_pos[static_cast<std::size_t>(a)] > sched_pos[static_cast<std::size_t>(b)];
    });
    std::vector<ef::Dependency> deps;
    for (int32_t c : cands) {
      const Instr& y = dag.instrs[static_cast<std::size_t>(c)];
      if (h[static_cast<std::size_t>(y.tb)] >= y.tb_pos) continue;  // already implied
      deps.push_back({y.tb, y.tb_pos});
      const auto& ay = after[static_cast<std::size_t>(c)];
      for (std::size_t u = 0; u < ntb; ++u) h[u] = std::max(h[u], ay[u]);
    }
    std::sort(deps.begin(), deps.end(), [](const ef::Dependency& a, const ef::Dependency& b) {
      return a.tb != b.tb ? a.tb < b.tb : a.op < b.op;
    });
    h[t] = x.tb_pos;
    after[static_cast<std::size_t>(i)] = std::move(h);
    last_of_tb[t] = i;
    tbs[t].ops[static_cast<std::size_t>(x.tb_pos)].deps = std::move(deps);
  }
}

/// MSCCL's form: at most one dependency per op; the others move to nops placed just before.
void split_dependencies_into_nops(std::vector<ef::Threadblock>& tbs) {
  // New index of each op once the nops are in.
  std::vector<std::vector<int32_t>> new_index(tbs.size());
  for (std::size_t t = 0; t < tbs.size(); ++t) {
    int32_t shift = 0;
    for (const auto& op : tbs[t].ops) {
      if (op.deps.size() > 1) shift += static_cast<int32_t>(op.deps.size()) - 1;
      new_index[t].push_back(static_cast<int32_t>(new_index[t].size()) + shift);
    }
  }
  for (std::size_t t = 0; t < tbs.size(); ++t) {
    std::vector<ef::Op> ops;
    for (auto& op : tbs[t].ops) {
      for (auto& d : op.deps)
        d.op = new_index[static_cast<std::size_t>(d.tb)][static_cast<std::size_t>(d.op)];
      while (op.deps.size() > 1) {
        ef::Op nop;
        nop.code = ef::OpCode::kNop;
        nop.count = 0;
        nop.deps = {op.deps.front()};
        op.deps.erase(op.deps.begin());
        ops.push_back(std::move(nop));
      }
      ops.push_back(std::move(op));
    }
    tbs[t].ops = std::move(ops);
  }
}

struct Attempt {
  bool fusion;
  bool gc3_priority;
};

/// One attempt on a copy of the checked, lowered DAG.
StatusOr<ef::Program> compile_once(const Spec& spec, Dag dag, const Attempt& attempt) {
  build_edges(spec, dag);

  ThreadblockGroups groups(spec.nranks);
  for (const auto& ins : dag.instrs) {
    std::string why;
    if (!groups.add(ins, &why)) {
      return Status::error("trace op " + std::to_string(ins.trace_op) +
                           ": the manual threadblock labels (sendtb/recvtb) contradict: " + why);
    }
  }
  if (attempt.fusion) fuse(spec, dag, groups);
  auto tbs = assign_threadblocks(dag, groups);
  const std::vector<int32_t> order = schedule(dag, attempt.gc3_priority);
  if (order.empty() && !dag.instrs.empty()) {
    return Status::error("no schedule consistent with the connections' FIFO order");
  }

  // Ops per threadblock in schedule order.
  for (int32_t i : order) {
    Instr& x = dag.instrs[static_cast<std::size_t>(i)];
    auto& tb = tbs[static_cast<std::size_t>(x.rank)][static_cast<std::size_t>(x.tb)];
    x.tb_pos = static_cast<int32_t>(tb.ops.size());
    ef::Op op;
    op.code = x.code;
    op.count = x.count;
    if (ef::op_reads_src(x.code)) op.src = x.src;
    if (ef::op_writes_dst(x.code)) op.dst = x.dst;
    tb.ops.push_back(std::move(op));
  }
  for (int32_t r = 0; r < spec.nranks; ++r) {
    insert_dependencies(dag, order, r, tbs[static_cast<std::size_t>(r)]);
    if (spec.options.dependence_nop) split_dependencies_into_nops(tbs[static_cast<std::size_t>(r)]);
  }

  ef::Program p;
  p.name = spec.name;
  p.collective = spec.collective;
  p.protocol = spec.protocol;
  p.nranks = spec.nranks;
  p.nchunksperloop = dag.layout.nchunks;
  // Only rooted collectives carry a root (validation's program-shape rule).
  const bool rooted =
      spec.collective == ef::Collective::kBroadcast || spec.collective == ef::Collective::kReduce ||
      spec.collective == ef::Collective::kGather || spec.collective == ef::Collective::kScatter;
  p.root = rooted ? spec.options.root : 0;
  p.outofplace = dag.modes[0];
  p.inplace = dag.modes[1];
  p.min_bytes = spec.options.min_bytes;
  p.max_bytes = spec.options.max_bytes;
  int32_t channels = 1;
  for (int32_t r = 0; r < spec.nranks; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    ef::Rank rank;
    rank.input_chunks = dag.layout.input_chunks[ri];
    rank.output_chunks = dag.layout.output_chunks[ri];
    for (const auto& tb : tbs[ri]) {
      channels = std::max(channels, tb.channel + 1);
      for (const auto& op : tb.ops) {
        for (const auto& ref : {op.src, op.dst}) {
          if (ref && ref->buffer == ef::BufferKind::kScratch) {
            rank.scratch_chunks = std::max(rank.scratch_chunks, ref->offset + op.count);
          }
        }
      }
    }
    rank.threadblocks = std::move(tbs[ri]);
    p.ranks.push_back(std::move(rank));
  }
  p.nchannels = channels;
  if (spec.collective == ef::Collective::kCustom) p.postconditions = dag.postconditions;

  if (spec.options.validate) {
    const Diagnostics diags = ef::validate(p);
    if (!diags.empty()) {
      std::string msg = "the compiled program fails validation:";
      for (std::size_t i = 0; i < diags.size() && i < 5; ++i) msg += "\n  " + diags[i].to_string();
      if (diags.size() > 5) msg += "\n  ... (" + std::to_string(diags.size()) + " in all)";
      return Status::error(msg);
    }
  }
  return p;
}

}  // namespace

StatusOr<ef::Program> compile(const Spec& spec, const std::vector<TraceOp>& trace) {
  auto lowered = lower(spec, trace);
  if (!lowered) return lowered.status();
  if (Status s = check_postconditions(spec, *lowered, spec.inplace); !s) return s;
  if (!spec.inplace && spec.options.detect_inplace && check_postconditions(spec, *lowered, true)) {
    lowered->modes[1] = true;
  }
  // Automatic channels (ch = -1), then the lowering again with every channel known (the
  // instances' channel offsets depend on how many channels one instance uses).
  const std::vector<TraceOp> placed = assign_channels(spec, trace, *lowered);
  if (!std::equal(placed.begin(), placed.end(), trace.begin(), trace.end(),
                  [](const TraceOp& a, const TraceOp& b) { return a.channel == b.channel; })) {
    auto relowered = lower(spec, placed);
    if (!relowered) return relowered.status();
    relowered->modes[0] = lowered->modes[0];
    relowered->modes[1] = lowered->modes[1];
    lowered = std::move(relowered);
  }
  Dag& dag = *lowered;
  // GC3's order first; if it admits no FIFO-consistent schedule or fails validation (e.g. the
  // capacity check), the trace order, then the trace order without fusion, which always has
  // a FIFO-consistent schedule (each send is directly followed by its receive).
  const bool fusion = spec.options.fuse_rcs || spec.options.fuse_rrcs || spec.options.fuse_rrs;
  std::vector<Attempt> attempts = {{fusion, spec.options.gc3_priority}};
  if (spec.options.gc3_priority) attempts.push_back({fusion, false});
  if (fusion) attempts.push_back({false, false});
  std::optional<Status> first_error;
  for (const Attempt& attempt : attempts) {
    auto result = compile_once(spec, dag, attempt);
    if (result) return result;
    if (!first_error) first_error = result.status();
  }
  return *first_error;
}

}  // namespace efccl::compiler::detail
