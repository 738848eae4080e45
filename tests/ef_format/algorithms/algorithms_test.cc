// Every algorithm of the library, for ranks {1,2,3,4,5,8,16} (where it is defined) and, for
// the hierarchical ones, nodes x gpus_per_node {2x2, 2x4, 4x2} besides 1 x ranks, x protocols x
// channels x instances x {out-of-place, in-place-only}: generates, validates, computes the
// collective symbolically (several interleavings) and on the host executor (float/sum,
// int32/prod, half/max, bfloat16/avg, double/premulsum) in every mode the program allows.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "symbolic_executor.h"

namespace efccl::algorithms {
namespace {

AlgorithmInfo info_of(const std::string& name) {
  for (const auto& info : list_algorithms()) {
    if (info.name == name) return info;
  }
  ADD_FAILURE() << "no algorithm " << name;
  return {};
}

TEST(Registry, ListsTheAlgorithmsSorted) {
  const auto list = list_algorithms();
  std::vector<std::string> got;
  for (const auto& info : list) got.push_back(info.name);
  EXPECT_EQ(got, (std::vector<std::string>{"allpairs_allgather",
                                           "allpairs_allreduce",
                                           "alltonext",
                                           "direct_alltoall",
                                           "direct_gather",
                                           "direct_scatter",
                                           "hierarchical_allreduce",
                                           "multilane_allreduce",
                                           "ring_allgather",
                                           "ring_allreduce",
                                           "ring_broadcast",
                                           "ring_reduce",
                                           "ring_reducescatter",
                                           "send_recv",
                                           "shared_gpu_allgather",
                                           "shared_gpu_allreduce",
                                           "shared_gpu_allreduce_single",
                                           "shared_gpu_broadcast",
                                           "shared_gpu_broadcast_single",
                                           "shared_gpu_reduce",
                                           "shared_gpu_reduce_single",
                                           "shared_gpu_reducescatter",
                                           "two_step_alltoall"}));
  for (const auto& info : list) {
    EXPECT_FALSE(info.description.empty()) << info.name;
    EXPECT_LE(info.min_ranks, info.max_ranks) << info.name;
    EXPECT_GE(info.max_channels, 1) << info.name;
  }
  EXPECT_TRUE(info_of("two_step_alltoall").hierarchical);
  EXPECT_TRUE(info_of("hierarchical_allreduce").hierarchical);
  EXPECT_TRUE(info_of("multilane_allreduce").hierarchical);
  EXPECT_TRUE(info_of("alltonext").hierarchical);
  EXPECT_FALSE(info_of("ring_allreduce").hierarchical);
  for (const char* name :
       {"shared_gpu_allreduce", "shared_gpu_allgather", "shared_gpu_reducescatter",
        "shared_gpu_broadcast", "shared_gpu_reduce", "shared_gpu_allreduce_single",
        "shared_gpu_broadcast_single", "shared_gpu_reduce_single"}) {
    EXPECT_TRUE(info_of(name).shared_launch) << name;
    EXPECT_EQ(info_of(name).max_ranks, 16) << name;
  }
  EXPECT_EQ(info_of("shared_gpu_allgather").collective, ef::Collective::kAllGather);
  EXPECT_EQ(info_of("shared_gpu_reducescatter").collective, ef::Collective::kReduceScatter);
  EXPECT_EQ(info_of("shared_gpu_broadcast").collective, ef::Collective::kBroadcast);
  EXPECT_EQ(info_of("shared_gpu_reduce").collective, ef::Collective::kReduce);
  EXPECT_FALSE(info_of("ring_allreduce").shared_launch);
  EXPECT_EQ(info_of("send_recv").min_ranks, 2);
  EXPECT_EQ(info_of("send_recv").max_ranks, 2);
  EXPECT_EQ(info_of("alltonext").collective, ef::Collective::kCustom);
  EXPECT_EQ(info_of("direct_gather").collective, ef::Collective::kGather);
  EXPECT_EQ(info_of("direct_scatter").collective, ef::Collective::kScatter);
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

TEST(Registry, RejectsShapesAnAlgorithmIsNotDefinedFor) {
  AlgorithmParams p;
  p.ranks = 3;
  auto three = generate_algorithm("send_recv", p);
  ASSERT_FALSE(three);
  EXPECT_NE(three.status().message().find("ranks must be 2..2, got 3"), std::string::npos)
      << three.status().message();
  p.ranks = 1;
  EXPECT_FALSE(generate_algorithm("alltonext", p));  // nothing to send to
  // hierarchical_allreduce has no channel parameter; multilane_allreduce's lanes are channels.
  p.ranks = 8;
  p.nodes = 2;
  p.channels = 2;
  auto channels = generate_algorithm("hierarchical_allreduce", p);
  ASSERT_FALSE(channels);
  EXPECT_NE(channels.status().message().find("channels must be 1..1"), std::string::npos)
      << channels.status().message();
  EXPECT_TRUE(generate_algorithm("multilane_allreduce", p));
  // Nodes must divide the ranks; gpus_per_node must agree.
  p.channels = 1;
  p.nodes = 3;
  EXPECT_FALSE(generate_algorithm("two_step_alltoall", p));
  p.nodes = 2;
  p.gpus_per_node = 2;
  EXPECT_FALSE(generate_algorithm("two_step_alltoall", p));
  p.gpus_per_node = 4;
  EXPECT_TRUE(generate_algorithm("two_step_alltoall", p));
}

TEST(Registry, SetsByteRangeAndModes) {
  AlgorithmParams p;
  p.ranks = 4;
  auto small = generate_algorithm("allpairs_allreduce", p);
  ASSERT_TRUE(small) << small.status().message();
  EXPECT_EQ(small->max_bytes, uint64_t{1} << 20);
  auto small_gather = generate_algorithm("allpairs_allgather", p);
  ASSERT_TRUE(small_gather) << small_gather.status().message();
  EXPECT_EQ(small_gather->max_bytes, uint64_t{1} << 20);
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
  // The same for the two-step alltoall, whose in-place variant lands blocks in scratch.
  p.inplace = false;
  p.nodes = 2;
  auto two_step = generate_algorithm("two_step_alltoall", p);
  ASSERT_TRUE(two_step) << two_step.status().message();
  EXPECT_TRUE(two_step->outofplace);
  EXPECT_FALSE(two_step->inplace);
  p.inplace = true;
  auto two_step_in = generate_algorithm("two_step_alltoall", p);
  ASSERT_TRUE(two_step_in) << two_step_in.status().message();
  EXPECT_TRUE(two_step_in->inplace);
  // AllToNext sends each rank's input before its output is written: valid both ways.
  p.inplace = false;
  auto next = generate_algorithm("alltonext", p);
  ASSERT_TRUE(next) << next.status().message();
  EXPECT_TRUE(next->outofplace);
  EXPECT_TRUE(next->inplace);
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

/// (algorithm, ranks, nodes, protocol)
using Case = std::tuple<std::string, int, int, ef::Protocol>;

std::vector<Case> cases() {
  std::vector<Case> out;
  for (ef::Protocol protocol : {ef::Protocol::kSimple, ef::Protocol::kLL, ef::Protocol::kLL128}) {
    for (const auto& info : list_algorithms()) {
      for (int ranks : {1, 2, 3, 4, 5, 8, 16}) {
        if (ranks >= info.min_ranks && ranks <= info.max_ranks)
          out.emplace_back(info.name, ranks, 1, protocol);
      }
      if (!info.hierarchical) continue;
      for (auto [nodes, gpus] : std::vector<std::pair<int, int>>{{2, 2}, {2, 4}, {4, 2}}) {
        out.emplace_back(info.name, nodes * gpus, nodes, protocol);
      }
    }
  }
  return out;
}

class AlgorithmMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(AlgorithmMatrix, ValidatesAndComputesTheCollective) {
  const auto& [name, ranks, nodes, protocol] = GetParam();
  const AlgorithmInfo info = info_of(name);
  struct Operation {
    ef::DataType dtype;
    ef::RedOp op;
  };
  const std::vector<Operation> operations = {{ef::DataType::kFloat32, ef::RedOp::kSum},
                                             {ef::DataType::kInt32, ef::RedOp::kProd},
                                             {ef::DataType::kFloat16, ef::RedOp::kMax},
                                             {ef::DataType::kBFloat16, ef::RedOp::kAvg},
                                             {ef::DataType::kFloat64, ef::RedOp::kPreMulSum}};
  for (bool inplace : {false, true}) {
    for (auto [channels, instances] :
         std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 3}, {2, 2}}) {
      if (channels > info.max_channels) continue;
      if (ranks == 16 && channels * instances > 2) continue;  // keep the matrix fast
      AlgorithmParams p;
      p.ranks = ranks;
      p.nodes = nodes;
      p.protocol = protocol;
      p.inplace = inplace;
      p.channels = channels;
      p.instances = instances;
      p.root = ranks > 2 ? 2 : 0;  // rooted collectives: a root other than 0 where possible
      const std::string what =
          name + " ranks=" + std::to_string(ranks) + " nodes=" + std::to_string(nodes) +
          " ch=" + std::to_string(channels) + " inst=" + std::to_string(instances) +
          (inplace ? " inplace-only" : "");
      auto prog = generate_algorithm(name, p);
      ASSERT_TRUE(prog) << what << ": " << prog.status().message();
      EXPECT_EQ(prog->protocol, protocol);
      EXPECT_EQ(prog->nranks, ranks);
      EXPECT_EQ(prog->collective, info.collective);
      const auto diags = ef::validate(*prog);
      ASSERT_TRUE(diags.empty()) << what << ": " << diags.front().to_string();
      const auto modes = host::allowed_inplace_modes(*prog);
      ASSERT_FALSE(modes.empty()) << what;
      if (inplace) {
        EXPECT_TRUE(prog->inplace) << what;
      }
      for (bool mode : modes) {
        for (uint64_t seed : {0, 1, 2}) {
          EXPECT_EQ(efccl::testing::symbolic_check(*prog, mode, seed), "")
              << what << (mode ? " run in-place" : " run out-of-place") << " seed " << seed;
        }
        for (const Operation& operation : operations) {
          host::ExecOptions ex;
          ex.inplace = mode;
          ex.dtype = operation.dtype;
          ex.op = operation.op;
          if (operation.op == ef::RedOp::kPreMulSum) {
            for (int r = 0; r < ranks; ++r) ex.premul_scalars.push_back(r % 2 == 0 ? 2.0 : -0.5);
          }
          ex.count = ef::count_granularity(*prog) * 3;
          ex.slot_bytes = 4;  // at most one element per slot: many iterations, back-pressure
          const auto v = host::run_and_verify(*prog, ex, 42);
          EXPECT_TRUE(v.pass) << what << (mode ? " in-place " : " out-of-place ")
                              << ef::to_string(operation.dtype) << "/"
                              << ef::to_string(operation.op) << ": " << v.message;
        }
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [name, ranks, nodes, protocol] = info.param;
  std::string s = name + "_" + std::to_string(ranks);
  if (nodes > 1) s += "_" + std::to_string(nodes) + "x" + std::to_string(ranks / nodes);
  return s + "_" + std::string(ef::to_string(protocol));
}

INSTANTIATE_TEST_SUITE_P(All, AlgorithmMatrix, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace efccl::algorithms
