// Tests for ef::analyze_premul: which operand reads see a rank's own, never-written input.
#include "efccl/ef/premul_analysis.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "efccl/ef/validate.h"
#include "program_builders.h"

namespace efccl::ef {
namespace {

using namespace test_builders;  // NOLINT(google-build-using-namespace): the suite's builders

/// Flags as "S" (src pristine), "D" (dst pristine), "-" (neither) per op of one threadblock.
std::string flags_of(const PremulMap& map, std::size_t rank, std::size_t tb) {
  std::string out;
  for (const PremulFlags& f : map.at(rank).at(tb)) {
    if (!out.empty()) out += ' ';
    out += f.src ? (f.dst ? "SD" : "S") : (f.dst ? "D" : "-");
  }
  return out;
}

TEST(PremulAnalysis, OutOfPlaceRingAllReduce) {
  const Program p = ring_allreduce_2();
  ASSERT_TRUE(validate(p).empty());
  const PremulMap map = analyze_premul(p, /*inplace=*/false);
  ASSERT_EQ(map.size(), 2u);
  // The first send and the rrc read pristine input; the result send reads the output buffer.
  EXPECT_EQ(flags_of(map, 0, 0), "S S - -");
  EXPECT_EQ(flags_of(map, 1, 0), "S S - -");
}

TEST(PremulAnalysis, InPlaceRingAllReduce) {
  const PremulMap map = analyze_premul(ring_allreduce_2(), /*inplace=*/true);
  // In place, output chunk r is input chunk r: the rrc's own write happens after its read, but
  // the later send of the result reads a written chunk.
  EXPECT_EQ(flags_of(map, 0, 0), "S S - -");
  EXPECT_EQ(flags_of(map, 1, 0), "S S - -");
}

TEST(PremulAnalysis, InPlaceReadOfOutputAliasIsPristine) {
  // In place, reading output chunk k is reading input chunk k.
  Program p = make_program(Collective::kAllReduce, 2, 1);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 1;
    rank.threadblocks = {make_tb(1 - r, 1 - r, {send(out(0)), rrc(out(0), out(0))})};
  }
  ASSERT_TRUE(validate(p).empty());
  EXPECT_EQ(flags_of(analyze_premul(p, true), 0, 0), "S S");
  EXPECT_EQ(flags_of(analyze_premul(p, false), 0, 0), "- -");
}

/// Rank 0 reduces input chunk 1 into input chunk 0 (threadblock 0) and sends input chunks 0 and
/// 1 to rank 1 (threadblock 1), the send of chunk 0 ordered after the reduce only when
/// `ordered`.
Program reduce_then_send(bool ordered) {
  Program p = make_program(Collective::kCustom, 2, 2);
  p.ranks[0].input_chunks = 2;
  p.ranks[1].output_chunks = 2;
  std::vector<Dependency> deps;
  if (ordered) deps = {{0, 0}};
  p.ranks[0].threadblocks = {make_tb(-1, -1, {reduce(in(1), in(0))}),
                             make_tb(1, -1, {send(in(0), 1, deps), send(in(1))})};
  p.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0)), recv(out(1))})};
  p.postconditions = {{1, 1, {{0, 1}}}};  // custom programs need one (validate)
  return p;
}

TEST(PremulAnalysis, DependencyOrdersAWriteBeforeARead) {
  const Program p = reduce_then_send(true);
  ASSERT_TRUE(validate(p).empty());
  const PremulMap map = analyze_premul(p, false);
  EXPECT_EQ(flags_of(map, 0, 0), "SD");   // the reduce reads both operands pristine
  EXPECT_EQ(flags_of(map, 0, 1), "- S");  // chunk 0 was written; chunk 1 only read
  EXPECT_EQ(flags_of(map, 1, 0), "- -");  // receives read nothing
}

TEST(PremulAnalysis, UnorderedWriteDoesNotCount) {
  // Without the dependency the reduce does not happen before the send.
  EXPECT_EQ(flags_of(analyze_premul(reduce_then_send(false), false), 0, 1), "S S");
}

TEST(PremulAnalysis, ARangeWithAWrittenChunkIsNotPristine) {
  Program p = reduce_then_send(true);
  p.ranks[0].threadblocks[1].ops = {send(in(0), 2, {{0, 0}})};
  p.ranks[1].threadblocks[0].ops = {recv(out(0), 2)};
  ASSERT_TRUE(validate(p).empty());
  const PremulMap map = analyze_premul(p, false);
  EXPECT_EQ(flags_of(map, 0, 1), "-");
  // Chunk 0 written, chunk 1 pristine: the operand is mixed, and the description names it.
  EXPECT_TRUE(map[0][1][0].src_mixed);
  EXPECT_FALSE(map[0][1][0].dst_mixed);
  EXPECT_FALSE(map[0][0][0].src_mixed || map[0][0][0].dst_mixed);
  EXPECT_EQ(describe_mixed_operand(p, map, false),
            "rank 0 tb 1 op 0 (send): src reads input chunks 0..1 of which some are already "
            "written: premulsum/avg cannot scale it; split the op");
}

TEST(PremulAnalysis, SplitOrUniformRangesAreNotMixed) {
  // The split version (one op per chunk) has no mixed operand; neither has a range all
  // written or all pristine.
  const Program split = reduce_then_send(true);
  const PremulMap map = analyze_premul(split, false);
  for (const auto& tb : map[0])
    for (const PremulFlags& f : tb) EXPECT_FALSE(f.src_mixed || f.dst_mixed);
  EXPECT_EQ(describe_mixed_operand(split, map, false), "");

  Program all_written = reduce_then_send(true);
  all_written.ranks[0].threadblocks[0].ops = {copy(in(0), in(1)), reduce(in(1), in(0))};
  all_written.ranks[0].threadblocks[1].ops = {send(in(0), 2, {{0, 1}})};
  all_written.ranks[1].threadblocks[0].ops = {recv(out(0), 2)};
  ASSERT_TRUE(validate(all_written).empty());
  const PremulMap written = analyze_premul(all_written, false);
  EXPECT_FALSE(written[0][1][0].src || written[0][1][0].src_mixed);

  Program unordered = reduce_then_send(false);  // the write does not happen before the read
  unordered.ranks[0].threadblocks[1].ops = {send(in(0), 2)};
  unordered.ranks[1].threadblocks[0].ops = {recv(out(0), 2)};
  const PremulMap pristine = analyze_premul(unordered, false);
  EXPECT_TRUE(pristine[0][1][0].src);
  EXPECT_FALSE(pristine[0][1][0].src_mixed);
}

TEST(PremulAnalysis, InPlaceRangeReachingPastTheInputIsMixed) {
  // Custom in place: rank 0's output (2 chunks) aliases its input (1 chunk) at chunk 0, so a
  // send of output chunks 0..1 reads a pristine input chunk together with a non-input chunk.
  Program p = make_program(Collective::kCustom, 2, 1);
  p.inplace = true;
  p.outofplace = true;
  p.ranks[0].input_chunks = 1;
  p.ranks[0].output_chunks = 2;
  p.ranks[1].output_chunks = 2;
  p.ranks[0].threadblocks = {make_tb(1, -1, {send(out(0), 2)})};
  p.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0), 2)})};
  p.postconditions = {{1, 0, {{0, 0}}}};
  ASSERT_TRUE(validate(p).empty());
  const PremulMap inplace = analyze_premul(p, true);
  EXPECT_TRUE(inplace[0][0][0].src_mixed);
  EXPECT_EQ(describe_mixed_operand(p, inplace, true),
            "rank 0 tb 0 op 0 (send): src (output chunks 0..1, in place) reads input chunks 0..0 "
            "together with chunks outside the input: premulsum/avg cannot scale it; split the op");
  const PremulMap outofplace = analyze_premul(p, false);
  EXPECT_FALSE(outofplace[0][0][0].src_mixed);
  EXPECT_EQ(describe_mixed_operand(p, outofplace, false), "");
}

TEST(PremulAnalysis, HappensBeforeCrossesRanks) {
  // Rank 0 overwrites input chunk 0, then sends to rank 1, which answers; the copy after the
  // answer reads the written chunk although no dependency links the two threadblocks.
  Program p = make_program(Collective::kCustom, 2, 2);
  p.ranks[0].input_chunks = 2;
  p.ranks[0].output_chunks = 2;
  p.ranks[1].output_chunks = 1;
  p.ranks[0].threadblocks = {make_tb(1, -1, {copy(in(1), in(0)), send(in(1))}),
                             make_tb(-1, 1, {recv(out(1)), copy(in(0), out(0)), copy(in(1), out(0))})};
  p.ranks[1].threadblocks = {make_tb(0, 0, {recv(out(0)), send(out(0))})};
  p.postconditions = {{1, 0, {{0, 1}}}};
  ASSERT_TRUE(validate(p).empty());
  const PremulMap map = analyze_premul(p, false);
  EXPECT_EQ(flags_of(map, 0, 0), "S S");
  EXPECT_EQ(flags_of(map, 0, 1), "- - S");
}

/// 3-rank ring allgather that sends its own block from the output buffer.
Program ring_allgather_from_output() {
  Program p = make_program(Collective::kAllGather, 3, 3);
  for (int r = 0; r < 3; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = 1;
    rank.output_chunks = 3;
    rank.threadblocks = {make_tb((r + 1) % 3, (r + 2) % 3,
                                 {send(out(r)), rcs(out((r + 2) % 3)), recv(out((r + 1) % 3)),
                                  copy(out((r + 1) % 3), scratch(0))})};
    rank.scratch_chunks = 1;
  }
  return p;
}

TEST(PremulAnalysis, AllGatherInPlaceAliasesOwnBlock) {
  const Program p = ring_allgather_from_output();
  ASSERT_TRUE(validate(p).empty());
  // In place, rank r's input chunk 0 is output chunk r; other output chunks are not input.
  const PremulMap inplace = analyze_premul(p, true);
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(flags_of(inplace, r, 0), "S - - -") << r;
  const PremulMap outofplace = analyze_premul(p, false);
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(flags_of(outofplace, r, 0), "- - - -") << r;
}

TEST(PremulAnalysis, ReduceScatterInPlaceWritesTheOwnBlockOfTheInput) {
  // Rank r reduces block r into output chunk 0, which in place is input chunk r.
  Program p = make_program(Collective::kReduceScatter, 2, 2);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = 2;
    rank.output_chunks = 1;
    rank.scratch_chunks = 1;
    rank.threadblocks = {make_tb(1 - r, 1 - r, {send(in(1 - r)), rrc(in(r), out(0)),
                                                copy(in(r), scratch(0))})};
  }
  ASSERT_TRUE(validate(p).empty());
  EXPECT_EQ(flags_of(analyze_premul(p, true), 1, 0), "S S -");
  EXPECT_EQ(flags_of(analyze_premul(p, false), 1, 0), "S S S");
}

TEST(PremulAnalysis, ResultHasTheProgramsShape) {
  Program p = ring_allreduce_2();
  p.ranks[1].threadblocks.push_back(make_tb(-1, -1, {}));
  const PremulMap map = analyze_premul(p, false);
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map[0].size(), 1u);
  ASSERT_EQ(map[1].size(), 2u);
  EXPECT_EQ(map[1][0].size(), 4u);
  EXPECT_TRUE(map[1][1].empty());
}

TEST(PremulAnalysis, InvalidProgramsDoNotCrash) {
  // A wait-for cycle, out-of-range references, peers and dependencies: the analysis must stay
  // safe (the flags of such programs carry no meaning).
  Program p = ring_allreduce_2();
  auto& ops = p.ranks[0].threadblocks[0].ops;
  ops[0].deps = {{0, 3}, {1000000, 0}, {0, -1}};
  ops[1].src = in(std::numeric_limits<int64_t>::max());
  ops[1].count = std::numeric_limits<int64_t>::max();
  ops[2].src = BufferRef{static_cast<BufferKind>(9), 0};
  p.ranks[1].threadblocks[0].send_peer = 1 << 30;
  p.ranks[1].input_chunks = -4;
  p.nchunksperloop = 0;
  const PremulMap map = analyze_premul(p, true);
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(flags_of(map, 0, 0), "- - - -");  // all on the cycle
  p.collective = static_cast<Collective>(77);
  EXPECT_EQ(analyze_premul(p, true).size(), 2u);
}

TEST(PremulAnalysis, LongChainTakesSeveralBitsetBatches) {
  // Op k reads chunk k, which op k-1 wrote, and reduces it into chunk k+1. 40000 ops and as
  // many tracked chunks exceed one batch of the bitset budget, so several passes are needed.
  const int n = 40000;
  Program p = make_program(Collective::kCustom, 1, n + 1);
  p.ranks[0].input_chunks = n + 1;
  p.ranks[0].output_chunks = 1;
  p.postconditions = {{0, 0, {{0, 0}}}};
  std::vector<Op> ops;
  for (int k = 0; k < n; ++k) ops.push_back(reduce(in(k), in(k + 1)));
  p.ranks[0].threadblocks = {make_tb(-1, -1, std::move(ops))};
  ASSERT_TRUE(validate(p).empty());
  const PremulMap map = analyze_premul(p, false);
  const auto& flags = map[0][0];
  ASSERT_EQ(flags.size(), static_cast<std::size_t>(n));
  EXPECT_TRUE(flags[0].src && flags[0].dst);
  for (int k = 1; k < n; ++k) {
    ASSERT_FALSE(flags[k].src) << k;
    ASSERT_TRUE(flags[k].dst) << k;
  }
}

}  // namespace
}  // namespace efccl::ef
