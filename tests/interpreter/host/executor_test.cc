// The host executor on small programs built in memory: every collective, datatype, operator
// and mode verified against the collective's definition; tiling; deadlocks; NCCL's in-place
// aliasing; invalid calls.
#include "efccl/host/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "efccl/ef/validate.h"
#include "program_builders.h"

namespace efccl::host {
namespace {

using ef::BufferKind;
using ef::BufferRef;
using ef::Collective;
using ef::DataType;
using ef::OpCode;
using ef::RedOp;

// ---- Building programs ----

using ef::test_builders::copy;
using ef::test_builders::in;
using ef::test_builders::make_op;
using ef::test_builders::make_tb;
using ef::test_builders::out;
using ef::test_builders::recv;
using ef::test_builders::rrc;
using ef::test_builders::send;

/// An empty program named after its collective (the failure messages below print it).
ef::Program make_program(Collective c, int nranks, int64_t chunks_per_loop) {
  ef::Program p = ef::test_builders::make_program(c, nranks, chunks_per_loop);
  p.name = std::string(ef::to_string(c)) + "-test";
  return p;
}

ef::Rank& rank_of(ef::Program& p, int r) { return p.ranks[static_cast<std::size_t>(r)]; }

int mod(int a, int n) { return ((a % n) + n) % n; }

/// Ring allreduce (reduce-scatter then allgather around r -> r+1) on `channels` threadblocks,
/// each running `rings` independent rings one after another: C = channels * rings * n.
ef::Program ring_allreduce(int n, int channels = 1, int rings = 1) {
  ef::Program p = make_program(Collective::kAllReduce, n, int64_t{channels} * rings * n);
  p.nchannels = channels;
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = rank.output_chunks = p.nchunksperloop;
    for (int ch = 0; ch < channels; ++ch) {
      std::vector<ef::Op> ops;
      for (int l = 0; l < rings; ++l) {
        const int64_t base = (int64_t{ch} * rings + l) * n;
        const auto chunk = [&](int i) { return base + mod(i, n); };
        ops.push_back(send(in(chunk(r))));
        for (int s = 1; s <= n - 2; ++s)
          ops.push_back(make_op(OpCode::kRecvReduceSend, in(chunk(r - s)), std::nullopt));
        ops.push_back(make_op(OpCode::kRecvReduceCopySend, in(chunk(r + 1)), out(chunk(r + 1))));
        for (int s = 1; s <= n - 2; ++s)
          ops.push_back(make_op(OpCode::kRecvCopySend, std::nullopt, out(chunk(r + 1 - s))));
        ops.push_back(recv(out(chunk(r + 2))));
      }
      rank.threadblocks.push_back(make_tb(mod(r + 1, n), mod(r - 1, n), ops, ch));
    }
  }
  return p;
}

/// Allgather by direct exchange; `local_copy` = false relies on in-place aliasing instead.
ef::Program direct_allgather(int n, bool local_copy = true) {
  ef::Program p = make_program(Collective::kAllGather, n, n);
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = 1;
    rank.output_chunks = n;
    if (local_copy) rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(0), out(r))}));
    for (int q = 0; q < n; ++q)
      if (q != r) rank.threadblocks.push_back(make_tb(q, q, {send(in(0)), recv(out(q))}));
  }
  return p;
}

ef::Program direct_alltoall(int n) {
  ef::Program p = make_program(Collective::kAllToAll, n, n);
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = rank.output_chunks = n;
    rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(r), out(r))}));
    for (int q = 0; q < n; ++q)
      if (q != r) rank.threadblocks.push_back(make_tb(q, q, {send(in(q)), recv(out(q))}));
  }
  return p;
}

ef::Program direct_broadcast(int n, int root) {
  ef::Program p = make_program(Collective::kBroadcast, n, 2);
  p.root = root;
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = rank.output_chunks = 2;
    if (r == root) {
      rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(0), out(0)), copy(in(1), out(1))}));
      for (int q = 0; q < n; ++q)
        if (q != root) rank.threadblocks.push_back(make_tb(q, -1, {send(in(0), 2)}));
    } else {
      rank.threadblocks.push_back(make_tb(-1, root, {recv(out(0), 2)}));
    }
  }
  return p;
}

/// Reduce to the root: the root copies its input, then folds in each peer's in a dependency
/// chain. Non-root ranks keep an output chunk the API does not have (the executor backs it).
ef::Program direct_reduce(int n, int root) {
  ef::Program p = make_program(Collective::kReduce, n, 1);
  p.root = root;
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = rank.output_chunks = 1;
    if (r != root) {
      rank.threadblocks.push_back(make_tb(root, -1, {send(in(0))}));
      continue;
    }
    rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(0), out(0))}));
    for (int q = 0; q < n; ++q) {
      if (q == root) continue;
      const int previous = static_cast<int>(rank.threadblocks.size()) - 1;
      rank.threadblocks.push_back(make_tb(-1, q, {rrc(out(0), out(0), {{previous, 0}})}));
    }
  }
  return p;
}

ef::Program direct_gather(int n, int root) {
  ef::Program p = make_program(Collective::kGather, n, n);
  p.root = root;
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = 1;
    rank.output_chunks = r == root ? n : 0;
    if (r != root) {
      rank.threadblocks.push_back(make_tb(root, -1, {send(in(0))}));
      continue;
    }
    rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(0), out(root))}));
    for (int q = 0; q < n; ++q)
      if (q != root) rank.threadblocks.push_back(make_tb(-1, q, {recv(out(q))}));
  }
  return p;
}

ef::Program direct_scatter(int n, int root) {
  ef::Program p = make_program(Collective::kScatter, n, n);
  p.root = root;
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = r == root ? n : 0;
    rank.output_chunks = 1;
    if (r != root) {
      rank.threadblocks.push_back(make_tb(-1, root, {recv(out(0))}));
      continue;
    }
    rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(root), out(0))}));
    for (int q = 0; q < n; ++q)
      if (q != root) rank.threadblocks.push_back(make_tb(q, -1, {send(in(q))}));
  }
  return p;
}

/// Reducescatter by direct exchange: each rank sends block q to rank q and folds the blocks it
/// receives into its output in a dependency chain. Without `local_copy` the output's initial
/// value is the rank's own block, which only in-place aliasing puts there.
ef::Program direct_reducescatter(int n, bool local_copy = true) {
  ef::Program p = make_program(Collective::kReduceScatter, n, n);
  for (int r = 0; r < n; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = n;
    rank.output_chunks = 1;
    if (local_copy) rank.threadblocks.push_back(make_tb(-1, -1, {copy(in(r), out(0))}));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      std::vector<ef::Dependency> deps;
      if (!rank.threadblocks.empty()) {
        const int previous = static_cast<int>(rank.threadblocks.size()) - 1;
        deps.push_back({previous, static_cast<int>(rank.threadblocks.back().ops.size()) - 1});
      }
      rank.threadblocks.push_back(
          make_tb(q, q, {send(in(q)), rrc(out(0), out(0), std::move(deps))}));
    }
  }
  return p;
}

/// Two ranks: rank 0's output chunk 0 = in0[0] (+) in1[0]; rank 1's output chunk 0 = in0[1].
ef::Program custom_two_rank() {
  ef::Program p = make_program(Collective::kCustom, 2, 2);
  for (int r = 0; r < 2; ++r) {
    rank_of(p, r).input_chunks = 2;
    rank_of(p, r).output_chunks = 1;
  }
  rank_of(p, 0).threadblocks.push_back(make_tb(1, 1, {send(in(1)), rrc(in(0), out(0))}));
  rank_of(p, 1).threadblocks.push_back(make_tb(0, 0, {send(in(0)), recv(out(0))}));
  p.postconditions = {{0, 0, {{0, 0}, {1, 0}}}, {1, 0, {{0, 1}}}};
  return p;
}

/// Two ranks each push `count` chunks to the other, then pop as many.
ef::Program exchange(int64_t chunks) {
  ef::Program p = make_program(Collective::kCustom, 2, chunks);
  for (int r = 0; r < 2; ++r) {
    ef::Rank& rank = rank_of(p, r);
    rank.input_chunks = rank.output_chunks = chunks;
    rank.threadblocks.push_back(
        make_tb(1 - r, 1 - r, {send(in(0), chunks), recv(out(0), chunks)}));
    for (int64_t k = 0; k < chunks; ++k) p.postconditions.push_back({r, k, {{1 - r, k}}});
  }
  return p;
}

void expect_valid(const ef::Program& p) {
  for (const auto& d : ef::validate(p)) ADD_FAILURE() << p.name << ": " << d.to_string();
}

ExecOptions options_for(const ef::Program& p, DataType t, RedOp op, bool inplace,
                        uint64_t blocks_per_chunk = 3) {
  ExecOptions o;
  o.count = ef::count_granularity(p) * blocks_per_chunk;
  o.dtype = t;
  o.op = op;
  o.inplace = inplace;
  return o;
}

constexpr DataType kAllTypes[] = {DataType::kInt8,     DataType::kUint8,   DataType::kInt32,
                                  DataType::kUint32,   DataType::kInt64,   DataType::kUint64,
                                  DataType::kFloat16,  DataType::kFloat32, DataType::kFloat64,
                                  DataType::kBFloat16, DataType::kFp8E4M3, DataType::kFp8E5M2};
constexpr RedOp kBuiltinOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax};

/// Runs every datatype x operator x allowed mode and expects PASS.
void expect_pass_everywhere(const ef::Program& p, const std::vector<RedOp>& ops) {
  expect_valid(p);
  for (const bool inplace : allowed_inplace_modes(p))
    for (const DataType t : kAllTypes)
      for (const RedOp op : ops) {
        const VerifyResult v = run_and_verify(p, options_for(p, t, op, inplace), 1234);
        EXPECT_TRUE(v.pass) << p.name << " n=" << p.nranks << " " << ef::to_string(t) << " "
                            << ef::to_string(op) << (inplace ? " inplace" : " outofplace") << ": "
                            << v.message;
        if (v.pass) {
          EXPECT_EQ(v.message.rfind("PASS " + std::string(ef::to_string(p.collective)), 0), 0u)
              << v.message;
        }
      }
}

const std::vector<RedOp> kReducingOps = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax,
                                         RedOp::kAvg};
const std::vector<RedOp> kCopyOnly = {RedOp::kSum};

// ---- Every collective, datatype, operator and mode ----

TEST(Executor, RingAllReduceEveryTypeAndOperator) {
  for (const int n : {2, 3, 4}) expect_pass_everywhere(ring_allreduce(n), kReducingOps);
  expect_pass_everywhere(ring_allreduce(3, 2, 2), kReducingOps);
}

TEST(Executor, ReduceScatterEveryTypeAndOperator) {
  for (const int n : {2, 3, 5}) expect_pass_everywhere(direct_reducescatter(n), kReducingOps);
}

TEST(Executor, ReduceEveryTypeAndOperator) {
  expect_pass_everywhere(direct_reduce(4, 0), kReducingOps);
  expect_pass_everywhere(direct_reduce(3, 2), kReducingOps);
}

TEST(Executor, CustomWithPostconditionsEveryTypeAndOperator) {
  expect_pass_everywhere(custom_two_rank(), kReducingOps);
}

TEST(Executor, DataMovementCollectivesCopyBitExactly) {
  expect_pass_everywhere(direct_allgather(4), kCopyOnly);
  expect_pass_everywhere(direct_alltoall(3), kCopyOnly);
  expect_pass_everywhere(direct_broadcast(4, 1), kCopyOnly);
  expect_pass_everywhere(direct_gather(3, 2), kCopyOnly);
  expect_pass_everywhere(direct_scatter(4, 3), kCopyOnly);
}

TEST(Executor, PreMulSumScalesEachRanksContributionOnce) {
  for (const ef::Program& p : {ring_allreduce(3), ring_allreduce(4), direct_reducescatter(3),
                               direct_reduce(3, 1), custom_two_rank()}) {
    for (const bool inplace : allowed_inplace_modes(p))
      for (const DataType t : kAllTypes) {
        ExecOptions o = options_for(p, t, RedOp::kPreMulSum, inplace);
        o.premul_scalars.clear();
        for (int r = 0; r < p.nranks; ++r) o.premul_scalars.push_back(r % 2 == 0 ? 2.0 : -3.0);
        const VerifyResult v = run_and_verify(p, o, 99);
        EXPECT_TRUE(v.pass) << p.name << " " << ef::to_string(t)
                            << (inplace ? " inplace" : " outofplace") << ": " << v.message;
      }
  }
}

TEST(Executor, MultiRankOpsReduceEveryRanksOperandsAndRefuseInvalidPrograms) {
  // Every type and operator, premul included (each source scaled by its own rank's scalar).
  for (int n : {2, 3, 5}) {
    const ef::Program p = ef::test_builders::mrc_allreduce(n);
    for (bool inplace : {false, true})
      for (const DataType t : {DataType::kFloat32, DataType::kInt8, DataType::kBFloat16})
        for (const RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kAvg, RedOp::kPreMulSum}) {
          ExecOptions o = options_for(p, t, op, inplace);
          if (op == RedOp::kPreMulSum)
            for (int r = 0; r < n; ++r) o.premul_scalars.push_back(r % 2 == 0 ? 2.0 : -3.0);
          const VerifyResult v = run_and_verify(p, o, 17);
          EXPECT_TRUE(v.pass) << n << " ranks " << ef::to_string(t) << " " << ef::to_string(op)
                              << (inplace ? " inplace" : "") << ": " << v.message;
        }
  }
  // Another op writing a chunk an mrc reads: the walk's order would decide the result.
  ef::Program bad = ef::test_builders::mrc_allreduce(2);
  bad.ranks[1].threadblocks.push_back(make_tb(-1, -1, {copy(in(1), out(0))}));
  const ExecOptions o = options_for(bad, DataType::kFloat32, RedOp::kSum, false);
  const auto buffers = make_buffers(bad, o);
  ASSERT_FALSE(buffers.is_ok());
  EXPECT_NE(buffers.status().message().find("[multi-rank-exclusive]"), std::string::npos)
      << buffers.status().message();
  const VerifyResult v = run_and_verify(bad, o, 1);
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.message.find("[multi-rank-exclusive]"), std::string::npos) << v.message;
}

TEST(Executor, IntegerAverageTruncatesTheSum) {
  // 3 ranks: [7, -7] + [1, 1] + [0, 0] = [8, -6]; / 3 -> [2, -2].
  const ef::Program p = ring_allreduce(3);
  ExecOptions o = options_for(p, DataType::kInt32, RedOp::kAvg, false, 1);
  o.count = 3;
  auto buffers = make_buffers(p, o);
  ASSERT_TRUE(buffers.is_ok()) << buffers.status().message();
  const int32_t values[3][3] = {{7, -7, 5}, {1, 1, 5}, {0, 0, 5}};
  for (int r = 0; r < 3; ++r)
    std::memcpy((*buffers)[static_cast<std::size_t>(r)].input.data(), values[r], sizeof values[r]);
  const ExecResult result = execute(p, o, *buffers);
  ASSERT_TRUE(result.status.is_ok()) << result.status.message();
  for (int r = 0; r < 3; ++r) {
    int32_t got[3];
    std::memcpy(got, (*buffers)[static_cast<std::size_t>(r)].output.data(), sizeof got);
    EXPECT_EQ(got[0], 2);
    EXPECT_EQ(got[1], -2);
    EXPECT_EQ(got[2], 5);
  }
}

// ---- Tiling ----

TEST(Executor, TilesWithAPartialLastTileGiveTheSingleIterationResult) {
  const ef::Program p = ring_allreduce(3);
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  o.count = 3 * 7;  // B = 7 elements per chunk
  auto single = make_buffers(p, o);
  ASSERT_TRUE(single.is_ok());
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t i = 0; i < single->at(r).input.size() / 4; ++i) {
      const float v = 0.1f * static_cast<float>(r + 1) + static_cast<float>(i);
      std::memcpy(single->at(r).input.data() + 4 * i, &v, 4);
    }
  auto tiled = *single;
  const ExecResult whole = execute(p, o, *single);
  ASSERT_TRUE(whole.status.is_ok()) << whole.status.message();
  EXPECT_EQ(whole.iterations, 1u);

  o.slot_bytes = 12;  // 3 floats per tile: tiles of 3, 3, 1
  const ExecResult pieces = execute(p, o, tiled);
  ASSERT_TRUE(pieces.status.is_ok()) << pieces.status.message();
  EXPECT_EQ(pieces.iterations, 3u);
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(tiled[r].output, (*single)[r].output) << r;

  const VerifyResult v = run_and_verify(p, o, 5);
  EXPECT_TRUE(v.pass) << v.message;
  EXPECT_NE(v.message.find("iterations=3"), std::string::npos) << v.message;
}

TEST(Executor, TilingWorksForEveryTypeAndSlotSize) {
  const ef::Program p = ring_allreduce(4, 2, 1);
  for (const DataType t : kAllTypes)
    for (const std::size_t slot_bytes : {1u, 5u, 16u, 100u}) {
      ExecOptions o = options_for(p, t, RedOp::kSum, false, 11);
      o.slot_bytes = slot_bytes;
      const VerifyResult v = run_and_verify(p, o, 17);
      EXPECT_TRUE(v.pass) << ef::to_string(t) << " slot_bytes=" << slot_bytes << ": " << v.message;
      const uint64_t per_tile = std::max<std::size_t>(1, slot_bytes / ef::size_of(t));
      EXPECT_EQ(v.exec.iterations, (11 + per_tile - 1) / per_tile);
    }
}

TEST(Executor, DefaultSlotBytesPerProtocol) {
  EXPECT_EQ(default_slot_bytes(ef::Protocol::kSimple), 512u * 1024);
  EXPECT_EQ(default_slot_bytes(ef::Protocol::kLL128), 480u * 1024);
  EXPECT_EQ(default_slot_bytes(ef::Protocol::kLL), 32u * 1024);
  ef::Program p = ring_allreduce(2);
  p.protocol = ef::Protocol::kLL;
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  o.count = 2 * 8192 * 3;  // B = 3 LL slots of floats
  EXPECT_EQ(run_and_verify(p, o, 1).exec.iterations, 3u);
}

TEST(Executor, ZeroCountRunsNothing) {
  const ef::Program p = ring_allreduce(3);
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  o.count = 0;
  const VerifyResult v = run_and_verify(p, o, 1);
  EXPECT_TRUE(v.pass) << v.message;
  EXPECT_EQ(v.exec.iterations, 0u);
}

// ---- Wrong programs and deadlocks ----

TEST(Executor, WrongProgramFailsNamingRankAndIndex) {
  ef::Program p = direct_allgather(3);
  rank_of(p, 1).threadblocks[0].ops[0].dst = out(0);  // own block copied to the wrong place
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  const VerifyResult v = run_and_verify(p, o, 3);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.message.rfind("FAIL: rank 1 output[3]: expected ", 0), 0u) << v.message;
  EXPECT_NE(v.message.find("(and 2 more mismatches)"), std::string::npos) << v.message;
}

TEST(Executor, ReceivingBeforeSendingDeadlocks) {
  ef::Program p = make_program(Collective::kAllGather, 2, 2);
  for (int r = 0; r < 2; ++r) {
    rank_of(p, r).input_chunks = 1;
    rank_of(p, r).output_chunks = 2;
    rank_of(p, r).threadblocks = {make_tb(-1, -1, {copy(in(0), out(r))}),
                                  make_tb(1 - r, 1 - r, {recv(out(1 - r)), send(in(0))})};
  }
  const VerifyResult v = run_and_verify(p, options_for(p, DataType::kInt32, RedOp::kSum, false), 1);
  EXPECT_FALSE(v.pass);
  ASSERT_TRUE(v.exec.deadlock);
  ASSERT_EQ(v.exec.blocked.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const BlockedThreadblock& b = v.exec.blocked[static_cast<std::size_t>(r)];
    EXPECT_EQ(b.rank, r);
    EXPECT_EQ(b.tb, 1);
    EXPECT_EQ(b.op, 0);
    EXPECT_EQ(b.iteration, 0u);
    EXPECT_EQ(b.waits_for,
              "data from rank " + std::to_string(1 - r) + " on channel 0 (connection empty)");
  }
  const std::string report = v.exec.deadlock_report();
  EXPECT_NE(report.find("rank 0 tb 1 op 0 iteration 0: waits for data from rank 1"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 1 tb 1 op 0 iteration 0: waits for data from rank 0"),
            std::string::npos)
      << report;
  EXPECT_NE(v.message.find("deadlock"), std::string::npos) << v.message;
}

TEST(Executor, NineUnitsThroughEightSlotsDeadlockAndSixteenPass) {
  const ef::Program p = exchange(9);
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  o.count = 9;  // one element per chunk: 9 units each way
  const VerifyResult blocked = run_and_verify(p, o, 1);
  ASSERT_TRUE(blocked.exec.deadlock) << blocked.message;
  ASSERT_EQ(blocked.exec.blocked.size(), 2u);
  EXPECT_EQ(blocked.exec.blocked[0].waits_for,
            "a free slot on connection 0->1 channel 0 (all 8 slots full)");
  EXPECT_EQ(blocked.exec.blocked[1].waits_for,
            "a free slot on connection 1->0 channel 0 (all 8 slots full)");

  o.connection_slots = 16;
  const VerifyResult passed = run_and_verify(p, o, 1);
  EXPECT_TRUE(passed.pass) << passed.message;
}

TEST(Executor, CircularDependenciesDeadlock) {
  ef::Program p = make_program(Collective::kCustom, 1, 1);
  rank_of(p, 0).input_chunks = rank_of(p, 0).output_chunks = 1;
  ef::Op a = copy(in(0), out(0));
  a.deps = {{1, 0}};
  ef::Op b = make_op(OpCode::kNop, std::nullopt, std::nullopt, 0, {{0, 0}});
  rank_of(p, 0).threadblocks = {make_tb(-1, -1, {a}), make_tb(-1, -1, {b})};
  std::vector<RankBuffers> buffers(1);
  buffers[0].input.resize(4);
  buffers[0].output.resize(4);
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  o.count = 1;
  const ExecResult r = execute(p, o, buffers);
  ASSERT_TRUE(r.deadlock);
  ASSERT_EQ(r.blocked.size(), 2u);
  EXPECT_EQ(r.blocked[0].waits_for, "dependency tb 1 op 0 to complete iteration 0");
  EXPECT_EQ(r.blocked[1].waits_for, "dependency tb 0 op 0 to complete iteration 0");
}

// ---- In-place aliasing ----

TEST(Executor, InPlaceAllGatherFindsTheInputInsideTheOutput) {
  ef::Program p = direct_allgather(4, /*local_copy=*/false);
  // Correct only because the input already sits at output block `rank`.
  const VerifyResult inplace =
      run_and_verify(p, options_for(p, DataType::kInt64, RedOp::kSum, true), 8);
  EXPECT_TRUE(inplace.pass) << inplace.message;
  const VerifyResult separate =
      run_and_verify(p, options_for(p, DataType::kInt64, RedOp::kSum, false), 8);
  EXPECT_FALSE(separate.pass);
  EXPECT_EQ(separate.message.rfind("FAIL: rank 0 output[0]", 0), 0u) << separate.message;
}

TEST(Executor, InPlaceReduceScatterFindsTheOutputInsideTheInput) {
  ef::Program p = direct_reducescatter(3, /*local_copy=*/false);
  const VerifyResult inplace =
      run_and_verify(p, options_for(p, DataType::kUint32, RedOp::kSum, true), 8);
  EXPECT_TRUE(inplace.pass) << inplace.message;
  const VerifyResult separate =
      run_and_verify(p, options_for(p, DataType::kUint32, RedOp::kSum, false), 8);
  EXPECT_FALSE(separate.pass);
}

TEST(Executor, InPlaceBuffersAreOneSharedRegion) {
  const ef::Program p = direct_reducescatter(3);
  auto buffers = make_buffers(p, options_for(p, DataType::kFloat32, RedOp::kSum, true, 2));
  ASSERT_TRUE(buffers.is_ok());
  EXPECT_TRUE((*buffers)[1].input.empty());
  EXPECT_EQ((*buffers)[1].output.size(), 3u * 2 * 4);  // count * n floats
  const ApiLayout l = api_layout(p, 1, 2, true);
  EXPECT_TRUE(l.shared);
  EXPECT_EQ(l.output_offset, 2u);
  EXPECT_EQ(l.output_elements, 2u);
  EXPECT_EQ(l.input_elements, 6u);
  const ApiLayout gather_leaf = api_layout(direct_gather(3, 0), 1, 2, true);
  EXPECT_FALSE(gather_leaf.shared);  // NCCL aliases only the root of gather
}

// ---- Invalid calls ----

TEST(Executor, InvalidCallsAreErrorsNotCrashes) {
  const ef::Program p = ring_allreduce(3);
  ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false);
  auto buffers = make_buffers(p, o);
  ASSERT_TRUE(buffers.is_ok());

  ExecOptions bad_count = o;
  bad_count.count = 4;
  ExecResult r = execute(p, bad_count, *buffers);
  EXPECT_FALSE(r.status.is_ok());
  EXPECT_NE(r.status.message().find("count 4 is not a multiple of the program's count "
                                    "granularity 3"),
            std::string::npos)
      << r.status.message();

  ef::Program outofplace_only = p;
  outofplace_only.inplace = false;
  ExecOptions inplace = o;
  inplace.inplace = true;
  r = execute(outofplace_only, inplace, *buffers);
  EXPECT_NE(r.status.message().find("not valid for in-place calls"), std::string::npos)
      << r.status.message();

  std::vector<RankBuffers> too_few(2);
  r = execute(p, o, too_few);
  EXPECT_NE(r.status.message().find("got buffers for 2 ranks; the program has 3"),
            std::string::npos)
      << r.status.message();

  auto short_buffers = *buffers;
  short_buffers[2].output.pop_back();
  r = execute(p, o, short_buffers);
  EXPECT_NE(r.status.message().find("rank 2: output buffer has 35 bytes; expected 36"),
            std::string::npos)
      << r.status.message();

  ExecOptions scalars = o;
  scalars.op = RedOp::kPreMulSum;
  scalars.premul_scalars = {1.0, 2.0};
  r = execute(p, scalars, *buffers);
  EXPECT_NE(r.status.message().find("premul_scalars has 2 entries; expected one per rank (3)"),
            std::string::npos)
      << r.status.message();

  const ef::Program gather = direct_allgather(4);
  ExecOptions huge = options_for(gather, DataType::kFloat32, RedOp::kSum, false);
  huge.count = uint64_t{1} << 63;
  EXPECT_FALSE(make_buffers(gather, huge).is_ok());
  std::vector<RankBuffers> empty(4);
  r = execute(gather, huge, empty);
  EXPECT_NE(r.status.message().find("overflows"), std::string::npos) << r.status.message();

  ExecOptions bad_type = o;
  bad_type.dtype = static_cast<DataType>(42);
  EXPECT_NE(execute(p, bad_type, *buffers).status.message().find("unknown datatype"),
            std::string::npos);

  ExecOptions no_slots = o;
  no_slots.connection_slots = 0;
  EXPECT_FALSE(execute(p, no_slots, *buffers).status.is_ok());
}

TEST(Executor, ProgramIndicesOutOfRangeAreErrorsNotCrashes) {
  ExecOptions o;
  o.count = 3;
  {
    ef::Program p = ring_allreduce(3);
    rank_of(p, 1).threadblocks[0].ops[0].src = in(7);
    const VerifyResult v = run_and_verify(p, o, 1);
    EXPECT_NE(v.message.find("rank 1 tb 0 op 0 (send): src of 1 chunks from chunk 7 outside "
                             "the input buffer of 3 chunks"),
              std::string::npos)
        << v.message;
  }
  {
    // Offsets and counts at the ends of int64 (programs built through the API skip the JSON
    // loader's caps): an error naming them, no overflow computing the message.
    ef::Program p = ring_allreduce(3);
    ef::Op& op = rank_of(p, 1).threadblocks[0].ops[0];
    op.src = in(INT64_MAX);
    op.count = INT64_MAX;
    const VerifyResult v = run_and_verify(p, o, 1);
    EXPECT_NE(v.message.find("src of 9223372036854775807 chunks from chunk 9223372036854775807 "
                             "outside the input buffer of 3 chunks"),
              std::string::npos)
        << v.message;
  }
  {
    ef::Program p = ring_allreduce(3);
    rank_of(p, 0).threadblocks[0].send_peer = 0;
    EXPECT_FALSE(run_and_verify(p, o, 1).pass);
  }
  {
    ef::Program p = ring_allreduce(3);
    rank_of(p, 2).threadblocks[0].ops[1].deps = {{5, 0}};
    const VerifyResult v = run_and_verify(p, o, 1);
    EXPECT_NE(v.message.find("dependency on tb 5 op 0, which does not exist"), std::string::npos)
        << v.message;
  }
  {
    ef::Program p = ring_allreduce(3);
    p.ranks.pop_back();
    EXPECT_FALSE(run_and_verify(p, o, 1).pass);
  }
}

TEST(Executor, AllowedModesFollowTheProgramFlags) {
  ef::Program p = ring_allreduce(2);
  EXPECT_EQ(allowed_inplace_modes(p), (std::vector<bool>{false, true}));
  p.outofplace = false;
  EXPECT_EQ(allowed_inplace_modes(p), (std::vector<bool>{true}));
  p.outofplace = true;
  p.inplace = false;
  EXPECT_EQ(allowed_inplace_modes(p), (std::vector<bool>{false}));
}

// ---- Wrong programs the verifier must catch (negative tests) ----

const std::vector<RedOp> kAllOps = {RedOp::kSum, RedOp::kProd, RedOp::kMin,
                                    RedOp::kMax, RedOp::kAvg,  RedOp::kPreMulSum};
constexpr int kRankCounts[] = {2, 3, 8, 17, 32};

/// An "allreduce" in which every rank copies its own input to its output: no communication.
ef::Program copy_only_allreduce(int n) {
  ef::Program p = make_program(Collective::kAllReduce, n, 1);
  for (int r = 0; r < n; ++r) {
    rank_of(p, r).input_chunks = rank_of(p, r).output_chunks = 1;
    rank_of(p, r).threadblocks.push_back(make_tb(-1, -1, {copy(in(0), out(0))}));
  }
  return p;
}

/// Expects run_and_verify to report a mismatch (not an execution error, not a pass), and the
/// inputs to be strong enough that no element was left unverifiable.
void expect_verify_fails(const ef::Program& p, DataType t, RedOp op, bool inplace,
                         const std::string& what) {
  ExecOptions o = options_for(p, t, op, inplace, 64);  // 64 elements per chunk, as run-host
  const VerifyResult v = run_and_verify(p, o, 1234);
  EXPECT_FALSE(v.pass) << what << " n=" << p.nranks << " " << ef::to_string(t) << " "
                       << ef::to_string(op) << ": " << v.message;
  EXPECT_TRUE(v.exec.status.is_ok()) << v.exec.status.message();
  EXPECT_EQ(v.message.rfind("FAIL: rank ", 0), 0u) << v.message;
  EXPECT_EQ(v.message.find("unverifiable"), std::string::npos) << v.message;
}

TEST(ExecutorNegative, CopyOnlyAllReduceFailsForEveryTypeOperatorAndRankCount) {
  // Narrow floats used to accept it once n > 2^precision: the rounding bound of a sum of
  // n terms grew larger than the sum itself.
  for (const int n : kRankCounts) {
    const ef::Program p = copy_only_allreduce(n);
    expect_valid(p);
    for (const DataType t : kAllTypes)
      for (const RedOp op : kAllOps) expect_verify_fails(p, t, op, false, "copy-only");
  }
}

TEST(ExecutorNegative, CopyOnlyAllReduceFailsInPlaceToo) {
  // In place the output already holds the rank's own input: no op at all "computes" a copy.
  for (const int n : {2, 17, 32}) {
    ef::Program p = copy_only_allreduce(n);
    p.inplace = true;
    for (const DataType t : kAllTypes)
      for (const RedOp op : kAllOps) expect_verify_fails(p, t, op, true, "copy-only in place");
  }
}

/// The ring allreduce with rank `victim`'s contribution to one chunk dropped: its rrcs (which
/// folds its input into the chunk that then circulates) becomes a plain rcs.
ef::Program ring_allreduce_missing_one_reduce(int n, int victim) {
  ef::Program p = ring_allreduce(n);
  for (ef::Op& op : rank_of(p, victim).threadblocks[0].ops)
    if (op.code == OpCode::kRecvReduceCopySend) {
      op.code = OpCode::kRecvCopySend;
      op.src.reset();
    }
  return p;
}

TEST(ExecutorNegative, MissingOneReduceFailsForEveryType) {
  for (const int n : kRankCounts) {
    const ef::Program p = ring_allreduce_missing_one_reduce(n, n / 2);
    expect_valid(p);
    for (const DataType t : kAllTypes) {
      expect_verify_fails(p, t, RedOp::kSum, false, "missing reduce");
      if (ef::is_floating(t)) {
        expect_verify_fails(p, t, RedOp::kAvg, false, "missing reduce");
        expect_verify_fails(p, t, RedOp::kPreMulSum, false, "missing reduce");
      }
    }
  }
}

TEST(ExecutorNegative, CorrectRingPassesAtEveryRankCount) {
  // The counterpart of the negative tests: the inputs that expose those programs still let a
  // correct one pass exactly, for every operator, at rank counts beyond 2^precision.
  for (const int n : {17, 32}) {
    const ef::Program p = ring_allreduce(n);
    for (const DataType t : kAllTypes)
      for (const RedOp op : kAllOps) {
        ExecOptions o = options_for(p, t, op, false, 64);
        if (op == RedOp::kPreMulSum)
          for (int r = 0; r < n; ++r) o.premul_scalars.push_back(r % 3 == 0 ? 0.5 : -3.0);
        const VerifyResult v = run_and_verify(p, o, 77);
        EXPECT_TRUE(v.pass) << "n=" << n << " " << ef::to_string(t) << " "
                            << ef::to_string(op) << ": " << v.message;
      }
  }
}

// ---- premulsum/avg with an operand mixing pristine and written input ----

/// Rank 1 sends its input to rank 0, which stores it in its input chunk 1 and then sends its
/// input chunks 0..1 to rank 1: with `split`, as two sends of one chunk (the first pristine,
/// the second written), otherwise as one send of two chunks (mixed).
ef::Program mixed_send(bool split) {
  ef::Program p = make_program(Collective::kCustom, 2, 1);
  rank_of(p, 0).input_chunks = 2;
  rank_of(p, 1).input_chunks = 1;
  rank_of(p, 1).output_chunks = 2;
  std::vector<ef::Op> sends;
  if (split) {
    sends = {make_op(OpCode::kSend, in(0), std::nullopt, 1, {{0, 0}}), send(in(1))};
  } else {
    sends = {make_op(OpCode::kSend, in(0), std::nullopt, 2, {{0, 0}})};
  }
  rank_of(p, 0).threadblocks = {make_tb(-1, 1, {recv(in(1))}), make_tb(1, -1, sends)};
  std::vector<ef::Op> recvs;
  if (split) {
    recvs = {recv(out(0)), recv(out(1))};
  } else {
    recvs = {recv(out(0), 2)};
  }
  rank_of(p, 1).threadblocks = {make_tb(0, -1, {send(in(0))}), make_tb(-1, 0, recvs)};
  p.postconditions = {{1, 0, {{0, 0}}}, {1, 1, {{1, 0}}}};
  return p;
}

TEST(Executor, PreMultiplyingAMixedOperandIsRefusedNamingTheOp) {
  const ef::Program mixed = mixed_send(false);
  expect_valid(mixed);
  for (const DataType t : {DataType::kFloat32, DataType::kFp8E4M3, DataType::kInt32})
    for (const RedOp op : {RedOp::kAvg, RedOp::kPreMulSum}) {
      if (op == RedOp::kAvg && !ef::is_floating(t)) continue;  // integer avg does not scale
      const VerifyResult v = run_and_verify(mixed, options_for(mixed, t, op, false), 5);
      EXPECT_FALSE(v.pass);
      EXPECT_NE(v.message.find("rank 0 tb 1 op 0 (send): src reads input chunks 0..1 of which "
                               "some are already written: premulsum/avg cannot scale it; "
                               "split the op"),
                std::string::npos)
          << ef::to_string(t) << " " << ef::to_string(op) << ": " << v.message;
    }
  // Operators that do not scale run it (and it is correct for them).
  for (const RedOp op : {RedOp::kSum, RedOp::kMax}) {
    const VerifyResult v = run_and_verify(mixed, options_for(mixed, DataType::kFloat32, op, false), 5);
    EXPECT_TRUE(v.pass) << v.message;
  }
  // Integer avg divides after the program: nothing to scale, so nothing to refuse.
  EXPECT_TRUE(
      run_and_verify(mixed, options_for(mixed, DataType::kInt32, RedOp::kAvg, false), 5).pass);

  const ef::Program split = mixed_send(true);
  expect_valid(split);
  for (const DataType t : kAllTypes)
    for (const RedOp op : {RedOp::kAvg, RedOp::kPreMulSum}) {
      ExecOptions o = options_for(split, t, op, false);
      if (op == RedOp::kPreMulSum) o.premul_scalars = {2.0, -0.5};
      const VerifyResult v = run_and_verify(split, o, 5);
      EXPECT_TRUE(v.pass) << ef::to_string(t) << " " << ef::to_string(op) << ": " << v.message;
    }
}

// ---- Scale ----

TEST(Executor, LargeProgramRunsQuickly) {
  // MSCCL corpus scale: 16 ranks x 24 threadblocks x 750 ops, verified; and its time grows
  // linearly with the threadblocks. Timed against the same program with 3 threadblocks per
  // rank (8x fewer), the two interleaved (best of 3 each), so that a slow or loaded machine
  // (sanitizers, CI, a build beside it) does not matter: linear grows ~8x, a walk that rescans
  // every threadblock at each step ~64x. (An absolute limit of 1 s failed under ASan on a
  // loaded 2-core machine at 1.14 s.)
  const auto seconds = [](int channels) {
    const ef::Program p = ring_allreduce(16, channels, 25);
    ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false, 1);
    auto buffers = make_buffers(p, o);
    EXPECT_TRUE(buffers.is_ok());
    if (!buffers.is_ok()) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    const ExecResult r = execute(p, o, *buffers);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(r.status.is_ok()) << r.status.message();
    return s;
  };
  double small = 1e9, large = 1e9;
  for (int i = 0; i < 3; ++i) {
    small = std::min(small, seconds(3));
    large = std::min(large, seconds(24));
  }
  EXPECT_LT(large, 24.0 * small) << "24 threadblocks per rank took " << large << " s, 3 took "
                                 << small << " s";
  const ef::Program p = ring_allreduce(16, 24, 25);
  EXPECT_TRUE(run_and_verify(p, options_for(p, DataType::kFloat32, RedOp::kSum, false, 1), 2).pass);
}

TEST(Executor, HugeDependencyListIsLinear) {
  // A nop depending on `deps` sends that trickle through 8 slots, 8 per round: rechecking the
  // met head of the list on every visit is quadratic; a cursor is linear. Timed against the
  // same program 8x smaller on the same machine, the two sizes interleaved (best of 5 each), so
  // that a slow or loaded machine (sanitizers, CI, a load that comes and goes) does not matter:
  // linear grows ~8x, quadratic ~64x.
  const auto seconds = [](int deps) {
    ef::Program p = make_program(Collective::kCustom, 2, 1);
    rank_of(p, 0).input_chunks = 1;
    rank_of(p, 1).output_chunks = 1;
    std::vector<ef::Dependency> on_all;
    for (int i = 0; i < deps; ++i) on_all.push_back({1, i});
    rank_of(p, 0).threadblocks = {
        make_tb(-1, -1, {make_op(OpCode::kNop, std::nullopt, std::nullopt, 0, on_all)}),
        make_tb(1, -1, std::vector<ef::Op>(static_cast<std::size_t>(deps), send(in(0))))};
    rank_of(p, 1).threadblocks = {
        make_tb(-1, 0, std::vector<ef::Op>(static_cast<std::size_t>(deps), recv(out(0))))};
    p.postconditions = {{1, 0, {{0, 0}}}};
    ExecOptions o = options_for(p, DataType::kFloat32, RedOp::kSum, false, 1);
    o.slot_bytes = 2;  // 2 iterations: the cursor must start over in the second
    o.count = 2;
    const auto start = std::chrono::steady_clock::now();
    const VerifyResult v = run_and_verify(p, o, 1);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(v.pass) << v.message;
    EXPECT_EQ(v.exec.iterations, 2u);
    return elapsed;
  };
  double small = 1e9, large = 1e9;
  for (int round = 0; round < 5; ++round) {
    small = std::min(small, seconds(25000));
    large = std::min(large, seconds(200000));
  }
  EXPECT_LT(large, 24 * small + 0.05) << "25000 dependencies: " << small << " s, 200000: " << large << " s";
}

}  // namespace
}  // namespace efccl::host
