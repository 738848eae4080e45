// Every algorithm of the library, for ranks {1,2,3,4,5,8,16} x protocols x channels x
// instances x {out-of-place, in-place-only}: generates, validates, computes the collective
// symbolically (several interleavings) and on the host executor (float/sum, int32/prod) in
// every mode the program allows.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/algorithms/registry.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "symbolic_executor.h"

namespace efccl::algorithms {
namespace {

const std::vector<std::string>& names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> n;
    for (const auto& info : list_algorithms()) n.push_back(info.name);
    return n;
  }();
  return kNames;
}

TEST(Registry, ListsTheAlgorithmsSorted) {
  const auto list = list_algorithms();
  std::vector<std::string> got;
  for (const auto& info : list) got.push_back(info.name);
  EXPECT_EQ(got, (std::vector<std::string>{"allpairs_allreduce", "direct_alltoall",
                                           "ring_allgather", "ring_allreduce", "ring_broadcast",
                                           "ring_reduce", "ring_reducescatter"}));
  for (const auto& info : list) EXPECT_FALSE(info.description.empty()) << info.name;
}

TEST(Registry, RejectsBadParameters) {
  AlgorithmParams p;
  p.ranks = 4;
  auto unknown = generate_algorithm("tree_allreduce", p);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.status().message().find("ring_allreduce"), std::string::npos);
  for (auto [field, value] :
       std::vector<std::pair<int, int>>{{0, 0}, {1, 3}, {2, 0}, {3, 0}, {4, 99}}) {
    AlgorithmParams bad = p;
    if (field == 0) bad.ranks = value;
    if (field == 1) bad.nodes = value;
    if (field == 2) bad.instances = value;
    if (field == 3) bad.channels = value;
    if (field == 4) bad.gpus_per_node = value;
    auto r = generate_algorithm("ring_allreduce", bad);
    EXPECT_FALSE(r) << field;
  }
  AlgorithmParams bytes = p;
  bytes.min_bytes = 100;
  bytes.max_bytes = 10;
  EXPECT_FALSE(generate_algorithm("ring_allreduce", bytes));
}

TEST(Registry, SetsByteRangeAndModes) {
  AlgorithmParams p;
  p.ranks = 4;
  auto small = generate_algorithm("allpairs_allreduce", p);
  ASSERT_TRUE(small) << small.status().message();
  EXPECT_EQ(small->max_bytes, uint64_t{1} << 20);
  auto ring = generate_algorithm("ring_allreduce", p);
  ASSERT_TRUE(ring) << ring.status().message();
  EXPECT_FALSE(ring->max_bytes.has_value());
  // The out-of-place ring reads each input chunk before anything writes it: valid both ways.
  EXPECT_TRUE(ring->outofplace);
  EXPECT_TRUE(ring->inplace);
  // Direct alltoall out-of-place overwrites blocks still to be sent under aliasing.
  auto a2a = generate_algorithm("direct_alltoall", p);
  ASSERT_TRUE(a2a) << a2a.status().message();
  EXPECT_TRUE(a2a->outofplace);
  EXPECT_FALSE(a2a->inplace);
  p.inplace = true;
  auto a2a_in = generate_algorithm("direct_alltoall", p);
  ASSERT_TRUE(a2a_in) << a2a_in.status().message();
  EXPECT_TRUE(a2a_in->inplace);
  EXPECT_FALSE(a2a_in->outofplace);
}

TEST(RingAllReduce, FusesIntoRrsRrcsRcs) {
  AlgorithmParams p;
  p.ranks = 4;
  auto prog = generate_algorithm("ring_allreduce", p);
  ASSERT_TRUE(prog) << prog.status().message();
  // Per rank and chunk: one send, n-2 rrs, one rrcs, n-2 rcs, one recv (in some order).
  for (const auto& rank : prog->ranks) {
    std::map<ef::OpCode, int> count;
    for (const auto& tb : rank.threadblocks) {
      for (const auto& op : tb.ops) ++count[op.code];
    }
    EXPECT_EQ(count[ef::OpCode::kSend], 1);
    EXPECT_EQ(count[ef::OpCode::kRecvReduceSend], 2);
    EXPECT_EQ(count[ef::OpCode::kRecvReduceCopySend], 1);
    EXPECT_EQ(count[ef::OpCode::kRecvCopySend], 2);
    EXPECT_EQ(count[ef::OpCode::kRecv], 1);
    EXPECT_EQ(rank.threadblocks.size(), 1u);  // one tb: send to next, receive from prev
    EXPECT_EQ(rank.scratch_chunks, 0);
  }
}

TEST(RingReduceScatter, NeedsNoScratchOnceFused) {
  AlgorithmParams p;
  p.ranks = 5;
  auto prog = generate_algorithm("ring_reducescatter", p);
  ASSERT_TRUE(prog) << prog.status().message();
  for (const auto& rank : prog->ranks) EXPECT_EQ(rank.scratch_chunks, 0);
  p.options.fuse_rrs = false;
  auto unfused = generate_algorithm("ring_reducescatter", p);
  ASSERT_TRUE(unfused) << unfused.status().message();
  EXPECT_GT(unfused->ranks[0].scratch_chunks, 0);
}

using Case = std::tuple<std::string, int, ef::Protocol>;

class AlgorithmMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(AlgorithmMatrix, ValidatesAndComputesTheCollective) {
  const auto& [name, ranks, protocol] = GetParam();
  for (bool inplace : {false, true}) {
    for (auto [channels, instances] :
         std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 3}, {2, 2}}) {
      if (ranks == 16 && channels * instances > 2) continue;  // keep the matrix fast
      AlgorithmParams p;
      p.ranks = ranks;
      p.protocol = protocol;
      p.inplace = inplace;
      p.channels = channels;
      p.instances = instances;
      p.root = ranks > 2 ? 2 : 0;  // rooted collectives: a root other than 0 where possible
      const std::string what =
          name + " ranks=" + std::to_string(ranks) + " ch=" + std::to_string(channels) +
          " inst=" + std::to_string(instances) + (inplace ? " inplace-only" : "");
      auto prog = generate_algorithm(name, p);
      ASSERT_TRUE(prog) << what << ": " << prog.status().message();
      EXPECT_EQ(prog->protocol, protocol);
      EXPECT_EQ(prog->nranks, ranks);
      const auto diags = ef::validate(*prog);
      ASSERT_TRUE(diags.empty()) << what << ": " << diags.front().to_string();
      const auto modes = host::allowed_inplace_modes(*prog);
      ASSERT_FALSE(modes.empty()) << what;
      for (bool mode : modes) {
        for (uint64_t seed : {0, 1, 2}) {
          EXPECT_EQ(efccl::testing::symbolic_check(*prog, mode, seed), "")
              << what << (mode ? " run in-place" : " run out-of-place") << " seed " << seed;
        }
        for (auto [dtype, op] : {std::pair{ef::DataType::kFloat32, ef::RedOp::kSum},
                                 std::pair{ef::DataType::kInt32, ef::RedOp::kProd}}) {
          host::ExecOptions ex;
          ex.inplace = mode;
          ex.dtype = dtype;
          ex.op = op;
          ex.count = ef::count_granularity(*prog) * 3;
          ex.slot_bytes = 4;  // one element per slot: many iterations and full back-pressure
          const auto v = host::run_and_verify(*prog, ex, 42);
          EXPECT_TRUE(v.pass) << what << (mode ? " in-place " : " out-of-place ")
                              << ef::to_string(dtype) << ": " << v.message;
        }
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "_" +
         std::string(ef::to_string(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(All, AlgorithmMatrix,
                         ::testing::Combine(::testing::ValuesIn(names()),
                                            ::testing::Values(1, 2, 3, 4, 5, 8, 16),
                                            ::testing::Values(ef::Protocol::kSimple,
                                                              ef::Protocol::kLL,
                                                              ef::Protocol::kLL128)),
                         case_name);

}  // namespace
}  // namespace efccl::algorithms
