// The meeting of launches of different processes on one GPU (interpreter/device/src/
// cross_process.h), without a GPU: which locations a device's launch meets and in which slots,
// when the plan stays off, and what a call publishes.
#include "cross_process.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"

namespace efccl::device {
namespace {

ef::Program ring(int n) {
  algorithms::AlgorithmParams params;
  params.ranks = n;
  auto p = algorithms::generate_algorithm("ring_allreduce", params);
  EXPECT_TRUE(p) << p.status().message();
  return p ? *p : ef::Program{};
}

std::vector<ConnectionPlan> connections_of(const ef::Program& p) {
  auto c = plan_connections(p);
  EXPECT_TRUE(c) << c.status().message();
  return c ? *c : std::vector<ConnectionPlan>{};
}

TEST(CrossProcess, ThreeProcessesOfARingOnOneGpuAllMeet) {
  // Ranks 0..3, one per process (locations 10..13); ranks 0, 1, 2 on GPU "a", rank 3 on "b"
  // in a 3-rank ring (every two processes joined): each meets the other two.
  const ef::Program p = ring(3);
  const auto connections = connections_of(p);
  const std::vector<int64_t> location = {10, 11, 12};
  const std::vector<std::string> gpus = {"a", "a", "a"};
  std::string why;
  XprocPlan plan = plan_xproc(p, {0}, location, gpus, connections, &why);
  ASSERT_TRUE(plan.enabled) << why;
  EXPECT_EQ(plan.locations, (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(plan.slots, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(plan.my_slot, 0u);
  EXPECT_EQ(plan.remote_ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(plan.rank_begin, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(plan.rank_count, (std::vector<uint32_t>{1, 1}));
  EXPECT_EQ(plan.reader, (std::vector<int>{1, 2}));
  XprocPlan middle = plan_xproc(p, {1}, location, gpus, connections, &why);
  ASSERT_TRUE(middle.enabled);
  EXPECT_EQ(middle.locations, (std::vector<int64_t>{10, 12}));
  EXPECT_EQ(middle.slots, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(middle.my_slot, 1u);
}

TEST(CrossProcess, ARingOfFourWithThreeOnOneGpuDoesNotMeet) {
  // Rank 0 and rank 2 share GPU "a" (with rank 1) but no connection: their launches could not
  // all meet, so none of them does, and each says why. Rank 3 is alone on GPU "b".
  const ef::Program p = ring(4);
  const auto connections = connections_of(p);
  const std::vector<int64_t> location = {10, 11, 12, 13};
  const std::vector<std::string> gpus = {"a", "a", "a", "b"};
  for (int r = 0; r < 3; ++r) {
    std::string why;
    EXPECT_FALSE(plan_xproc(p, {r}, location, gpus, connections, &why).enabled) << r;
    EXPECT_NE(why.find("not every two of the 3 processes"), std::string::npos) << why;
  }
  std::string why;
  EXPECT_FALSE(plan_xproc(p, {3}, location, gpus, connections, &why).enabled);
  EXPECT_TRUE(why.empty());
}

TEST(CrossProcess, StaysOffWithoutASharedGpuOrBeyondTheLimits) {
  const ef::Program p = ring(2);
  const auto connections = connections_of(p);
  std::string why;
  // Unknown GPUs, different GPUs, one process.
  EXPECT_FALSE(plan_xproc(p, {0}, {0, 1}, {"", ""}, connections, &why).enabled);
  EXPECT_FALSE(plan_xproc(p, {0}, {0, 1}, {"a", "b"}, connections, &why).enabled);
  EXPECT_FALSE(plan_xproc(p, {0, 1}, {0, 0}, {"a", "a"}, connections, &why).enabled);
  EXPECT_FALSE(plan_xproc(p, {0}, {0, 1}, {}, connections, &why).enabled);
  EXPECT_TRUE(why.empty());
  // LL programs have no direct transfers.
  ef::Program ll = p;
  ll.protocol = ef::Protocol::kLL;
  EXPECT_FALSE(plan_xproc(ll, {0}, {0, 1}, {"a", "a"}, connections, &why).enabled);
  // Six processes on one GPU: more than the kernel meets, and said so.
  const ef::Program six = ring(6);
  EXPECT_FALSE(plan_xproc(six, {0}, {0, 1, 2, 3, 4, 5}, std::vector<std::string>(6, "a"),
                          connections_of(six), &why)
                   .enabled);
  EXPECT_NE(why.find("6 processes share the GPU"), std::string::npos) << why;
  // Five ranks of one process on the GPU.
  why.clear();
  EXPECT_FALSE(plan_xproc(six, {0, 1, 2, 3, 4}, {0, 0, 0, 0, 0, 1},
                          std::vector<std::string>(6, "a"), connections_of(six), &why)
                   .enabled);
  EXPECT_NE(why.find("runs 5 ranks on the GPU"), std::string::npos) << why;
}

TEST(CrossProcess, ACallPublishesItsBuffersAsEachReaderReachesThem) {
  const ef::Program p = ring(3);
  const auto connections = connections_of(p);
  XprocPlan plan;
  std::string why;
  plan = plan_xproc(p, {1}, {0, 1, 2}, {"a", "a", "a"}, connections, &why);
  ASSERT_TRUE(plan.enabled);
  ASSERT_EQ(plan.locations.size(), 2u);
  XprocBoard boards[3] = {};
  plan.mine = &boards[1];
  plan.remote = {&boards[0], &boards[2]};
  char input[64], output[64];
  const std::vector<std::vector<XprocBuffer>> ranges = {
      {{kBufferInput, input, sizeof(input)}, {kBufferOutput, output, sizeof(output)}}};
  // Reader rank 0 reaches everything 0x1000 higher; reader rank 2 only the input.
  const auto translate = [&](int rank, const void* ptr, std::size_t bytes,
                             int reader) -> std::optional<uint64_t> {
    EXPECT_EQ(rank, 1);
    EXPECT_EQ(bytes, 64u);
    if (reader == 2 && ptr == output) return std::nullopt;
    return reinterpret_cast<uint64_t>(ptr) + 0x1000;
  };
  XprocParams x;
  publish_xproc(plan, {1}, 7, ranges, kDirectShiftOutOfPlace, translate, &x);
  EXPECT_EQ(x.active, 1u);
  EXPECT_EQ(x.nlocations, 2u);
  EXPECT_EQ(x.my_slot, 1u);
  EXPECT_EQ(x.my_ctas, 7u);
  EXPECT_EQ(x.mine, &boards[1]);
  EXPECT_EQ(x.remote[1], &boards[2]);
  // Rank 2's process cannot reach the output: one verdict, invalid for every reader.
  EXPECT_EQ(x.published[0].valid, 0u);
  EXPECT_EQ(x.published[1].valid, 0u);
  EXPECT_EQ(x.published[0].buffers[0][kBufferInput], nullptr);
  EXPECT_EQ(x.published[0].direct_shift, kDirectShiftOutOfPlace);
  // Both reach everything: valid for both, each with its own addresses.
  const auto everywhere = [&](int, const void* ptr, std::size_t,
                              int reader) -> std::optional<uint64_t> {
    return reinterpret_cast<uint64_t>(ptr) + 0x1000 * static_cast<uint64_t>(reader + 1);
  };
  publish_xproc(plan, {1}, 7, ranges, kDirectShiftOutOfPlace, everywhere, &x);
  const auto at = [](const char* p) { return reinterpret_cast<uint64_t>(p); };
  EXPECT_EQ(x.published[0].valid, 1u);
  EXPECT_EQ(x.published[1].valid, 1u);
  EXPECT_EQ(at(x.published[0].buffers[0][kBufferInput]), at(input) + 0x1000);
  EXPECT_EQ(at(x.published[0].buffers[0][kBufferOutput]), at(output) + 0x1000);
  EXPECT_EQ(at(x.published[1].buffers[0][kBufferOutput]), at(output) + 0x3000);
  // Direct transfers off for the call: nothing is valid.
  publish_xproc(plan, {1}, 7, ranges, kDirectOff, translate, &x);
  EXPECT_EQ(x.published[0].valid, 0u);
  // No way to translate: nothing is valid.
  publish_xproc(plan, {1}, 7, ranges, kDirectShiftInPlace, nullptr, &x);
  EXPECT_EQ(x.published[0].valid, 0u);
}

}  // namespace
}  // namespace efccl::device
