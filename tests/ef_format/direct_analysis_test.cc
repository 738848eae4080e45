// Tests for ef::analyze_direct: which matched push/pop pairs may move their data straight
// between two ranks' buffers.
#include "efccl/ef/direct_analysis.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "efccl/ef/validate.h"
#include "program_builders.h"

namespace efccl::ef {
namespace {

using namespace test_builders;  // NOLINT(google-build-using-namespace): the suite's builders

/// One threadblock's modes, an op each, space separated: the pop's mode ('.' slot, 'L' pull,
/// 'W' pushed: already written) then the push's ('.' slot, 'l' pulled, 'w' push).
std::string modes_of(const DirectMap& map, std::size_t rank, std::size_t tb) {
  std::string s;
  for (const DirectFlags& f : map.at(rank).at(tb)) {
    if (!s.empty()) s += ' ';
    s += f.pop == DirectPop::kPull ? 'L' : f.pop == DirectPop::kPushed ? 'W' : '.';
    s += f.push == DirectPush::kPulled ? 'l' : f.push == DirectPush::kPush ? 'w' : '.';
  }
  return s;
}

const std::vector<bool> kBoth = {true, true};

/// Rank 0 sends input chunk 0 to rank 1, which runs `receiver` (one threadblock, recv = 0).
Program one_way(std::vector<Op> receiver, std::vector<Op> sender = {send(in(0))}) {
  Program p = make_program(Collective::kCustom, 2, 1);
  p.ranks[0].input_chunks = 1;
  p.ranks[0].output_chunks = 1;
  p.ranks[1].input_chunks = 1;
  p.ranks[1].output_chunks = 1;
  p.ranks[1].scratch_chunks = 1;
  p.ranks[0].threadblocks = {make_tb(1, -1, std::move(sender))};
  p.ranks[1].threadblocks = {make_tb(-1, 0, std::move(receiver))};
  p.postconditions = {{1, 0, {{0, 0}}}};  // validation wants one; the analysis ignores them
  return p;
}

TEST(DirectAnalysis, OutOfPlaceRingPullsTheInputAndPushesTheResult) {
  const Program p = ring_allreduce_2();
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, /*inplace=*/false, kBoth);
  // The first send's input chunk is never written: the peer's rrc reads it where it is. The
  // result lands in the peer's output chunk, which nothing else of the peer touches.
  EXPECT_EQ(modes_of(map, 0, 0), ".l L. .w W.");
  EXPECT_EQ(modes_of(map, 1, 0), ".l L. .w W.");
  const DirectFlags& pulled = map[0][0][1];
  ASSERT_TRUE(pulled.pull_from.has_value());
  EXPECT_EQ(*pulled.pull_from, in(0));  // rank 1's send(in(0))
  const DirectFlags& pusher = map[0][0][2];
  ASSERT_TRUE(pusher.push_to.has_value());
  EXPECT_EQ(*pusher.push_to, out(0));  // rank 1's recv(out(0))
}

TEST(DirectAnalysis, InPlaceRingIsDirectWhereTheAliasIsOrdered) {
  // In place, output chunk k is input chunk k. The first send's chunk is overwritten later by
  // the final recv, but only after the peer's rrc has read it (the rrc's threadblock sends the
  // result that the recv takes): pulled. The final recv's chunk was read by the peer's first
  // send, which happens before the result's send (its pop, then threadblock order): pushed.
  const DirectMap map = analyze_direct(ring_allreduce_2(), /*inplace=*/true, kBoth);
  EXPECT_EQ(modes_of(map, 0, 0), ".l L. .w W.");
  EXPECT_EQ(modes_of(map, 1, 0), ".l L. .w W.");
}

TEST(DirectAnalysis, AnOrderOnlyUnitByUnitCoversOnlyTheSameChunks) {
  // Rank 0 sends input chunks 0..1 (one op of two units) to rank 1's rrcs, which sends the
  // sums back to rank 0's recv. In place, rank 0's recv into output chunks 0..1 (input 0..1)
  // follows the send unit by unit only (push/pop edges): pulling the send's chunks is safe
  // exactly when the recv writes the same two chunks.
  const auto program = [](int64_t recv_at) {
    Program p = make_program(Collective::kAllReduce, 2, 4);
    for (auto& rank : p.ranks) rank.input_chunks = rank.output_chunks = 4;
    p.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0), 2)}),
                               make_tb(-1, 1, {recv(out(recv_at), 2)})};
    p.ranks[1].scratch_chunks = 2;
    p.ranks[1].threadblocks = {make_tb(0, 0, {rrcs(in(0), scratch(0), 2)})};
    return p;
  };
  const Program same = program(0);
  ASSERT_TRUE(validate(same).empty());
  EXPECT_EQ(modes_of(analyze_direct(same, true, kBoth), 0, 0), ".l");
  const Program shifted = program(1);  // writes chunks 1..2: unit 0 of the recv hits unit 1
  ASSERT_TRUE(validate(shifted).empty());
  EXPECT_EQ(modes_of(analyze_direct(shifted, true, kBoth), 0, 0), "..");
}

TEST(DirectAnalysis, OnlyRanksOfTheLaunchTakePart) {
  const Program p = ring_allreduce_2();
  for (const std::vector<bool>& marks :
       {std::vector<bool>{true, false}, std::vector<bool>{false, true}, std::vector<bool>{}}) {
    const DirectMap map = analyze_direct(p, false, marks);
    EXPECT_EQ(modes_of(map, 0, 0), ".. .. .. ..");
    EXPECT_EQ(modes_of(map, 1, 0), ".. .. .. ..");
  }
}

TEST(DirectAnalysis, FlaggedProtocolsAndPlacedConnectionsKeepTheSlots) {
  Program ll = ring_allreduce_2();
  ll.protocol = Protocol::kLL128;
  EXPECT_EQ(modes_of(analyze_direct(ll, false, kBoth), 0, 0), ".. .. .. ..");

  Program placed = ring_allreduce_2();
  placed.placements = {{0, 1, 0, SlotLocation::kHost, 0}};
  ASSERT_TRUE(validate(placed).empty());
  const DirectMap map = analyze_direct(placed, false, kBoth);
  // 0 -> 1 keeps its host slots (rank 0's pushes, rank 1's pops); 1 -> 0 is direct.
  EXPECT_EQ(modes_of(map, 0, 0), ".. L. .. W.");
  EXPECT_EQ(modes_of(map, 1, 0), ".l .. .w ..");
}

TEST(DirectAnalysis, ARecvIntoAFreshChunkIsPushed) {
  const Program p = one_way({recv(out(0))});
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, kBoth);
  EXPECT_EQ(modes_of(map, 0, 0), ".w");
  EXPECT_EQ(modes_of(map, 1, 0), "W.");
}

TEST(DirectAnalysis, ARecvIntoAChunkReadBeforeItIsPulledInstead) {
  // The receiver reads out(0) before its recv: a push could overwrite it first.
  const Program p = one_way({copy(out(0), scratch(0)), recv(out(0))});
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, kBoth);
  EXPECT_EQ(modes_of(map, 0, 0), ".l");
  EXPECT_EQ(modes_of(map, 1, 0), ".. L.");
  // Read after the recv in the same threadblock: the push is safe.
  const DirectMap after = analyze_direct(one_way({recv(out(0)), copy(out(0), scratch(0))}),
                                         false, kBoth);
  EXPECT_EQ(modes_of(after, 1, 0), "W. ..");
}

TEST(DirectAnalysis, AChunkAnotherThreadblockTouchesIsNotPushed) {
  Program p = one_way({recv(out(0))});
  p.ranks[1].threadblocks.push_back(make_tb(-1, -1, {copy(out(0), scratch(0))}));
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, kBoth);
  EXPECT_EQ(modes_of(map, 1, 0), "L.");  // the sender's input is never written: pulled
}

TEST(DirectAnalysis, ASourceWrittenAfterTheSendIsNotPulled) {
  // The sender overwrites its input chunk after the send: the receiver (rrc, never a push
  // target) must take the value from the slot.
  const Program p = one_way({rrc(in(0), out(0))}, {send(in(0)), copy(out(0), in(0))});
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, kBoth);
  EXPECT_EQ(modes_of(map, 0, 0), ".. ..");
  EXPECT_EQ(modes_of(map, 1, 0), "..");
  // Written before the send in its threadblock: pulled.
  const DirectMap before =
      analyze_direct(one_way({rrc(in(0), out(0))}, {copy(out(0), in(0)), send(in(0))}), false,
                     kBoth);
  EXPECT_EQ(modes_of(before, 0, 0), ".. .l");
  EXPECT_EQ(modes_of(before, 1, 0), "L.");
}

TEST(DirectAnalysis, TwoPairsJudgedApartDoNotRace) {
  // A review's counterexample (before the fix): X's input chunk is pulled by Y, and P later
  // receives into that chunk (after W, which follows Y), so with slots P's write follows Y's
  // read. But P's value comes through Q, which could push it straight into the chunk as soon
  // as A ran (after X), unordered with Y. Judged pair by pair, X->Y (pull) and Q->P (push)
  // were both direct and Y could read Q's sum. Each access now counts the direct moves of its
  // own pair in time (a pushed pop's write at its sender, a pulled push's read at its
  // receiver), so at most one of the two is direct.
  const Program p = direct_review_counterexample();
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, kBoth);
  const bool y_pulls = map[1][0][0].pop == DirectPop::kPull;
  const bool p_pushed = map[0][2][0].pop == DirectPop::kPushed;
  EXPECT_FALSE(y_pulls && p_pushed) << "rank 0: " << modes_of(map, 0, 0) << " | "
                                    << modes_of(map, 0, 2) << ", rank 1: "
                                    << modes_of(map, 1, 0) << " | " << modes_of(map, 1, 2);
  // As decided (pairs in connection order): Y keeps the slot; Q's value is pulled by P.
  EXPECT_EQ(modes_of(map, 1, 0), "..");
  EXPECT_EQ(modes_of(map, 1, 2), "Wl");
  EXPECT_EQ(modes_of(map, 0, 2), "L.");
}

TEST(DirectAnalysis, AValueOnlyInFlightIsNeverPulled) {
  // rrs holds its result nowhere; the receiver's rrc is no push target: both keep the slot.
  Program p = make_program(Collective::kCustom, 3, 1);
  for (auto& rank : p.ranks) rank.input_chunks = rank.output_chunks = 1;
  p.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0))})};
  p.ranks[1].threadblocks = {make_tb(2, 0, {rrs(in(0))})};
  p.ranks[2].threadblocks = {make_tb(-1, 1, {rrc(in(0), out(0))})};
  p.postconditions = {{2, 0, {{0, 0}, {1, 0}, {2, 0}}}};
  ASSERT_TRUE(validate(p).empty());
  const DirectMap map = analyze_direct(p, false, {true, true, true});
  EXPECT_EQ(modes_of(map, 0, 0), ".l");
  EXPECT_EQ(modes_of(map, 1, 0), "L.");
  EXPECT_EQ(modes_of(map, 2, 0), "..");
  // rrcs holds it in its dst: pulled from there.
  p.ranks[1].output_chunks = 1;
  p.ranks[1].threadblocks = {make_tb(2, 0, {rrcs(in(0), out(0))})};
  ASSERT_TRUE(validate(p).empty());
  const DirectMap held = analyze_direct(p, false, {true, true, true});
  EXPECT_EQ(modes_of(held, 1, 0), "Ll");
  EXPECT_EQ(modes_of(held, 2, 0), "L.");
  EXPECT_EQ(*held[2][0][0].pull_from, out(0));
}

}  // namespace
}  // namespace efccl::ef
