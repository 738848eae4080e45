// The automatic channel search (ch = -1): flows that would need one connection in two fused
// threadblocks go to different channels, so programs that needed explicit channels to fuse
// compile with -1 into programs that fuse, validate and verify; explicit channels, manual
// threadblock labels and instances keep their meaning.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "efccl/compiler/program_builder.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "symbolic_executor.h"

namespace efccl::compiler {
namespace {

using ef::OpCode;

int count_ops(const ef::Program& p, int rank, OpCode code) {
  int n = 0;
  for (const auto& tb : p.ranks[static_cast<std::size_t>(rank)].threadblocks) {
    for (const auto& op : tb.ops) n += op.code == code;
  }
  return n;
}

/// The channels of the threadblocks of `rank` that send to `peer`.
std::set<int> send_channels(const ef::Program& p, int rank, int peer) {
  std::set<int> out;
  for (const auto& tb : p.ranks[static_cast<std::size_t>(rank)].threadblocks) {
    if (tb.send_peer == peer) out.insert(tb.channel);
  }
  return out;
}

/// Validation, the symbolic oracle and the host executor in every mode the program allows.
void expect_correct(const ef::Program& p, const std::string& what) {
  const auto diags = ef::validate(p);
  ASSERT_TRUE(diags.empty()) << what << ": " << diags.front().to_string();
  const auto modes = host::allowed_inplace_modes(p);
  ASSERT_FALSE(modes.empty()) << what;
  for (bool mode : modes) {
    EXPECT_EQ(efccl::testing::symbolic_check(p, mode, 5), "") << what << " inplace=" << mode;
    for (auto [dtype, op] : {std::pair{ef::DataType::kFloat32, ef::RedOp::kSum},
                             std::pair{ef::DataType::kInt32, ef::RedOp::kProd}}) {
      host::ExecOptions ex;
      ex.inplace = mode;
      ex.dtype = dtype;
      ex.op = op;
      ex.count = ef::count_granularity(p) * 2;
      ex.slot_bytes = 4;
      const auto v = host::run_and_verify(p, ex, 11);
      EXPECT_TRUE(v.pass) << what << " inplace=" << mode << ": " << v.message;
    }
  }
}

std::unique_ptr<ProgramBuilder> custom(int n, int64_t chunks, int instances = 1) {
  auto b = std::make_unique<ProgramBuilder>("t", ef::Collective::kCustom, n, chunks, false,
                                            ef::Protocol::kSimple, instances);
  for (int r = 0; r < n; ++r) b->set_buffer_sizes(r, chunks, chunks);
  return b;
}

/// Ranks 0 and 3 each send one chunk to rank 2 through rank 1 (a relay), on channels `a` and
/// `b` (-1: automatic).
StatusOr<ef::Program> relay(int a, int b, int instances = 1) {
  auto p = custom(4, 2, instances);
  p->set_postconditions({{2, 0, {{0, 0}}}, {2, 1, {{3, 1}}}});
  p->chunk(0, kInput, 0).copy(1, kScratch, 0, -1, -1, a).copy(2, kOutput, 0, -1, -1, a);
  p->chunk(3, kInput, 1).copy(1, kScratch, 1, -1, -1, b).copy(2, kOutput, 1, -1, -1, b);
  return p->compile();
}

TEST(ChannelSearch, RelayedFlowsGetTheirOwnChannelsAndFuse) {
  // One channel: the relay's two flows would need the connection to rank 2 in two fused
  // threadblocks, so one stays a separate receive and send (what ch = -1 used to give).
  auto one = relay(0, 0);
  ASSERT_TRUE(one) << one.status().message();
  EXPECT_EQ(count_ops(*one, 1, OpCode::kRecvCopySend), 1);
  EXPECT_EQ(one->nchannels, 1);
  // Automatic: the second flow finds channel 0 taken at rank 1 and takes channel 1.
  auto automatic = relay(-1, -1);
  ASSERT_TRUE(automatic) << automatic.status().message();
  EXPECT_EQ(count_ops(*automatic, 1, OpCode::kRecvCopySend), 2);
  EXPECT_EQ(count_ops(*automatic, 1, OpCode::kRecv), 0);
  EXPECT_EQ(automatic->nchannels, 2);
  EXPECT_EQ(send_channels(*automatic, 1, 2), (std::set<int>{0, 1}));
  expect_correct(*automatic, "automatic");
  // The same program as placing the channels by hand.
  auto manual = relay(0, 1);
  ASSERT_TRUE(manual) << manual.status().message();
  EXPECT_EQ(ef::save_json(*manual), ef::save_json(*automatic));
}

TEST(ChannelSearch, FlowsSharingTheFirstHopSplitAtTheRelay) {
  // Rank 0 sends chunk 0 to rank 2 and chunk 1 to rank 3, both through rank 1.
  auto b = custom(4, 2);
  b->set_postconditions({{2, 0, {{0, 0}}}, {3, 1, {{0, 1}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0).copy(2, kOutput, 0);
  b->chunk(0, kInput, 1).copy(1, kScratch, 1).copy(3, kOutput, 1);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 2);
  EXPECT_EQ(send_channels(*p, 0, 1), (std::set<int>{0, 1}));
  expect_correct(*p, "two paths");
}

TEST(ChannelSearch, FlowsThatAgreeShareAChannel) {
  // A ring allgather: every flow through rank x receives from x-1 and sends to x+1, so all
  // flows fit on channel 0 (the lowest channel is taken whenever nothing conflicts).
  const int n = 5;
  ProgramBuilder b("ag", ef::Collective::kAllGather, n, 2);
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 2; ++k) {
      Ref c = b.chunk(r, kInput, k).copy(r, kOutput, 2 * r + k);
      for (int s = 1; s < n; ++s) c = c.copy((r + s) % n, kOutput, 2 * r + k);
    }
  }
  auto p = b.compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->nchannels, 1);
  for (int r = 0; r < n; ++r) EXPECT_EQ(count_ops(*p, r, OpCode::kRecvCopySend), 2 * (n - 2));
  expect_correct(*p, "ring");
}

TEST(ChannelSearch, ExplicitChannelsAreHonoured) {
  // Explicit channels stay where they are, even when a lower one would do.
  auto explicit_only = relay(3, 5);
  ASSERT_TRUE(explicit_only) << explicit_only.status().message();
  EXPECT_EQ(send_channels(*explicit_only, 1, 2), (std::set<int>{3, 5}));
  EXPECT_EQ(explicit_only->nchannels, 6);
  expect_correct(*explicit_only, "explicit");
  // A flow with one explicit member: the automatic members join its channel and fuse.
  auto b = custom(3, 1);
  b->set_postconditions({{2, 0, {{0, 0}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0, -1, -1, 2).copy(2, kOutput, 0);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 1);
  EXPECT_EQ(send_channels(*p, 1, 2), (std::set<int>{2}));
  expect_correct(*p, "mixed");
  // An automatic flow avoids the channel an explicit flow binds in a conflicting way.
  auto mixed = relay(0, -1);
  ASSERT_TRUE(mixed) << mixed.status().message();
  EXPECT_EQ(send_channels(*mixed, 1, 2), (std::set<int>{0, 1}));
  EXPECT_EQ(count_ops(*mixed, 1, OpCode::kRecvCopySend), 2);
}

TEST(ChannelSearch, InstancesOffsetTheSearchedChannels) {
  auto p = relay(-1, -1, 3);
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->nchannels, 6);  // two channels per instance
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 6);
  expect_correct(*p, "instances");
}

TEST(ChannelSearch, LabelledOpsKeepChannelZero) {
  // MSCCLang's manual threadblock policy leaves unplaced ops on channel 0: the labelled flow
  // stays there and the automatic one moves out of its way.
  auto b = custom(4, 2);
  b->set_postconditions({{2, 0, {{0, 0}}}, {2, 1, {{3, 1}}}});
  b->chunk(0, kInput, 0).copy(1, kScratch, 0, 4, 4).copy(2, kOutput, 0, 4, 4);
  b->chunk(3, kInput, 1).copy(1, kScratch, 1).copy(2, kOutput, 1);
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(send_channels(*p, 0, 1), (std::set<int>{0}));
  EXPECT_EQ(send_channels(*p, 3, 1), (std::set<int>{1}));
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvCopySend), 2);
  expect_correct(*p, "labels");
}

TEST(ChannelSearch, ReductionFlowsFuseIntoRrsOnTheirOwnChannels) {
  // Two reduction chains end at rank 2 through rank 1: 0 -> 1 -> 2 and 3 -> 1 -> 2.
  auto b = custom(4, 2);
  b->set_postconditions({{2, 0, {{0, 0}, {1, 0}, {2, 0}}}, {2, 1, {{3, 1}, {1, 1}, {2, 1}}}});
  for (int k = 0; k < 2; ++k) {
    Ref part = b->chunk(1, kInput, k).reduce_into(b->chunk(k == 0 ? 0 : 3, kInput, k), kScratch, k);
    b->chunk(2, kInput, k).reduce_into(part, kOutput, k);
  }
  auto p = b->compile();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(count_ops(*p, 1, OpCode::kRecvReduceSend), 2);
  EXPECT_EQ(p->ranks[1].scratch_chunks, 0);
  expect_correct(*p, "reductions");
}

}  // namespace
}  // namespace efccl::compiler
