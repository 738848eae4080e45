// Tests for ef::validate and ef::location_of: a valid program passes every rule, one broken
// example per rule names that rule and the location, and hostile models never crash.
#include "efccl/ef/validate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "program_builders.h"

namespace efccl::ef {
namespace {

using namespace test_builders;

/// 2-rank ring allreduce, nchunksperloop 2: each rank reduces one chunk and forwards it.
Program ring_allreduce_2() {
  Program p = make_program(Collective::kAllReduce, 2, 2);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 2;
    const int other = 1 - r;
    rank.threadblocks = {make_tb(other, other,
                                 {send(in(other)), rrc(in(r), out(r)), send(out(r)),
                                  recv(out(other))})};
  }
  return p;
}

/// 3-rank ring allgather, nchunksperloop 3.
Program ring_allgather_3() {
  Program p = make_program(Collective::kAllGather, 3, 3);
  for (int r = 0; r < 3; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = 1;
    rank.output_chunks = 3;
    rank.threadblocks = {make_tb((r + 1) % 3, (r + 2) % 3,
                                 {copy(in(0), out(r)), send(in(0)), rcs(out((r + 2) % 3)),
                                  recv(out((r + 1) % 3))})};
  }
  return p;
}

/// Two ranks that each send `count` chunks to the other before receiving them.
Program send_before_receive(int64_t count) {
  Program p = make_program(Collective::kAllReduce, 2, count);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = count;
    rank.threadblocks = {make_tb(1 - r, 1 - r, {send(in(0), count), recv(out(0), count)})};
  }
  return p;
}

/// The first diagnostic of `rule`, or nullptr.
const Diagnostic* find_rule(const Diagnostics& diagnostics, std::string_view rule) {
  for (const Diagnostic& d : diagnostics)
    if (d.rule == rule) return &d;
  return nullptr;
}

std::string dump(const Diagnostics& diagnostics) {
  std::string out;
  for (const Diagnostic& d : diagnostics) out += d.to_string() + "\n";
  return out;
}

/// Validates and expects a diagnostic of `rule` at `location`; returns its message.
std::string expect_rule(const Program& p, std::string_view rule, std::string_view location,
                        const ValidateOptions& options = {}) {
  const Diagnostics diagnostics = validate(p, options);
  const Diagnostic* d = find_rule(diagnostics, rule);
  if (d == nullptr) {
    ADD_FAILURE() << "no [" << rule << "] diagnostic; got:\n" << dump(diagnostics);
    return {};
  }
  EXPECT_EQ(d->location, location) << dump(diagnostics);
  EXPECT_EQ(d->file, p.source.file);
  return d->message;
}

TEST(Validate, ValidProgramsPass) {
  EXPECT_EQ(dump(validate(ring_allreduce_2())), "");
  EXPECT_EQ(dump(validate(ring_allgather_3())), "");
  EXPECT_EQ(dump(validate(send_before_receive(8))), "");
}

TEST(Validate, ProgramShape) {
  Program p = ring_allreduce_2();
  p.nranks = 3;
  EXPECT_EQ(expect_rule(p, "program-shape", "/nranks"), "nranks is 3 but ranks lists 2 ranks");

  p = ring_allreduce_2();
  p.inplace = p.outofplace = false;
  expect_rule(p, "program-shape", "/inplace");

  p = ring_allreduce_2();
  p.min_bytes = 100;
  p.max_bytes = 50;
  EXPECT_EQ(expect_rule(p, "program-shape", "/min_bytes"),
            "min_bytes 100 is larger than max_bytes 50");

  p = ring_allreduce_2();
  p.root = 2;
  EXPECT_EQ(expect_rule(p, "program-shape", "/root"),
            "root is 2; expected 0: allreduce has no root");

  p = ring_allreduce_2();
  p.nchannels = 0;
  expect_rule(p, "program-shape", "/nchannels");
}

TEST(Validate, CollectiveShape) {
  Program p = ring_allreduce_2();
  p.ranks[1].output_chunks = 3;
  const std::string message = expect_rule(p, "collective-shape", "/ranks/1/output_chunks");
  EXPECT_NE(message.find("output_chunks is 3; expected 2"), std::string::npos) << message;

  // Output of 0 chunks is fine for an in-place-only allreduce, not otherwise.
  p = ring_allreduce_2();
  for (Rank& rank : p.ranks) {
    rank.output_chunks = 0;
    rank.threadblocks.clear();
  }
  expect_rule(p, "collective-shape", "/ranks/0/output_chunks");
  p.outofplace = false;
  EXPECT_EQ(find_rule(validate(p), "collective-shape"), nullptr);

  p = ring_allgather_3();
  p.nchunksperloop = 4;
  EXPECT_EQ(expect_rule(p, "collective-shape", "/nchunksperloop").find("nchunksperloop 4 is not "
                                                                         "a multiple of nranks 3"),
            0u);
}

TEST(Validate, PeerRange) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].send_peer = 0;
  expect_rule(p, "peer-range", "/ranks/0/threadblocks/0/send");

  p = ring_allreduce_2();
  p.ranks[1].threadblocks[0].recv_peer = 7;
  EXPECT_EQ(expect_rule(p, "peer-range", "/ranks/1/threadblocks/0/recv"),
            "recv peer is 7; expected -1 or a rank in 0..1");
}

TEST(Validate, ChannelRange) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].channel = 1;
  EXPECT_EQ(expect_rule(p, "channel-range", "/ranks/0/threadblocks/0/channel"),
            "channel is 1; expected 0..0 (nchannels 1)");
}

TEST(Validate, DuplicateConnection) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks.push_back(make_tb(1, -1, {}));
  EXPECT_EQ(expect_rule(p, "duplicate-connection", "/ranks/0/threadblocks/1/send"),
            "threadblocks 0 and 1 both send to rank 1 on channel 0; expected at most one");
}

TEST(Validate, OpPeer) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks.push_back(make_tb(-1, -1, {send(in(0))}));
  expect_rule(p, "op-peer", "/ranks/0/threadblocks/1/ops/0/op");
}

TEST(Validate, OpOperands) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].ops[0].src.reset();
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/0"),
            "send requires src, which is missing");

  p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].ops[3].src = in(0);
  expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/3/src");

  p = ring_allreduce_2();
  p.ranks[1].threadblocks[0].ops[2].count = 0;
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/1/threadblocks/0/ops/2/count"),
            "send has count 0; expected at least 1");

  p = ring_allreduce_2();
  p.ranks[1].threadblocks.push_back(make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 1)}));
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/1/threadblocks/1/ops/0/count"),
            "nop has count 1; expected 0");
}

TEST(Validate, MultiRankOps) {
  EXPECT_EQ(dump(validate(mrc_allreduce(2))), "");
  EXPECT_EQ(dump(validate(mrc_allreduce(4))), "");

  Program p = mrc_allreduce(2);
  p.ranks[0].threadblocks[0].ops[0].sources.clear();
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/0/sources"),
            "mrc has 0 sources; expected 1..16");

  p = mrc_allreduce(2);
  p.ranks[0].threadblocks[0].ops[0].targets[1].rank = 2;
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/0/targets"),
            "targets[1] names rank 2; expected 0..1");

  p = mrc_allreduce(2);
  p.ranks[1].threadblocks[0].ops[0].sources[0].buffer = BufferKind::kScratch;
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/1/threadblocks/0/ops/0/sources"),
            "sources[0] is in the scratch buffer; mrc reads input buffers and writes output "
            "buffers");

  p = mrc_allreduce(2);
  p.ranks[1].threadblocks[0].ops[0].targets[0].offset = 2;
  EXPECT_EQ(expect_rule(p, "buffer-range", "/ranks/1/threadblocks/0/ops/0/targets"),
            "targets[0] chunk 2 outside rank 0's output buffer of 2 chunks");

  p = mrc_allreduce(2);
  p.ranks[0].threadblocks[0].ops[0].src = in(0);
  expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/0/src");

  p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].ops[0].sources.push_back({0, BufferKind::kInput, 0});
  EXPECT_EQ(expect_rule(p, "op-operands", "/ranks/0/threadblocks/0/ops/0/sources"),
            "send takes no sources or targets (only mrc does)");

  Program too_many = mrc_allreduce(2);
  for (int k = 0; k < 16; ++k)
    too_many.ranks[0].threadblocks[0].ops[0].sources.push_back({1, BufferKind::kInput, 0});
  EXPECT_EQ(expect_rule(too_many, "op-operands", "/ranks/0/threadblocks/0/ops/0/sources"),
            "mrc has 18 sources; expected 1..16");
}

TEST(Validate, MultiRankExclusive) {
  // Another op writing a chunk an mrc reads: nothing orders them.
  Program p = mrc_allreduce(2);
  p.ranks[1].threadblocks.push_back(make_tb(-1, -1, {copy(in(1), out(0))}));
  const std::string message =
      expect_rule(p, "multi-rank-exclusive", "/ranks/0/threadblocks/0/ops/0/targets");
  EXPECT_NE(message.find("overlaps rank 1 tb 1 op 0 (copy)'s dst in rank 1's memory"),
            std::string::npos)
      << message;

  // Two mrc ops writing the same chunk.
  p = mrc_allreduce(2);
  p.ranks[1].threadblocks[0].ops[0].targets[0].offset = 0;
  expect_rule(p, "multi-rank-exclusive", "/ranks/1/threadblocks/0/ops/0/targets");

  // Within one op: two targets on the same chunk, a source meeting a target partly.
  p = mrc_allreduce(2);
  p.ranks[0].threadblocks[0].ops[0].targets[1] = {0, BufferKind::kOutput, 0};
  EXPECT_EQ(expect_rule(p, "multi-rank-exclusive", "/ranks/0/threadblocks/0/ops/0/targets"),
            "targets[0] and targets[1] overlap in rank 0's memory (out-of-place calls); "
            "expected targets apart from each other, and a source meeting a target only exactly");
  p = mrc_allreduce(2);
  for (Rank& rank : p.ranks) rank.input_chunks = rank.output_chunks = 4;
  p.nchunksperloop = 4;
  for (int r = 0; r < 2; ++r) {
    Op& op = p.ranks[static_cast<std::size_t>(r)].threadblocks[0].ops[0];
    op.count = 2;
    for (auto& ref : op.sources) ref.offset = 2 * r;
    for (auto& ref : op.targets) ref.offset = 2 * r;
  }
  EXPECT_EQ(dump(validate(p)), "");  // in place, each source is its own target: allowed
  p.ranks[0].threadblocks[0].ops[0].targets[0].offset = 1;  // rank 0 output 1..2 vs input 0..1
  p.outofplace = false;
  expect_rule(p, "multi-rank-exclusive", "/ranks/0/threadblocks/0/ops/0/targets");
}

TEST(Validate, BufferRange) {
  Program p = make_program(Collective::kCustom, 2, 256);
  p.ranks[0].input_chunks = 256;
  p.ranks[1].output_chunks = 256;
  p.ranks[0].threadblocks = {make_tb(1, -1, {send(in(250), 8)})};
  p.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0), 8)})};
  EXPECT_EQ(expect_rule(p, "buffer-range", "/ranks/0/threadblocks/0/ops/0/src"),
            "src chunks 250..257 outside input buffer of 256 chunks");

  // A buffer of 0 chunks holds nothing.
  p.ranks[0].threadblocks[0].ops[0] = send(BufferRef{BufferKind::kScratch, 0}, 8);
  EXPECT_EQ(expect_rule(p, "buffer-range", "/ranks/0/threadblocks/0/ops/0/src"),
            "src chunks 0..7 outside scratch buffer of 0 chunks");
}

TEST(Validate, ConnectionMismatch) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].ops[0].count = 2;
  p.ranks[0].threadblocks[0].ops[0].src = in(0);
  EXPECT_EQ(expect_rule(p, "connection-mismatch", "/ranks/0/threadblocks/0/ops/0/count"),
            "connection rank 0 -> rank 1 channel 0: 1st send (send) has count 2 but the matching "
            "receive (rrc) has count 1 (/ranks/1/threadblocks/0/ops/1)");

  p = ring_allreduce_2();
  p.ranks[1].threadblocks[0].ops.pop_back();
  EXPECT_EQ(expect_rule(p, "connection-mismatch", "/ranks/0/threadblocks/0/send"),
            "connection rank 0 -> rank 1 channel 0: 2 sends but 1 receives; expected the same "
            "number");

  p = ring_allreduce_2();
  p.nchannels = 2;
  p.ranks[0].threadblocks.push_back(make_tb(1, -1, {}, 1));
  expect_rule(p, "connection-mismatch", "/ranks/0/threadblocks/1/send");
}

TEST(Validate, ConnectionMismatchInXmlNamesTheMatchingStep) {
  Program p = ring_allreduce_2();
  p.source.format = SourceMap::Format::kMscclXml;
  p.source.file = "ring.xml";
  p.ranks[0].threadblocks[0].ops[2].count = 2;
  p.ranks[0].threadblocks[0].ops[2].src = out(0);
  p.ranks[0].output_chunks = 2;
  const std::string message =
      expect_rule(p, "connection-mismatch", "algo/gpu[id=0]/tb[id=0]/step[s=2]@cnt");
  EXPECT_NE(message.find("2nd send (send) has count 2 but the matching receive (recv) has "
                         "count 1 (algo/gpu[id=1]/tb[id=0]/step[s=3])"),
            std::string::npos)
      << message;
}

TEST(Validate, DependencyTarget) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks[0].ops[1].deps = {{1000000, 0}};
  EXPECT_EQ(expect_rule(p, "dependency-target", "/ranks/0/threadblocks/0/ops/1/deps"),
            "dependency on threadblock 1000000, but rank 0 has threadblocks 0..0");

  p = ring_allreduce_2();
  p.ranks[1].threadblocks[0].ops[3].deps = {{0, 9}};
  EXPECT_EQ(expect_rule(p, "dependency-target", "/ranks/1/threadblocks/0/ops/3/deps"),
            "dependency on op 9 of threadblock 0, which has ops 0..3");
}

TEST(Validate, DeadlockWhenBothRanksReceiveFirst) {
  Program p = make_program(Collective::kAllReduce, 2, 1);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 1;
    rank.threadblocks = {make_tb(1 - r, 1 - r, {recv(out(0)), send(in(0))})};
  }
  EXPECT_EQ(expect_rule(p, "deadlock", "/ranks/0/threadblocks/0/ops/0"),
            "ops wait for each other in a cycle (each must complete before the next can): "
            "rank 0 tb 0 op 0 (recv) -> rank 0 tb 0 op 1 (send) -> rank 1 tb 0 op 0 (recv) -> "
            "rank 1 tb 0 op 1 (send) -> back to rank 0 tb 0 op 0 (recv)");

  // Operand errors do not hide the cycle; the capacity check, which needs counts, is skipped.
  p.ranks[1].threadblocks[0].ops[1].src.reset();
  const Diagnostics diagnostics = validate(p);
  EXPECT_NE(find_rule(diagnostics, "op-operands"), nullptr) << dump(diagnostics);
  EXPECT_NE(find_rule(diagnostics, "deadlock"), nullptr) << dump(diagnostics);
}

TEST(Validate, DeadlockThroughADependencyOnALaterOp) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks.push_back(make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 0, {{0, 3}})}));
  p.ranks[0].threadblocks[0].ops[0].deps = {{1, 0}};
  const std::string message = expect_rule(p, "deadlock", "/ranks/0/threadblocks/0/ops/0");
  EXPECT_NE(message.find("rank 0 tb 1 op 0 (nop)"), std::string::npos) << message;
}

TEST(Validate, LongCycleListIsCapped) {
  // A ring of 64 ranks where every rank receives before it sends.
  const int n = 64;
  Program p = make_program(Collective::kAllReduce, n, 1);
  for (int r = 0; r < n; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 1;
    rank.threadblocks = {make_tb((r + 1) % n, (r + n - 1) % n, {recv(out(0)), send(in(0))})};
  }
  const std::string message = expect_rule(p, "deadlock", "/ranks/0/threadblocks/0/ops/0");
  EXPECT_NE(message.find("(128 ops in the cycle)"), std::string::npos) << message;
  EXPECT_LT(message.size(), 1000u);
}

TEST(Validate, CapacityNeedsAFreeSlotPerUnit) {
  EXPECT_EQ(dump(validate(send_before_receive(8))), "");
  const std::string message = expect_rule(send_before_receive(9), "capacity",
                                          "/ranks/0/threadblocks/0/ops/0");
  EXPECT_EQ(message,
            "with 8 slots per connection, 2 threadblocks block forever: rank 0 tb 0 op 0 (send) "
            "waits for a free slot on connection rank 0 -> rank 1 channel 0 (8 of 8 slots full), "
            "1 of 9 units left; rank 1 tb 0 op 0 (send) waits for a free slot on connection "
            "rank 1 -> rank 0 channel 0 (8 of 8 slots full), 1 of 9 units left");

  ValidateOptions more_slots;
  more_slots.connection_slots = 9;
  EXPECT_EQ(dump(validate(send_before_receive(9), more_slots)), "");
}

/// Rank 0 forwards (rrs) what rank 1 sends back to rank 1, which first sends `count` units and
/// then receives them: it finishes only while the two connections can buffer rank 1's sends.
Program echo(int64_t count) {
  Program p = make_program(Collective::kCustom, 2, 1);
  p.ranks[0].input_chunks = count;
  p.ranks[1].input_chunks = p.ranks[1].output_chunks = count;
  p.ranks[0].threadblocks = {
      make_tb(1, 1, {make_op(OpCode::kRecvReduceSend, in(0), std::nullopt, count)})};
  p.ranks[1].threadblocks = {make_tb(0, 0, {send(in(0), count), recv(out(0), count)})};
  p.postconditions = {{1, 0, {{1, 0}}}};
  return p;
}

TEST(Validate, CapacityCountsSlotsOfEveryConnectionOnTheWay) {
  EXPECT_EQ(dump(validate(echo(16))), "");  // 8 units wait in each connection
  const std::string message = expect_rule(echo(17), "capacity", "/ranks/0/threadblocks/0/ops/0");
  EXPECT_NE(message.find("rank 1 tb 0 op 0 (send) waits for a free slot"), std::string::npos)
      << message;
}

TEST(Validate, ChunkCountsAreBounded) {
  // 2^24 chunks per call and per buffer; more is refused by name, however the program was made.
  Program p = ring_allreduce_2();
  p.ranks[1].scratch_chunks = 1'000'000'000'000;
  EXPECT_EQ(expect_rule(p, "collective-shape", "/ranks/1/scratch_chunks"),
            "scratch_chunks is 1000000000000; expected at most 16777216 (2^24, the limit of valid "
            "programs)");
  p.ranks[1].scratch_chunks = kMaxChunks;
  EXPECT_EQ(dump(validate(p)), "");

  p = ring_allreduce_2();
  p.nchunksperloop = kMaxChunks + 1;
  EXPECT_EQ(expect_rule(p, "program-shape", "/nchunksperloop"),
            "nchunksperloop is 16777217; expected 1..16777216 (2^24, the limit of valid programs)");

  Program custom = make_program(Collective::kCustom, 2, 1);
  custom.ranks[0].input_chunks = kMaxChunks + 1;
  custom.ranks[1].output_chunks = int64_t{1} << 40;
  custom.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0))})};
  custom.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0))})};
  custom.postconditions = {{1, 0, {{0, 0}}}};
  const Diagnostics diagnostics = validate(custom);
  ASSERT_EQ(diagnostics.size(), 2u) << dump(diagnostics);
  EXPECT_EQ(diagnostics[0].location, "/ranks/0/input_chunks");
  EXPECT_EQ(diagnostics[1].location, "/ranks/1/output_chunks");
  EXPECT_NE(diagnostics[1].message.find("output_chunks is 1099511627776; expected at most"),
            std::string::npos);
}

TEST(Validate, CapacityWithHugeCountsIsFast) {
  // Streams of 10^12 units: finishing (or not) must not take 10^12 steps. Buffers that large
  // break the chunk limit, which is reported, and the capacity check still runs.
  const int64_t huge = 1'000'000'000'000;
  Program chain = make_program(Collective::kCustom, 3, 1);
  chain.ranks[0].input_chunks = huge;
  chain.ranks[1].output_chunks = huge;
  chain.ranks[2].output_chunks = huge;
  chain.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0), huge)})};
  chain.ranks[1].threadblocks = {
      make_tb(2, 0, {make_op(OpCode::kRecvCopySend, std::nullopt, out(0), huge)})};
  chain.ranks[2].threadblocks = {make_tb(-1, 1, {recv(out(0), huge)})};
  chain.postconditions = {{2, 0, {{0, 0}}}};
  const Diagnostics chain_diagnostics = validate(chain);
  EXPECT_EQ(chain_diagnostics.size(), 3u) << dump(chain_diagnostics);
  for (const Diagnostic& d : chain_diagnostics)
    EXPECT_NE(d.message.find("is 1000000000000; expected at most 16777216"), std::string::npos)
        << d.to_string();

  const std::string message = expect_rule(echo(huge), "capacity", "/ranks/0/threadblocks/0/ops/0");
  EXPECT_NE(message.find("units left"), std::string::npos) << message;
}

TEST(Validate, CapacityStaysRightWhenThreadblocksFinishWhileOthersStream) {
  // Rank 0 streams to rank 1 on four channels, one of them short: its threadblocks finish
  // while the others repeat the same slot pattern sweep after sweep (the periodic skip must
  // not compare snapshots taken before they left).
  for (const int64_t shortest : {1, 5, 9, 17}) {
    SCOPED_TRACE(shortest);
    Program p = make_program(Collective::kCustom, 2, 1);
    p.nchannels = 4;
    const int64_t counts[] = {shortest, 199, 199, 198};
    int64_t total = 0;
    for (int32_t c = 0; c < 4; ++c) {
      p.ranks[0].threadblocks.push_back(make_tb(1, -1, {send(in(total), counts[c])}, c));
      p.ranks[1].threadblocks.push_back(make_tb(-1, 0, {recv(out(total), counts[c])}, c));
      total += counts[c];
    }
    p.ranks[0].input_chunks = p.ranks[1].output_chunks = total;
    p.postconditions = {{1, 0, {{0, 0}}}};
    EXPECT_EQ(dump(validate(p)), "");
  }
}

TEST(Validate, CapacityReportsWhatADependencyWaitsFor) {
  // Rank 0's second threadblock waits for an op that never completes.
  Program p = send_before_receive(9);
  p.ranks[0].threadblocks.push_back(make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 0, {{0, 0}})}));
  const std::string message = expect_rule(p, "capacity", "/ranks/0/threadblocks/0/ops/0");
  EXPECT_NE(message.find("3 threadblocks block forever"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 tb 1 op 0 (nop) waits for its dependency tb 0 op 0"),
            std::string::npos)
      << message;
}

TEST(Validate, Postcondition) {
  Program p = ring_allreduce_2();
  p.postconditions = {{0, 0, {{0, 0}}}};
  expect_rule(p, "postcondition", "/postconditions");

  Program custom = make_program(Collective::kCustom, 2, 1);
  custom.ranks[0].input_chunks = 1;
  custom.ranks[1].output_chunks = 1;
  custom.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0))})};
  custom.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0))})};
  custom.postconditions = {{1, 0, {{0, 0}}}};
  EXPECT_EQ(dump(validate(custom)), "");

  custom.postconditions = {{1, 1, {{0, 0}}}};
  EXPECT_EQ(expect_rule(custom, "postcondition", "/postconditions/0"),
            "output chunk 1 outside the output buffer of 1 chunks of rank 1");
  custom.postconditions = {{1, 0, {{0, 0}, {5, 0}}}};
  expect_rule(custom, "postcondition", "/postconditions/0/sources/1");
  custom.postconditions = {{1, 0, {{0, 0}}}, {1, 0, {{0, 0}}}};
  expect_rule(custom, "postcondition", "/postconditions/1");
}

TEST(Validate, CustomNeedsAtLeastOnePostcondition) {
  // Without postconditions nothing defines a custom program's result: every run would pass.
  Program custom = make_program(Collective::kCustom, 2, 1);
  custom.ranks[0].input_chunks = 1;
  custom.ranks[1].output_chunks = 1;
  custom.ranks[0].threadblocks = {make_tb(1, -1, {send(in(0))})};
  custom.ranks[1].threadblocks = {make_tb(-1, 0, {recv(out(0))})};
  EXPECT_NE(expect_rule(custom, "postcondition", "/postconditions").find("at least one"),
            std::string::npos);
  custom.postconditions = {{1, 0, {{0, 0}}}};
  EXPECT_EQ(dump(validate(custom)), "");

  // The same (rank, index) twice, even with different sources, is rejected.
  custom.postconditions = {{1, 0, {{0, 0}}}, {1, 0, {{1, 0}}}};
  custom.ranks[1].input_chunks = 1;
  EXPECT_NE(expect_rule(custom, "postcondition", "/postconditions/1").find("already has"),
            std::string::npos);

  // An imported MSCCL custom program cannot carry postconditions: reported at coll.
  custom.postconditions.clear();
  custom.source.format = SourceMap::Format::kMscclXml;
  expect_rule(custom, "postcondition", "algo@coll");
}

TEST(Validate, RootMustBeZeroWithoutARootedCollective) {
  for (const Collective c : {Collective::kAllReduce, Collective::kAllGather,
                             Collective::kReduceScatter, Collective::kAllToAll,
                             Collective::kCustom}) {
    Program p = make_program(c, 2, 2);
    p.root = 1;  // a rank in range, but meaningless for this collective
    const Diagnostics d = validate(p);
    const Diagnostic* root = nullptr;
    for (const Diagnostic& x : d)
      if (x.location == "/root") root = &x;
    ASSERT_NE(root, nullptr) << to_string(c) << ": " << dump(d);
    EXPECT_EQ(root->rule, "program-shape");
    EXPECT_EQ(root->message,
              "root is 1; expected 0: " + std::string(to_string(c)) + " has no root");
  }
  // Rooted collectives accept any rank as root.
  for (const Collective c :
       {Collective::kBroadcast, Collective::kReduce, Collective::kGather, Collective::kScatter}) {
    Program p = make_program(c, 2, 2);
    p.root = 1;
    const Diagnostics d = validate(p);
    for (const Diagnostic& x : d) EXPECT_NE(x.location, "/root") << x.to_string();
  }
}

/// A nop depending on `deps` sends that trickle through 8 slots, 8 per sweep.
Program nop_after_many_sends(int deps) {
  Program p = make_program(Collective::kCustom, 2, 1);
  p.ranks[0].input_chunks = 1;
  p.ranks[1].output_chunks = 1;
  std::vector<Dependency> on_all;
  for (int i = 0; i < deps; ++i) on_all.push_back({1, i});
  p.ranks[0].threadblocks = {
      make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 0, std::move(on_all))}),
      make_tb(1, -1, std::vector<Op>(static_cast<std::size_t>(deps), send(in(0))))};
  p.ranks[1].threadblocks = {
      make_tb(-1, 0, std::vector<Op>(static_cast<std::size_t>(deps), recv(out(0))))};
  p.postconditions = {{1, 0, {{0, 0}}}};
  return p;
}

TEST(Validate, HugeDependencyListIsLinear) {
  // Rescanning the met head of the list on every visit is quadratic; a cursor is linear. Timed
  // against the same program 8x smaller on the same machine, the two sizes interleaved (best of
  // 5 each), so that a slow or loaded machine (sanitizers, CI, a load that comes and goes) does
  // not matter: linear grows ~8x, quadratic ~64x.
  const auto seconds = [](const Program& p) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(dump(validate(p)), "");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const Program small_program = nop_after_many_sends(25000);
  const Program large_program = nop_after_many_sends(200000);
  double small = 1e9, large = 1e9;
  for (int round = 0; round < 5; ++round) {
    small = std::min(small, seconds(small_program));
    large = std::min(large, seconds(large_program));
  }
  EXPECT_LT(large, 24 * small + 0.05) << "25000 dependencies: " << small << " s, 200000: " << large << " s";
}

TEST(Validate, Hasdep) {
  Program p = ring_allreduce_2();
  p.ranks[0].threadblocks.push_back(make_tb(-1, -1, {make_op(OpCode::kNop, {}, {}, 0, {{0, 1}})}));
  // Declared true without dependents is fine; so is an undeclared target (EF JSON).
  p.ranks[0].threadblocks[0].ops[0].declared_hasdep = true;
  EXPECT_EQ(dump(validate(p)), "");
  p.ranks[0].threadblocks[0].ops[1].declared_hasdep = false;
  p.source.format = SourceMap::Format::kMscclXml;
  p.source.file = "a.xml";
  const std::string message =
      expect_rule(p, "hasdep", "algo/gpu[id=0]/tb[id=0]/step[s=1]@hasdep");
  EXPECT_NE(message.find("hasdep=\"0\""), std::string::npos);
}

/// ring_allreduce_2 with both of its connections placed: 0 -> 1 on slot device 1, 1 -> 0 in
/// host memory.
Program placed_ring() {
  Program p = ring_allreduce_2();
  p.slot_devices = 2;
  p.placements = {{0, 1, 0, SlotLocation::kDevice, 1}, {1, 0, 0, SlotLocation::kHost, 0}};
  return p;
}

TEST(Validate, Placement) {
  EXPECT_EQ(dump(validate(placed_ring())), "");

  Program p = placed_ring();
  p.placements[1].channel = 3;
  EXPECT_EQ(expect_rule(p, "placement", "/connections/1"),
            "connection rank 1 -> rank 0 channel 3 does not exist: no threadblock of rank 1 "
            "sends to rank 0 on channel 3, none there receives from it");

  p = placed_ring();
  p.placements[0].receiver = 0;  // rank 0 -> rank 0: no such connection
  expect_rule(p, "placement", "/connections/0");

  p = placed_ring();
  p.placements[1] = p.placements[0];
  p.placements[1].location = SlotLocation::kHost;
  p.placements[1].device = 0;
  EXPECT_EQ(expect_rule(p, "placement", "/connections/1"),
            "connection rank 0 -> rank 1 channel 0 is placed twice (connections/0); expected one "
            "entry per connection");

  p = placed_ring();
  std::swap(p.placements[0], p.placements[1]);
  EXPECT_EQ(expect_rule(p, "placement", "/connections/1"),
            "connection rank 0 -> rank 1 channel 0 comes after connection rank 1 -> rank 0 "
            "channel 0; expected entries sorted by (sender, receiver, channel)");

  p = placed_ring();
  p.placements[0].device = 2;
  EXPECT_EQ(expect_rule(p, "placement", "/connections/0/device"),
            "connection rank 0 -> rank 1 channel 0: slot device 2; expected 0..1 (the program "
            "declares 2 slot devices)");
  p.placements[0].device = -1;
  expect_rule(p, "placement", "/connections/0/device");
  p = placed_ring();
  p.slot_devices = 0;  // a device placement needs a declared slot device
  expect_rule(p, "placement", "/connections/0/device");

  p = placed_ring();
  p.placements[1].device = 4;
  EXPECT_EQ(expect_rule(p, "placement", "/connections/1/device"),
            "connection rank 1 -> rank 0 channel 0: device 4 given with slots at the host; only "
            "slots on a device name one");

  p = placed_ring();
  p.placements[1].location = static_cast<SlotLocation>(9);
  EXPECT_EQ(expect_rule(p, "placement", "/connections/1/slots"),
            "connection rank 1 -> rank 0 channel 0: unknown slot location 9");

  for (int32_t bad : {-1, kMaxSlotDevices + 1}) {
    p = ring_allreduce_2();
    p.slot_devices = bad;
    EXPECT_EQ(expect_rule(p, "placement", "/slot_devices"),
              "slot_devices is " + std::to_string(bad) + "; expected 0..64");
  }
  p = ring_allreduce_2();
  p.slot_devices = kMaxSlotDevices;  // declared and unused: valid
  EXPECT_EQ(dump(validate(p)), "");
}

TEST(Validate, StopsAtMaxDiagnostics) {
  Program p = ring_allreduce_2();
  for (Rank& rank : p.ranks)
    for (Op& op : rank.threadblocks[0].ops) op.count = -1;
  EXPECT_GE(validate(p).size(), 8u);
  ValidateOptions options;
  options.max_diagnostics = 3;
  EXPECT_EQ(validate(p, options).size(), 3u);
  options.max_diagnostics = 0;  // still says that the program is invalid
  EXPECT_EQ(validate(p, options).size(), 1u);
}

TEST(Validate, HostileModelsProduceDiagnostics) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Program p = ring_allreduce_2();
  auto& ops = p.ranks[0].threadblocks[0].ops;
  ops[0].count = -5;
  ops[1].src = in(kMax - 1);
  ops[1].count = kMax;
  ops[2].src = BufferRef{static_cast<BufferKind>(77), 0};
  ops[3].deps = {{1000000, 0}, {0, -3}, {-1, std::numeric_limits<int32_t>::max()}};
  p.ranks[1].threadblocks[0].send_peer = 1 << 30;
  p.ranks[1].threadblocks[0].recv_peer = -(1 << 30);
  p.ranks[1].threadblocks[0].channel = std::numeric_limits<int32_t>::min();
  p.ranks[1].threadblocks[0].ops.push_back(make_op(static_cast<OpCode>(200), in(0), out(0)));
  p.ranks[1].input_chunks = -kMax;
  p.nchunksperloop = kMax;
  p.root = std::numeric_limits<int32_t>::min();
  const Diagnostics diagnostics = validate(p);
  std::set<std::string> rules;
  for (const Diagnostic& d : diagnostics) rules.insert(d.rule);
  for (const char* rule : {"program-shape", "collective-shape", "peer-range", "channel-range",
                           "op-operands", "buffer-range", "dependency-target"})
    EXPECT_TRUE(rules.count(rule)) << rule << "\n" << dump(diagnostics);

  Program empty;
  EXPECT_EQ(expect_rule(empty, "program-shape", "/nranks"), "nranks is 0; expected 1..4096");

  Program garbage = ring_allreduce_2();
  garbage.collective = static_cast<Collective>(99);
  garbage.nranks = -7;
  expect_rule(garbage, "program-shape", "/collective");
}

TEST(Validate, RandomMutationsNeverCrash) {
  const std::set<std::string> known = {"program-shape",
                                       "collective-shape",
                                       "peer-range",
                                       "channel-range",
                                       "duplicate-connection",
                                       "op-peer",
                                       "op-operands",
                                       "buffer-range",
                                       "connection-mismatch",
                                       "dependency-target",
                                       "deadlock",
                                       "capacity",
                                       "postcondition",
                                       "hasdep",
                                       "placement",
                                       "multi-rank-exclusive"};
  const int64_t extremes[] = {0, 1, -1, 2, 3, 1 << 30, std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::min()};
  std::mt19937 rng(12345);
  int invalid = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    Program p = iteration % 2 ? ring_allreduce_2() : ring_allgather_3();
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations; ++m) {
      Rank& rank = p.ranks[rng() % p.ranks.size()];
      Threadblock& tb = rank.threadblocks[0];
      Op& op = tb.ops[rng() % tb.ops.size()];
      const int64_t v = extremes[rng() % std::size(extremes)];
      if (rng() % 8 == 0) {  // placements: random connections, devices, order
        p.slot_devices = static_cast<int32_t>(rng() % 3) - 1;
        p.placements.push_back({static_cast<int32_t>(rng() % 4) - 1,
                                static_cast<int32_t>(rng() % 4) - 1, static_cast<int32_t>(v % 3),
                                static_cast<SlotLocation>(rng() % 4),
                                static_cast<int32_t>(rng() % 4) - 1});
      }
      switch (rng() % 12) {
        case 0: op.count = v; break;
        case 1: op.src = BufferRef{static_cast<BufferKind>(rng() % 4), v}; break;
        case 2: op.dst.reset(); break;
        case 3: op.deps.push_back({static_cast<int32_t>(v), static_cast<int32_t>(rng() % 5)}); break;
        case 4: tb.send_peer = static_cast<int32_t>(v); break;
        case 5: tb.channel = static_cast<int32_t>(v); break;
        case 6: op.code = static_cast<OpCode>(rng() % 11); break;
        case 7: rank.output_chunks = v; break;
        case 8: tb.ops.push_back(op); break;
        case 9: p.nchunksperloop = v; break;
        case 10:
          op.sources.push_back({static_cast<int32_t>(rng() % 5) - 1,
                                static_cast<BufferKind>(rng() % 4), v});
          break;
        case 11:
          op.targets.push_back({static_cast<int32_t>(v), static_cast<BufferKind>(rng() % 4),
                                static_cast<int64_t>(rng() % 4)});
          break;
      }
    }
    const Diagnostics diagnostics = validate(p);
    invalid += diagnostics.empty() ? 0 : 1;
    for (const Diagnostic& d : diagnostics) {
      EXPECT_TRUE(known.count(d.rule)) << d.to_string();
      EXPECT_FALSE(d.message.empty());
    }
  }
  EXPECT_GT(invalid, 2000);
}

TEST(LocationOf, JsonPointer) {
  Program p = ring_allreduce_2();
  p.source.format = SourceMap::Format::kJson;
  EXPECT_EQ(location_of(p, 1, 2, 3, "src"), "/ranks/1/threadblocks/2/ops/3/src");
  EXPECT_EQ(location_of(p, 1, 2, 3), "/ranks/1/threadblocks/2/ops/3");
  EXPECT_EQ(location_of(p, 1, 2, -1, "channel"), "/ranks/1/threadblocks/2/channel");
  EXPECT_EQ(location_of(p, 1, -1, 5, "input_chunks"), "/ranks/1/input_chunks");
  EXPECT_EQ(location_of(p, -1, -1, -1, "nranks"), "/nranks");
  EXPECT_EQ(location_of(p, -1, -1, -1), "");
}

TEST(LocationOf, MscclXmlPathWithLines) {
  Program p = ring_allreduce_2();
  p.source.format = SourceMap::Format::kMscclXml;
  p.source.rank_lines = {5, 20};
  p.source.tb_lines = {{6}, {21, 30}};
  p.source.op_lines = {{{7, 8}}, {{22}, {31, 32, 33}}};
  EXPECT_EQ(location_of(p, 1, 1, 2, "src"), "algo/gpu[id=1]/tb[id=1]/step[s=2]@srcoff (line 33)");
  EXPECT_EQ(location_of(p, 1, 1, 2, "count"), "algo/gpu[id=1]/tb[id=1]/step[s=2]@cnt (line 33)");
  EXPECT_EQ(location_of(p, 0, 0, 1, "deps"), "algo/gpu[id=0]/tb[id=0]/step[s=1]@depid (line 8)");
  EXPECT_EQ(location_of(p, 1, 0, -1, "channel"), "algo/gpu[id=1]/tb[id=0]@chan (line 21)");
  EXPECT_EQ(location_of(p, 1, -1, -1, "input_chunks"), "algo/gpu[id=1]@i_chunks (line 20)");
  EXPECT_EQ(location_of(p, -1, -1, -1, "nranks"), "algo@ngpus");
  EXPECT_EQ(location_of(p, 1, 1, -1), "algo/gpu[id=1]/tb[id=1] (line 30)");
  // Lines missing from the source map (or out of its range) are left out.
  EXPECT_EQ(location_of(p, 1, 1, 9, "dst"), "algo/gpu[id=1]/tb[id=1]/step[s=9]@dstoff");
  EXPECT_EQ(location_of(p, 3, 0, 0), "algo/gpu[id=3]/tb[id=0]/step[s=0]");
}

TEST(LocationOf, DiagnosticsUseTheSourceFormatAndFile) {
  Program p = ring_allreduce_2();
  p.source.format = SourceMap::Format::kMscclXml;
  p.source.file = "algos/ring.xml";
  p.source.op_lines = {{{7, 8, 9, 10}}, {{12, 13, 14, 15}}};
  p.ranks[1].threadblocks[0].ops[1].src = in(5);
  const Diagnostics diagnostics = validate(p);
  ASSERT_EQ(diagnostics.size(), 1u) << dump(diagnostics);
  EXPECT_EQ(diagnostics[0].to_string(),
            "algos/ring.xml: algo/gpu[id=1]/tb[id=0]/step[s=1]@srcoff (line 13): src chunk 5 "
            "outside input buffer of 2 chunks [buffer-range]");
}

}  // namespace
}  // namespace efccl::ef
