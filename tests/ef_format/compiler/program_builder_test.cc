// Tests of the chunk-DSL compiler: each pass (fusion cases that must and must not fire,
// threadblock assignment, dependency insertion, instances), the errors of bad traces, in-place
// detection, and a property test over random traces checked symbolically and on the host
// executor.
#include "efccl/compiler/program_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "symbolic_executor.h"

namespace efccl::compiler {
namespace {

using ef::OpCode;

/// All ops of a rank, in threadblock order.
std::vector<ef::Op> ops_of(const ef::Program& p, int rank) {
  std::vector<ef::Op> ops;
  for (const auto& tb : p.ranks[static_cast<std::size_t>(rank)].threadblocks) {
    ops.insert(ops.end(), tb.ops.begin(), tb.ops.end());
  }
  return ops;
}

int count_ops(const ef::Program& p, int rank, OpCode code) {
  int n = 0;
  for (const auto& op : ops_of(p, rank)) n += op.code == code;
  return n;
}

/// A compact listing of a program, printed when a check fails.
std::string dump(const ef::Program& p) {
  std::string s =
      "inplace=" + std::to_string(p.inplace) + " outofplace=" + std::to_string(p.outofplace) + "\n";
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& rk = p.ranks[r];
    for (std::size_t t = 0; t < rk.threadblocks.size(); ++t) {
      const auto& tb = rk.threadblocks[t];
      s += "rank " + std::to_string(r) + " tb " + std::to_string(t) + " send " +
           std::to_string(tb.send_peer) + " recv " + std::to_string(tb.recv_peer) + " ch " +
           std::to_string(tb.channel) + ":";
      for (const auto& op : tb.ops) {
        s += " " + std::string(ef::to_string(op.code));
        if (op.src)
          s += " " + std::string(ef::to_string(op.src->buffer)) + "[" +
               std::to_string(op.src->offset) + "]";
        if (op.dst)
          s += " -> " + std::string(ef::to_string(op.dst->buffer)) + "[" +
               std::to_string(op.dst->offset) + "]";
        if (op.count != 1) s += " x" + std::to_string(op.count);
        for (const auto& d : op.deps)
          s += " (dep " + std::to_string(d.tb) + "." + std::to_string(d.op) + ")";
        s += ";";
      }
      s += "\n";
    }
  }
  return s;
}

std::string dump(const ProgramBuilder& b) {
  std::string s;
  for (const auto& op : b.trace()) {
    s += (op.kind == TraceOp::Kind::kCopy ? "copy " : "reduce ");
    if (op.kind == TraceOp::Kind::kReduce) {
      s += std::to_string(op.b_rank) + ":" + std::string(ef::to_string(op.b_buffer.kind)) + "[" +
           std::to_string(op.b_index) + "] into ";
    }
    s += std::to_string(op.a_rank) + ":" + std::string(ef::to_string(op.a_buffer.kind)) + "[" +
         std::to_string(op.a_index) + "]";
    s += " -> " + std::to_string(op.dst_rank) + ":" +
         std::string(ef::to_string(op.dst_buffer.kind)) + "[" + std::to_string(op.dst_index) +
         "] x" + std::to_string(op.count) + " ch " + std::to_string(op.channel) + "\n";
  }
  return s;
}

/// Validation plus the symbolic oracle and the host executor in every allowed mode.
void expect_correct(const ef::Program& p, const std::string& what = "") {
  const auto diags = ef::validate(p);
  ASSERT_TRUE(diags.empty()) << what << ": " << diags.front().to_string();
  const auto modes = host::allowed_inplace_modes(p);
  ASSERT_FALSE(modes.empty()) << what;
  for (bool mode : modes) {
    for (uint64_t seed : {0, 7}) {
      EXPECT_EQ(efccl::testing::symbolic_check(p, mode, seed), "") << what << " inplace=" << mode;
    }
    for (auto [dtype, op] : {std::pair{ef::DataType::kFloat32, ef::RedOp::kSum},
                             std::pair{ef::DataType::kInt32, ef::RedOp::kProd}}) {
      host::ExecOptions ex;
      ex.inplace = mode;
      ex.dtype = dtype;
      ex.op = op;
      ex.count = ef::count_granularity(p) * 2;
      ex.slot_bytes = 4;
      const auto v = host::run_and_verify(p, ex, 3);
      EXPECT_TRUE(v.pass) << what << " inplace=" << mode << ": " << v.message;
    }
  }
}

/// A custom collective on `n` ranks with one input and one output chunk each.
std::unique_ptr<ProgramBuilder> custom(int n, CompileOptions o = {}, int64_t chunks = 1,
                                       int instances = 1) {
  auto b = std::make_unique<ProgramBuilder>("t", ef::Collective::kCustom, n, chunks, false,
                                            ef::Protocol::kSimple, instances, o);
  for (int r = 0; r < n; ++r) b->set_buffer_sizes(r, chunks, chunks);
  return b;
}

// ---- Fusion ----

TEST(Fusion, RecvThenSendBecomesRcs) {
  auto b = custom(3);
  b->set_postconditions({{2, 0, {{0, 0}}}, {1, 0, {{0, 0}}}});
  b->chunk(0, kInput, 0).copy(1, kOutput, 0).copy(2, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecv), 0);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kSend), 0);
  expect_correct(*p);
}

TEST(Fusion, RcsSwitchedOff) {
  CompileOptions o;
  o.fuse_rcs = false;
  auto b = custom(3, o);
  b->set_postconditions({{2, 0, {{0, 0}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0).copy(2, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 0);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecv), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kSend), 1);
  expect_correct(*p);
}

TEST(Fusion, NoRcsAcrossChannels) {
  auto b = custom(3);
  b->set_postconditions({{2, 0, {{0, 0}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0, -1, -1, 0).copy(2, kOutput, 0, -1, -1, 1);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 0);
  // The send waits for the receive in another threadblock: a dependency.
  const auto& tbs = p->ranks[1].threadblocks;
  ASSERT_EQ(tbs.size(), 2u);
  int deps = 0;
  for (const auto& tb : tbs) {
    for (const auto& op : tb.ops) deps += static_cast<int>(op.deps.size());
  }
  EXPECT_EQ(deps, 1);
  expect_correct(*p);
}

TEST(Fusion, NoRcsWhenTheSentValueIsNotTheReceivedOne) {
  auto b = custom(3);
  b->set_postconditions({{2, 0, {{0, 0}, {1, 0}}}});
  Ref r = b->chunk(0, kInput, 0).copy(1, kScratch, 0);
  r = r.reduce(b->chunk(1, kInput, 0));  // local reduce between receive and send
  r.copy(2, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecv), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kReduce), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kSend), 1);
  expect_correct(*p);
}

TEST(Fusion, NoRcsWhenCountsDiffer) {
  auto b = custom(3, {}, 2);
  b->set_postconditions({{2, 0, {{0, 0}}}, {2, 1, {{0, 1}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0);
  b->chunk(0, kInput, 1).copy(1, kScratch, 1);
  b->chunk(1, kScratch, 0, 2).copy(2, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 0);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecv), 2);
  expect_correct(*p);
}

/// Rank 0 -> 1 -> 2 reduction with the partial on rank 1 at `partial`.
ef::Program chain_reduce(Buffer partial, bool use_partial_locally, CompileOptions o = {}) {
  auto b = custom(3, o);
  std::vector<ef::Postcondition> post = {{2, 0, {{0, 0}, {1, 0}, {2, 0}}}};
  if (partial == kOutput) post.push_back({1, 0, {{0, 0}, {1, 0}}});
  if (use_partial_locally) post.push_back({1, 0, {{0, 0}, {1, 0}}});
  b->set_postconditions(post);
  Ref part = b->chunk(1, kInput, 0).reduce_into(b->chunk(0, kInput, 0), partial, 0);
  if (use_partial_locally) part.copy(1, kOutput, 0);
  b->chunk(2, kInput, 0).reduce_into(part, kOutput, 0);
  auto p = b->compile();
  EXPECT_TRUE(p) << p.status().message();
  return p ? *p : ef::Program{};
}

TEST(Fusion, RrsWhenThePartialIsUsedNowhereElse) {
  const auto p = chain_reduce(kScratch, false);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceSend), 1);
  EXPECT_EQ(p.ranks[1].scratch_chunks, 0);  // the partial is never stored
  expect_correct(p);
}

TEST(Fusion, RrcsWhenThePartialIsReadLocally) {
  const auto p = chain_reduce(kScratch, true);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceSend), 0);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceCopySend), 1);
  expect_correct(p);
}

TEST(Fusion, RrcsWhenThePartialIsAnOutput) {
  const auto p = chain_reduce(kOutput, false);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceSend), 0);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceCopySend), 1);
  expect_correct(p);
}

TEST(Fusion, RrsAndRrcsSwitchedOff) {
  CompileOptions o;
  o.fuse_rrs = false;
  auto p = chain_reduce(kScratch, false, o);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceCopySend), 1);
  expect_correct(p);
  o.fuse_rrcs = false;
  p = chain_reduce(kScratch, false, o);
  EXPECT_EQ(count_ops(p, 1, OpCode::kRecvReduceCopy), 1);
  EXPECT_EQ(count_ops(p, 1, OpCode::kSend), 1);
  expect_correct(p);
}

TEST(Fusion, NotWhenTheThreadblockWouldNeedTwoReceivePeers) {
  // Rank 1 forwards data from 0 and from 3 to 2 on one channel: only one of the two can be
  // an rcs (a threadblock receives from one peer). The channel is explicit: the automatic
  // search would put the two flows on two channels (channel_assignment_test.cc).
  auto b = custom(4, {}, 2);
  b->set_postconditions({{2, 0, {{0, 0}}}, {2, 1, {{3, 1}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0, -1, -1, 0).copy(2, kOutput, 0, -1, -1, 0);
  b->chunk(3, kInput, 1).copy(1, kScratch, 1, -1, -1, 0).copy(2, kOutput, 1, -1, -1, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecv), 1);
  EXPECT_EQ(count_ops(*p, 1, OpCode::kSend), 1);
  expect_correct(*p);
}

// ---- Threadblocks ----

void expect_threadblock_invariants(const ef::Program& p) {
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    std::set<std::pair<int, int>> sends, recvs;
    for (const auto& tb : p.ranks[r].threadblocks) {
      if (tb.send_peer >= 0) {
        EXPECT_TRUE(sends.insert({tb.send_peer, tb.channel}).second) << "rank " << r;
      }
      if (tb.recv_peer >= 0) {
        EXPECT_TRUE(recvs.insert({tb.recv_peer, tb.channel}).second) << "rank " << r;
      }
      for (const auto& op : tb.ops) {
        if (ef::op_sends(op.code)) {
          EXPECT_GE(tb.send_peer, 0);
        }
        if (ef::op_receives(op.code)) {
          EXPECT_GE(tb.recv_peer, 0);
        }
      }
    }
  }
}

TEST(Threadblocks, ManualLabelsAreHonoured) {
  auto b = custom(2, {}, 2);
  b->set_postconditions({{1, 0, {{0, 0}}}, {1, 1, {{0, 1}}}});
  // Both sends share label 7 on rank 0; the receives go to different labels on rank 1.
  b->chunk(0, kInput, 0).copy(1, kOutput, 0, 7, 1);
  b->chunk(0, kInput, 1).copy(1, kOutput, 1, 7, 1);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->ranks[0].threadblocks.size(), 1u);
  EXPECT_EQ(p->ranks[0].threadblocks[0].ops.size(), 2u);
  expect_threadblock_invariants(*p);
  expect_correct(*p);
}

TEST(Threadblocks, ContradictoryLabelsAreAnError) {
  auto b = custom(3, {}, 2);
  b->set_postconditions({{1, 0, {{0, 0}}}, {2, 1, {{0, 1}}}});
  b->chunk(0, kInput, 0).copy(1, kOutput, 0, 4);
  b->chunk(0, kInput, 1).copy(2, kOutput, 1, 4);  // label 4 would send to ranks 1 and 2
  auto p = b->compile();
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("trace op 1"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("rank 0"), std::string::npos) << p.status().message();
}

TEST(Threadblocks, OneThreadblockPerConnectionAndConsistentOrder) {
  // Many transfers between the same pair on two channels, interleaved with reverse traffic.
  auto b = custom(2, {}, 8);
  std::vector<ef::Postcondition> post;
  for (int i = 0; i < 8; ++i) {
    b->chunk(0, kInput, i).copy(1, kOutput, i, -1, -1, i % 2);
    b->chunk(1, kInput, i).copy(0, kOutput, i, -1, -1, (i / 2) % 2);
    post.push_back({1, i, {{0, i}}});
    post.push_back({0, i, {{1, i}}});
  }
  b->set_postconditions(post);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  expect_threadblock_invariants(*p);
  EXPECT_EQ(p->nchannels, 2);
  expect_correct(*p);
}

// ---- Dependencies ----

TEST(Dependencies, CrossThreadblockReadsWaitAndNopsCarryExtraOnes) {
  for (bool nops : {false, true}) {
    CompileOptions o;
    o.dependence_nop = nops;
    // Rank 0 receives from 1 and 2 into scratch, then reduces both into its output.
    auto b = custom(3, o);
    b->set_postconditions({{0, 0, {{0, 0}, {1, 0}, {2, 0}}}});
    Ref s1 = b->chunk(1, kInput, 0).copy(0, kScratch, 0);
    Ref s2 = b->chunk(2, kInput, 0).copy(0, kScratch, 1);
    b->chunk(0, kInput, 0).reduce_into(s1, kOutput, 0).reduce(s2);
    auto p = b->compile();
    ASSERT_TRUE(p) << p.status().message();
    std::size_t total_deps = 0, max_deps = 0;
    for (const auto& tb : p->ranks[0].threadblocks) {
      for (const auto& op : tb.ops) {
        total_deps += op.deps.size();
        max_deps = std::max(max_deps, op.deps.size());
        for (const auto& d : op.deps) {
          ASSERT_LT(static_cast<std::size_t>(d.tb), p->ranks[0].threadblocks.size());
          EXPECT_NE(&p->ranks[0].threadblocks[static_cast<std::size_t>(d.tb)], &tb);
        }
      }
    }
    EXPECT_GE(total_deps, 2u);  // the reduces wait for both receive threadblocks
    if (nops) {
      EXPECT_EQ(max_deps, 1u);
    }
    expect_correct(*p, nops ? "nops" : "deps");
  }
}

TEST(Dependencies, WriteAfterReadIsOrdered) {
  // Rank 0 sends input 0 to 1 and then overwrites a scratch chunk it sent from.
  auto b = custom(2);
  b->set_postconditions({{1, 0, {{0, 0}}}, {0, 0, {{1, 0}}}});
  Ref s = b->chunk(0, kInput, 0).copy(0, kScratch, 0);
  s.copy(1, kOutput, 0);
  b->chunk(1, kInput, 0).copy(0, kScratch, 0).copy(0, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  expect_correct(*p);
}

// ---- Instances ----

TEST(Instances, MultiChunkRangesUnderBothPolicies) {
  for (bool interleaved : {true, false}) {
    CompileOptions o;
    o.interleaved_replication = interleaved;
    // Allgather with 2 chunks per block, moved as one 2-chunk op per hop.
    ProgramBuilder b("ag", ef::Collective::kAllGather, 3, 2, false, ef::Protocol::kSimple, 3, o);
    for (int r = 0; r < 3; ++r) {
      Ref acc = b.chunk(r, kInput, 0, 2);
      b.chunk(r, kInput, 0, 2).copy(r, kOutput, 2 * r);
      for (int s = 1; s < 3; ++s) acc = acc.copy((r + s) % 3, kOutput, 2 * r);
    }
    auto p = b.compile();
    ASSERT_TRUE(p) << p.status().message();
    EXPECT_EQ(p->nchunksperloop, 18);
    EXPECT_EQ(p->nchannels, 3);  // one channel per instance
    int64_t max_count = 0;
    for (const auto& op : ops_of(*p, 0)) max_count = std::max(max_count, op.count);
    // Interleaving spreads a 2-chunk range over strided chunks: single-chunk ops.
    EXPECT_EQ(max_count, interleaved ? 1 : 2);
    expect_correct(*p, interleaved ? "interleaved" : "block");
  }
}

// ---- Buffers ----

TEST(Buffers, NamedScratchFollowsTheAnonymousScratch) {
  auto b = custom(2);
  const Buffer tmp = b->scratch_buffer("tmp");
  EXPECT_EQ(b->scratch_buffer("tmp"), tmp);
  b->set_postconditions({{1, 0, {{0, 0}}}});
  b->chunk(0, kInput, 0).copy(0, kScratch, 1).copy(0, tmp, 2).copy(1, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  // Anonymous scratch: chunks 0..1; 'tmp' starts at 2, so its chunk 2 is scratch chunk 4.
  EXPECT_EQ(p->ranks[0].scratch_chunks, 5);
  bool found = false;
  for (const auto& op : ops_of(*p, 0)) {
    found |= op.dst && op.dst->buffer == ef::BufferKind::kScratch && op.dst->offset == 4;
  }
  EXPECT_TRUE(found) << dump(*p);
  expect_correct(*p);

  auto bad = custom(2);
  const Buffer named = bad->scratch_buffer("partials");
  bad->chunk(1, named, 3).copy(0, kOutput, 0);
  EXPECT_NE(bad->status().message().find("rank 1 scratch 'partials'[3]"), std::string::npos)
      << bad->status().message();
}

// ---- Trace errors ----

TEST(TraceErrors, ReadOfANeverWrittenChunk) {
  auto b = custom(2);
  b->set_postconditions({{1, 0, {{0, 0}}}});
  b->chunk(0, kScratch, 3).copy(1, kOutput, 0);
  ASSERT_FALSE(b->status());
  EXPECT_NE(b->status().message().find("rank 0 scratch[3]"), std::string::npos)
      << b->status().message();
  EXPECT_NE(b->status().message().find("never written"), std::string::npos);
  // Later calls do nothing and compile() reports the first error.
  EXPECT_FALSE(b->chunk(0, kInput, 0).copy(1, kOutput, 0).valid());
  auto p = b->compile();
  ASSERT_FALSE(p);
  EXPECT_EQ(p.status().message(), b->status().message());
}

TEST(TraceErrors, UseOfAnOverwrittenChunk) {
  auto b = custom(2, {}, 2);
  b->set_postconditions({{1, 0, {{0, 0}}}});
  Ref old = b->chunk(0, kInput, 0).copy(0, kScratch, 0);
  b->chunk(0, kInput, 1).copy(0, kScratch, 0);  // overwrites what `old` refers to
  old.copy(1, kOutput, 0);
  ASSERT_FALSE(b->status());
  EXPECT_NE(b->status().message().find("rank 0 scratch[0] was overwritten by trace op 1"),
            std::string::npos)
      << b->status().message();
  EXPECT_NE(b->status().message().find("trace op 2"), std::string::npos);
}

TEST(TraceErrors, RangesRanksAndOperands) {
  {
    auto b = custom(2);
    b->chunk(0, kInput, 1);
    EXPECT_NE(b->status().message().find("rank 0 input[1] is outside the buffer (1 chunks)"),
              std::string::npos)
        << b->status().message();
  }
  {
    auto b = custom(2);
    b->chunk(5, kInput, 0);
    EXPECT_NE(b->status().message().find("rank 5 out of range"), std::string::npos);
  }
  {
    auto b = custom(2);
    Ref x = b->chunk(0, kInput, 0);
    x.reduce(x);
    EXPECT_NE(b->status().message().find("overlap"), std::string::npos) << b->status().message();
  }
  {
    auto b = custom(2);
    b->chunk(0, kInput, 0).copy(1, kOutput, 0, -1, -1, 5000);
    EXPECT_NE(b->status().message().find("channel 5000"), std::string::npos);
  }
  {
    ProgramBuilder b("x", ef::Collective::kAllReduce, 0, 1);
    EXPECT_FALSE(b.status());
    EXPECT_FALSE(b.compile());
  }
}

TEST(TraceErrors, TraceThatDoesNotComputeTheCollective) {
  ProgramBuilder b("bad", ef::Collective::kAllReduce, 2, 1);
  b.chunk(0, kInput, 0).copy(0, kOutput, 0);
  b.chunk(1, kInput, 0).reduce_into(b.chunk(0, kInput, 0), kOutput, 0);
  auto p = b.compile();
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("does not compute allreduce: rank 0 output chunk 0"),
            std::string::npos)
      << p.status().message();
}

TEST(TraceErrors, CustomWithoutPostconditions) {
  auto b = custom(2);
  b->chunk(0, kInput, 0).copy(1, kOutput, 0);
  EXPECT_FALSE(b->compile());
}

// ---- In-place ----

TEST(InPlace, DetectedOnlyWhenCorrectUnderAliasing) {
  // Allreduce on 2 ranks, out = in0 + in1, written so that rank 0 writes its output before
  // sending its input: wrong under in-place aliasing, so out-of-place only.
  {
    ProgramBuilder b("early-write", ef::Collective::kAllReduce, 2, 1);
    Ref r1 = b.chunk(0, kInput, 0).reduce_into(b.chunk(1, kInput, 0), kOutput, 0);
    b.chunk(1, kInput, 0).reduce_into(b.chunk(0, kInput, 0), kOutput, 0);
    (void)r1;
    auto p = b.compile();
    ASSERT_TRUE(p) << p.status().message();
    EXPECT_TRUE(p->outofplace);
    EXPECT_FALSE(p->inplace);
    expect_correct(*p);
  }
  {
    // The in-place-only trace of the same algorithm.
    ProgramBuilder b("inplace", ef::Collective::kAllReduce, 2, 1, /*inplace=*/true);
    Ref sum = b.chunk(1, kInput, 0).reduce(b.chunk(0, kInput, 0));
    sum.copy(0, kOutput, 0);
    auto p = b.compile();
    ASSERT_TRUE(p) << p.status().message();
    EXPECT_TRUE(p->inplace);
    EXPECT_FALSE(p->outofplace);
    expect_correct(*p);
  }
  {
    // Out-of-place trace that reads rank 0's input after writing rank 0's output, and the
    // value read reaches rank 1's output: under aliasing rank 1 would get in0 + in1 + in1.
    ProgramBuilder b("late-read", ef::Collective::kAllReduce, 2, 1);
    b.chunk(0, kInput, 0).copy(0, kOutput, 0);
    b.chunk(0, kOutput, 0).reduce(b.chunk(1, kInput, 0));
    Ref late = b.chunk(0, kInput, 0).copy(1, kScratch, 0);
    b.chunk(1, kInput, 0).reduce_into(late, kOutput, 0);
    auto p = b.compile();
    ASSERT_TRUE(p) << p.status().message();
    EXPECT_TRUE(p->outofplace);
    EXPECT_FALSE(p->inplace);
    expect_correct(*p);
  }
}

// ---- Property test: random traces ----

/// Builds a random valid trace on `b` (a custom collective with `chunks` input, output and
/// scratch chunks per rank) and returns the postcondition the trace computes.
std::vector<ef::Postcondition> random_trace(ProgramBuilder& b, int n, int64_t chunks,
                                            std::mt19937_64& rng, int nops) {
  using Value = std::vector<std::pair<int, int64_t>>;  // sorted sources
  // model[rank][buffer][index]
  std::vector<std::vector<std::vector<std::optional<Value>>>> model(
      static_cast<std::size_t>(n),
      std::vector<std::vector<std::optional<Value>>>(
          3, std::vector<std::optional<Value>>(static_cast<std::size_t>(chunks))));
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < chunks; ++i)
      model[static_cast<std::size_t>(r)][0][static_cast<std::size_t>(i)] = Value{{r, i}};
  }
  const Buffer kinds[3] = {kInput, kOutput, kScratch};
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto at = [&](int r, int buf, int64_t i) -> std::optional<Value>& {
    return model[static_cast<std::size_t>(r)][static_cast<std::size_t>(buf)]
                [static_cast<std::size_t>(i)];
  };
  auto initialized = [&](int r, int buf, int64_t i, int64_t size) {
    for (int64_t k = 0; k < size; ++k) {
      if (!at(r, buf, i + k)) return false;
    }
    return true;
  };
  for (int step = 0; step < nops; ++step) {
    const int64_t size = chunks > 1 && pick(0, 3) == 0 ? 2 : 1;
    // A source with a value.
    int sr = 0, sb = 0;
    int64_t si = 0;
    bool found = false;
    for (int attempt = 0; attempt < 20 && !found; ++attempt) {
      sr = pick(0, n - 1);
      sb = pick(0, 2);
      si = pick(0, static_cast<int>(chunks - size));
      found = initialized(sr, sb, si, size);
    }
    if (!found) continue;
    const int ch = pick(-1, 1);
    if (pick(0, 1) == 0) {
      // copy to a random writable location (never the input: keeps inputs pristine)
      const int dr = pick(0, n - 1);
      const int db = pick(1, 2);
      const int64_t di = pick(0, static_cast<int>(chunks - size));
      if (dr == sr && db == sb && std::abs(di - si) < size) continue;
      Ref res = b.chunk(sr, kinds[sb], si, size).copy(dr, kinds[db], di, -1, -1, ch);
      if (!res.valid()) {
        ADD_FAILURE() << b.status().message();
        return {};
      }
      std::vector<std::optional<Value>> vals;
      for (int64_t k = 0; k < size; ++k) vals.push_back(at(sr, sb, si + k));
      for (int64_t k = 0; k < size; ++k) at(dr, db, di + k) = vals[static_cast<std::size_t>(k)];
    } else {
      // reduce the source into a written output/scratch location of a random rank
      const int ar = pick(0, n - 1);
      const int ab = pick(1, 2);
      const int64_t ai = pick(0, static_cast<int>(chunks - size));
      if (!initialized(ar, ab, ai, size)) continue;
      if (ar == sr && ab == sb && std::abs(ai - si) < size) continue;
      bool disjoint = true;  // no input chunk twice in one reduction
      for (int64_t k = 0; k < size; ++k) {
        for (const auto& x : *at(ar, ab, ai + k)) {
          if (std::find(at(sr, sb, si + k)->begin(), at(sr, sb, si + k)->end(), x) !=
              at(sr, sb, si + k)->end())
            disjoint = false;
        }
      }
      if (!disjoint) continue;
      Ref res =
          b.chunk(ar, kinds[ab], ai, size).reduce(b.chunk(sr, kinds[sb], si, size), -1, -1, ch);
      if (!res.valid()) {
        ADD_FAILURE() << b.status().message();
        return {};
      }
      for (int64_t k = 0; k < size; ++k) {
        Value merged = *at(ar, ab, ai + k);
        merged.insert(merged.end(), at(sr, sb, si + k)->begin(), at(sr, sb, si + k)->end());
        std::sort(merged.begin(), merged.end());
        at(ar, ab, ai + k) = merged;
      }
    }
  }
  std::vector<ef::Postcondition> post;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < chunks; ++i) {
      const auto& v = at(r, 1, i);
      if (!v) continue;
      ef::Postcondition pc{r, i, {}};
      for (const auto& [q, k] : *v) pc.sources.push_back({q, k});
      post.push_back(pc);
    }
  }
  return post;
}

/// EFCCL_PROPERTY_ITERATIONS overrides the default (for longer local runs).
int property_iterations() {
  const char* env = std::getenv("EFCCL_PROPERTY_ITERATIONS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 150;
}

TEST(Property, RandomTracesCompileToCorrectPrograms) {
  const int kIterations = property_iterations();
  std::mt19937_64 rng(20240607);
  int compiled = 0, both_modes = 0;
  for (int iter = 0; iter < kIterations; ++iter) {
    const int n = std::uniform_int_distribution<int>(1, 5)(rng);
    const int64_t chunks = std::uniform_int_distribution<int>(1, 4)(rng);
    CompileOptions o;
    o.fuse_rcs = rng() % 4 != 0;
    o.fuse_rrcs = rng() % 4 != 0;
    o.fuse_rrs = rng() % 4 != 0;
    o.dependence_nop = rng() % 3 == 0;
    o.gc3_priority = rng() % 4 != 0;
    o.interleaved_replication = rng() % 2 == 0;
    const int instances = std::uniform_int_distribution<int>(1, 3)(rng);
    ProgramBuilder b("random", ef::Collective::kCustom, n, chunks, false,
                     static_cast<ef::Protocol>(rng() % 3), instances, o);
    for (int r = 0; r < n; ++r) b.set_buffer_sizes(r, chunks, chunks);
    // The builder needs the postconditions before compile(); derive them from the model.
    auto post = random_trace(b, n, chunks, rng, std::uniform_int_distribution<int>(1, 25)(rng));
    if (::testing::Test::HasFailure()) return;
    if (post.empty()) continue;
    b.set_postconditions(post);
    const std::string what = "iteration " + std::to_string(iter);
    auto p = b.compile();
    ASSERT_TRUE(p) << what << ": " << p.status().message();
    ++compiled;
    both_modes += p->inplace && p->outofplace;
    expect_threadblock_invariants(*p);
    expect_correct(*p, what);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "trace:\n" << dump(b) << "program:\n" << dump(*p);
      return;
    }
  }
  EXPECT_GT(compiled, kIterations * 2 / 3);
  EXPECT_GT(both_modes, 0);  // in-place detection fires on some random traces
}

}  // namespace
}  // namespace efccl::compiler
