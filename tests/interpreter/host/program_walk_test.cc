// The walk the executor and the timing model share: which unit runs when, under a cost that
// takes no time (the executor's) and one that does (the timing model's), slots, dependencies
// and what a blocked threadblock reports.
#include "program_walk.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "program_builders.h"

namespace efccl::host {
namespace {

using ef::BufferKind;
using ef::BufferRef;
using ef::OpCode;

using ef::test_builders::make_op;
using ef::test_builders::make_tb;

/// Rank 0 sends three chunks to rank 1 in one op; rank 1 receives them in one op, and a second
/// threadblock of rank 1 waits for that receive with a nop.
ef::Program three_units() {
  ef::Program p;
  p.collective = ef::Collective::kCustom;
  p.nranks = 2;
  p.nchunksperloop = 3;
  p.ranks.resize(2);
  p.ranks[0].input_chunks = 3;
  p.ranks[1].output_chunks = 3;
  p.ranks[0].threadblocks = {
      make_tb(1, -1, {make_op(OpCode::kSend, BufferRef{BufferKind::kInput, 0}, {}, 3)})};
  p.ranks[1].threadblocks = {
      make_tb(-1, 0, {make_op(OpCode::kRecv, {}, BufferRef{BufferKind::kOutput, 0}, 3)}),
      make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 0, {{0, 0}})})};
  return p;
}

TileGeometry one_tile(uint64_t iterations = 1) {
  TileGeometry g;
  g.chunk_elements = iterations;
  g.stride_elements = 1;
  g.iterations = iterations;
  g.element_size = 4;
  return g;
}

/// Records every unit; each takes `unit_us` and every connection has `latency_us`.
class RecordingCost final : public UnitCost {
 public:
  RecordingCost(double unit_us, double latency_us) : unit_us_(unit_us), latency_us_(latency_us) {}
  double run(const WalkUnit& unit) override {
    runs.push_back("r" + std::to_string(unit.tb.rank) + "t" + std::to_string(unit.tb.tb) + "u" +
                   std::to_string(unit.tb.unit) + "@" + std::to_string(unit.ready));
    slots.push_back(ef::op_sends(unit.op.code) ? unit.push_slot : unit.pop_slot);
    return unit.ready + unit_us_;
  }
  double latency(std::size_t) const override { return latency_us_; }

  std::vector<std::string> runs;
  std::vector<std::size_t> slots;

 private:
  double unit_us_, latency_us_;
};

TEST(ProgramWalk, WithoutTimeTheLowestReadyThreadblockRunsFirst) {
  const ef::Program p = three_units();
  ProgramWalk walk(p, one_tile(), /*slots=*/2, /*timed=*/false);
  walk.prepare();
  ASSERT_EQ(walk.connections().size(), 1u);
  EXPECT_EQ(walk.connections()[0].capacity, 2u);
  RecordingCost cost(0, 0);
  EXPECT_TRUE(walk.run(cost).empty());
  // The sender fills both slots, then the receiver frees one at a time; the nop runs no unit.
  EXPECT_EQ(cost.runs, (std::vector<std::string>{"r0t0u0@0.000000", "r0t0u1@0.000000",
                                                 "r1t0u0@0.000000", "r0t0u2@0.000000",
                                                 "r1t0u1@0.000000", "r1t0u2@0.000000"}));
  EXPECT_EQ(cost.slots, (std::vector<std::size_t>{0, 1, 0, 0, 1, 0}));
}

TEST(ProgramWalk, TimedUnitsWaitForArrivalsFreedSlotsAndDependencies) {
  // Units take 1 us, connections 0.5 us. Sends: 0-1, 1-2, then the third waits for the first
  // slot, freed when the first receive ends (2.5) plus the latency: 3-4. Receives: 1.5-2.5,
  // 2.5-3.5, 4.5-5.5.
  const ef::Program p = three_units();
  ProgramWalk walk(p, one_tile(), /*slots=*/2, /*timed=*/true);
  walk.prepare();
  RecordingCost cost(1.0, 0.5);
  EXPECT_TRUE(walk.run(cost).empty());
  EXPECT_EQ(cost.runs, (std::vector<std::string>{"r0t0u0@0.000000", "r0t0u1@1.000000",
                                                 "r1t0u0@1.500000", "r1t0u1@2.500000",
                                                 "r0t0u2@3.000000", "r1t0u2@4.500000"}));
  // The nop waits for the receive's completion and takes no time.
  EXPECT_EQ(walk.finish_time(), 5.5);
}

TEST(ProgramWalk, SlotsAreBoundedByTheUnitsSent) {
  const ef::Program p = three_units();
  ProgramWalk walk(p, one_tile(4), /*slots=*/1 << 30, /*timed=*/true);
  walk.prepare();
  EXPECT_EQ(walk.connections()[0].capacity, 12u);  // 3 units in each of 4 iterations
  RecordingCost cost(1.0, 0.0);
  EXPECT_TRUE(walk.run(cost).empty());
  EXPECT_EQ(cost.runs.size(), 24u);
}

TEST(ProgramWalk, ABlockedThreadblockSaysWhatItWaitsFor) {
  ef::Program p = three_units();
  // Rank 1 receives only one of the three chunks: the sender waits for a free slot forever.
  p.ranks[1].threadblocks[0].ops[0].count = 1;
  ProgramWalk walk(p, one_tile(), /*slots=*/1, /*timed=*/false);
  walk.prepare();
  RecordingCost cost(0, 0);
  const std::vector<BlockedThreadblock> blocked = walk.run(cost);
  ASSERT_EQ(blocked.size(), 1u);
  EXPECT_EQ(blocked[0].rank, 0);
  EXPECT_EQ(blocked[0].waits_for, "a free slot on connection 0->1 channel 0 (all 1 slots full)");
  EXPECT_EQ(deadlock_status(blocked, 3).message(),
            "deadlock: 1 of 3 threadblocks blocked and none can progress\n"
            "rank 0 tb 0 op 0 iteration 0: waits for a free slot on connection 0->1 channel 0 "
            "(all 1 slots full)\n");

  // Without the send, the receiver waits for data and the nop for the receive.
  p.ranks[0].threadblocks[0].ops.clear();
  ProgramWalk starved(p, one_tile(), 1, false);
  starved.prepare();
  const std::vector<BlockedThreadblock> waiting = starved.run(cost);
  ASSERT_EQ(waiting.size(), 2u);
  EXPECT_EQ(waiting[0].waits_for, "data from rank 0 on channel 0 (connection empty)");
  EXPECT_EQ(waiting[1].waits_for, "dependency tb 0 op 0 to complete iteration 0");
}

}  // namespace
}  // namespace efccl::host
