// The kernel's tables built from a program (interpreter/device/src/program_tables.h): one
// threadblock entry per threadblock of the launch's ranks, ops and dependencies in order,
// dependency flags, connection indexes and integer avg's result regions.
#include "program_tables.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "program_builders.h"

namespace efccl::device {
namespace {

ef::Op op(ef::OpCode code, std::vector<ef::Dependency> deps = {}) {
  ef::Op o;
  o.code = code;
  o.count = code == ef::OpCode::kNop ? 0 : 1;
  if (ef::op_reads_src(code)) o.src = ef::BufferRef{ef::BufferKind::kInput, 1};
  if (ef::op_writes_dst(code)) o.dst = ef::BufferRef{ef::BufferKind::kOutput, 0};
  o.deps = std::move(deps);
  return o;
}

/// Two ranks exchanging through threadblock 0; threadblock 1 copies after tb 0's recv.
ef::Program exchange_program() {
  ef::Program p;
  p.name = "exchange";
  p.collective = ef::Collective::kAllReduce;
  p.nranks = 2;
  p.nchunksperloop = 2;
  for (int r = 0; r < 2; ++r) {
    ef::Rank rank;
    rank.input_chunks = rank.output_chunks = 2;
    ef::Threadblock io;
    io.send_peer = io.recv_peer = 1 - r;
    io.ops = {op(ef::OpCode::kSend), op(ef::OpCode::kRecv)};
    ef::Threadblock copier;
    copier.ops = {op(ef::OpCode::kNop), op(ef::OpCode::kCopy, {{0, 1}, {1, 0}})};
    rank.threadblocks = {io, copier};
    p.ranks.push_back(rank);
  }
  return p;
}

TEST(ProgramTables, OneEntryPerThreadblockOfTheLaunchsRanks) {
  const ef::Program p = exchange_program();
  const ConnectionIndex sends = {{{0, 0}, 3}, {{1, 0}, 5}};
  const ConnectionIndex recvs = {{{0, 0}, 4}, {{1, 0}, 6}};
  auto tables = build_program_tables(p, {0, 1}, sends, recvs, nullptr, nullptr);
  ASSERT_TRUE(tables.is_ok()) << tables.status().message();
  ASSERT_EQ(tables->threadblocks.size(), 4u);
  ASSERT_EQ(tables->ops.size(), 8u);
  EXPECT_EQ(tables->nflags, 8u);

  const ThreadblockDesc& io1 = tables->threadblocks[2];  // rank 1, tb 0
  EXPECT_EQ(io1.local_rank, 1);
  EXPECT_EQ(io1.rank, 1);
  EXPECT_EQ(io1.tb, 0);
  EXPECT_EQ(io1.send, 5);
  EXPECT_EQ(io1.recv, 6);
  EXPECT_EQ(io1.op_begin, 4u);
  EXPECT_EQ(io1.op_count, 2u);
  EXPECT_EQ(io1.flag_begin, 4u);
  const ThreadblockDesc& copier1 = tables->threadblocks[3];
  EXPECT_EQ(copier1.send, -1);
  EXPECT_EQ(copier1.recv, -1);
  EXPECT_EQ(copier1.flag_begin, 6u);
  EXPECT_EQ(copier1.dep_begin, 2u);  // rank 0's copy has two dependencies before
  EXPECT_EQ(copier1.dep_count, 2u);

  // Rank 1's copy waits for its own tb 0 op 1 (flag 5) and tb 1 op 0 (flag 6).
  const OpDesc& copy1 = tables->ops[7];
  EXPECT_EQ(copy1.code, kOpCopy);
  EXPECT_EQ(copy1.src_buffer, kBufferInput);
  EXPECT_EQ(copy1.src_chunk, 1);
  EXPECT_EQ(copy1.dst_buffer, kBufferOutput);
  EXPECT_EQ(copy1.dep_begin, 2u);
  EXPECT_EQ(copy1.dep_count, 2u);
  EXPECT_EQ(tables->deps[2].flag, 5u);
  EXPECT_EQ(tables->deps[2].tb, 0);
  EXPECT_EQ(tables->deps[2].op, 1);
  EXPECT_EQ(tables->deps[3].flag, 6u);
  // Only the ops something depends on publish their flag.
  EXPECT_EQ(tables->ops[4].publishes, 0);  // send
  EXPECT_EQ(tables->ops[5].publishes, 1);  // recv
  EXPECT_EQ(tables->ops[6].publishes, 1);  // nop
  EXPECT_EQ(tables->ops[7].publishes, 0);
  EXPECT_EQ(tables->ops[6].count, 0);  // a nop moves nothing

  // allreduce: integer avg divides each rank's whole output.
  ASSERT_EQ(tables->divide_segments.size(), 2u);
  EXPECT_EQ(tables->divide_segments[1].local_rank, 1);
  EXPECT_EQ(tables->divide_segments[1].first_chunk, 0);
  EXPECT_EQ(tables->divide_segments[1].chunks, 2);
  EXPECT_EQ(tables->largest_divide_chunks, 2);
}

TEST(ProgramTables, ALaunchOfOneRankIndexesItLocally) {
  const ef::Program p = exchange_program();
  auto tables = build_program_tables(p, {1}, {{{1, 0}, 0}}, {{{1, 0}, 0}}, nullptr, nullptr);
  ASSERT_TRUE(tables.is_ok()) << tables.status().message();
  ASSERT_EQ(tables->threadblocks.size(), 2u);
  EXPECT_EQ(tables->threadblocks[0].local_rank, 0);
  EXPECT_EQ(tables->threadblocks[0].rank, 1);
  EXPECT_EQ(tables->threadblocks[0].op_begin, 0u);
  EXPECT_EQ(tables->deps[0].flag, 1u);  // flags count from this launch's first rank
}

TEST(ProgramTables, PremulBitsPerMode) {
  const ef::Program p = exchange_program();
  ef::PremulMap outofplace(2), inplace(2);
  for (int r = 0; r < 2; ++r) {
    outofplace[r].assign(2, std::vector<ef::PremulFlags>(2));
    inplace[r].assign(2, std::vector<ef::PremulFlags>(2));
  }
  outofplace[0][0][0].src = true;  // rank 0's send reads pristine input out of place
  inplace[0][1][1].dst = true;
  auto tables = build_program_tables(p, {0, 1}, {{{0, 0}, 0}, {{1, 0}, 1}},
                                     {{{0, 0}, 0}, {{1, 0}, 1}}, &outofplace, &inplace);
  ASSERT_TRUE(tables.is_ok()) << tables.status().message();
  EXPECT_EQ(tables->ops[0].premul, kPremulSrc << kPremulShiftOutOfPlace);
  EXPECT_EQ(tables->ops[3].premul, kPremulDst << kPremulShiftInPlace);
  EXPECT_EQ(tables->ops[1].premul, 0);
}

TEST(ProgramTables, DirectModesAndPeersOfRanksSharingTheLaunch) {
  // Both ranks in one launch: rank 0's send writes straight into rank 1's output chunk 0 (its
  // recv's, which rank 1's copy reads only after the recv), and the threadblocks know where
  // their peers' buffers are (local indexes). One rank alone: nothing is direct.
  ef::Program p = exchange_program();
  p.outofplace = true;
  p.inplace = false;
  const ConnectionIndex ends = {{{0, 0}, 0}, {{1, 0}, 1}};
  auto both = build_program_tables(p, {0, 1}, ends, ends, nullptr, nullptr);
  ASSERT_TRUE(both.is_ok()) << both.status().message();
  const OpDesc& send0 = both->ops[0];
  EXPECT_EQ(send0.direct, kDirectPush << kDirectPushShift << kDirectShiftOutOfPlace);
  EXPECT_EQ(send0.push_buffer, kBufferOutput);
  EXPECT_EQ(send0.push_chunk, 0);
  EXPECT_EQ(both->ops[5].direct, kDirectPushed << kDirectShiftOutOfPlace);  // rank 1's recv
  EXPECT_EQ(both->threadblocks[0].send_local, 1);
  EXPECT_EQ(both->threadblocks[0].recv_local, 1);
  EXPECT_EQ(both->threadblocks[2].send_local, 0);
  EXPECT_EQ(both->threadblocks[1].send_local, -1);  // the copier has no peers

  auto alone = build_program_tables(p, {1}, {{{1, 0}, 0}}, {{{1, 0}, 0}}, nullptr, nullptr);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  for (const OpDesc& op : alone->ops) EXPECT_EQ(op.direct, 0);
  EXPECT_EQ(alone->threadblocks[0].send_local, -1);
  EXPECT_EQ(alone->threadblocks[0].recv_local, -1);
}

TEST(ProgramTables, DirectModesWithARankOfAnotherProcessOnTheGpu) {
  // Rank 0 alone in this launch, rank 1 in another process's launch on the same GPU (remote
  // rank 0 of the meeting): the same modes as one launch, and the peer as -2 - j.
  ef::Program p = exchange_program();
  p.outofplace = true;
  p.inplace = false;
  auto met = build_program_tables(p, {0}, {{{0, 0}, 0}}, {{{0, 0}, 0}}, nullptr, nullptr, {1});
  ASSERT_TRUE(met.is_ok()) << met.status().message();
  EXPECT_EQ(met->ops[0].direct, kDirectPush << kDirectPushShift << kDirectShiftOutOfPlace);
  EXPECT_EQ(met->threadblocks[0].send_local, -2);
  EXPECT_EQ(met->threadblocks[0].recv_local, -2);
  EXPECT_EQ(met->threadblocks[1].send_local, -1);
  // The other side, in its process: its recv finds the value pushed into its output.
  auto other = build_program_tables(p, {1}, {{{1, 0}, 0}}, {{{1, 0}, 0}}, nullptr, nullptr, {0});
  ASSERT_TRUE(other.is_ok()) << other.status().message();
  EXPECT_EQ(other->ops[1].direct, kDirectPushed << kDirectShiftOutOfPlace);
  // A remote rank that runs in the launch, or out of range, is refused.
  EXPECT_FALSE(build_program_tables(p, {0}, {{{0, 0}, 0}}, {{{0, 0}, 0}}, nullptr, nullptr, {0}));
  EXPECT_FALSE(build_program_tables(p, {0}, {{{0, 0}, 0}}, {{{0, 0}, 0}}, nullptr, nullptr, {2}));
}

TEST(ProgramTables, MultiRankOpsListTheirOperandsByLocalRank) {
  // Two ranks, each reducing its chunk of both inputs into both outputs (mrc).
  const ef::Program p = ef::test_builders::mrc_allreduce(2);
  auto tables = build_program_tables(p, {0, 1}, {}, {}, nullptr, nullptr);
  ASSERT_TRUE(tables) << tables.status().message();
  ASSERT_EQ(tables->ops.size(), 2u);
  ASSERT_EQ(tables->operands.size(), 8u);
  const OpDesc& second = tables->ops[1];
  EXPECT_EQ(second.code, kOpMultiReduceCopy);
  EXPECT_EQ(second.src_chunk, 4);   // its first operand
  EXPECT_EQ(second.pull_chunk, 2);  // sources
  EXPECT_EQ(second.push_chunk, 2);  // targets, after the sources
  const MultiOperand& target = tables->operands[7];
  EXPECT_EQ(target.local_rank, 1);
  EXPECT_EQ(target.buffer, kBufferOutput);
  EXPECT_EQ(target.chunk, 1);

  // A launch without one of the ranks an mrc names cannot run it.
  auto alone = build_program_tables(p, {1}, {}, {}, nullptr, nullptr);
  ASSERT_FALSE(alone);
  EXPECT_NE(alone.status().message().find("names rank 0's buffer, but that rank does not run "
                                          "in this launch"),
            std::string::npos)
      << alone.status().message();
}

TEST(ProgramTables, ReduceDividesOnlyAtTheRoot) {
  ef::Program p = exchange_program();
  p.collective = ef::Collective::kReduce;
  p.root = 1;
  auto tables = build_program_tables(p, {0, 1}, {{{0, 0}, 0}, {{1, 0}, 1}},
                                     {{{0, 0}, 0}, {{1, 0}, 1}}, nullptr, nullptr);
  ASSERT_TRUE(tables.is_ok());
  ASSERT_EQ(tables->divide_segments.size(), 1u);
  EXPECT_EQ(tables->divide_segments[0].local_rank, 1);
}

}  // namespace
}  // namespace efccl::device
