// Selection for communicators spanning hosts (runtime/src/select/host_layout.h, the multi-host
// rows of tuning.cc): which layouts count as hosts in blocks, what the table picks, that the
// registry's picks verify on the host executor, and that the picks are what the timing model
// predicts fastest (within 20%) on a cluster of two DGX H100 joined by their rails, where the
// single-host table's ring is far slower. No GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/host/executor.h"
#include "efccl/host/timing.h"
#include "efccl/host/topology_model.h"
#include "efccl/topology/presets.h"
#include "select/host_layout.h"
#include "select/program_registry.h"
#include "select/tuning.h"

namespace efccl::runtime {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

TEST(HostLayout, ContiguousEqualBlocksAreHostsInBlocks) {
  const HostLayout one = HostLayout::of({});
  EXPECT_EQ(one.hosts, 1);
  EXPECT_FALSE(one.blocks());
  EXPECT_EQ(HostLayout::of({7, 7, 7}).hosts, 1);
  EXPECT_FALSE(HostLayout::of({7, 7, 7}).blocks());

  const HostLayout two = HostLayout::of({5, 5, 9, 9});
  EXPECT_EQ(two.hosts, 2);
  EXPECT_EQ(two.ranks_per_host, 2);
  EXPECT_TRUE(two.blocks());
  EXPECT_EQ(two.describe(), "2 hosts x 2 rank(s)");
  EXPECT_TRUE(HostLayout::of({1, 2, 3}).blocks());  // one rank per host

  // Interleaved, unequal, or one host in two blocks: several hosts, not the hierarchical shape.
  for (const std::vector<uint64_t>& h :
       std::vector<std::vector<uint64_t>>{{5, 9, 5, 9}, {5, 5, 5, 9}, {5, 5, 9, 9, 5, 5}}) {
    const HostLayout l = HostLayout::of(h);
    EXPECT_EQ(l.hosts, 2);
    EXPECT_FALSE(l.blocks());
    EXPECT_EQ(l.describe(), "2 hosts (not in equal contiguous blocks)");
  }
}

TEST(MultiHostSelection, TheTableByLayoutAndSize) {
  const HostLayout two_by_two = HostLayout::of({1, 1, 2, 2});
  const auto pick = [](ef::Collective c, int32_t n, uint64_t bytes, const HostLayout& l) {
    return choose_builtin(c, n, bytes, l);
  };
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 4, 8, two_by_two).algorithm, "allpairs_allreduce");
  BuiltinChoice mid = pick(ef::Collective::kAllReduce, 4, 64 * KiB, two_by_two);
  EXPECT_EQ(mid.algorithm, "multilane_allreduce");
  EXPECT_EQ(mid.channels, 4);
  EXPECT_EQ(mid.nodes, 2);
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 4, 1 * MiB, two_by_two).channels, 16);
  BuiltinChoice large = pick(ef::Collective::kAllReduce, 4, 256 * MiB, two_by_two);
  EXPECT_EQ(large.algorithm, "hierarchical_allreduce");
  EXPECT_EQ(large.instances, 16);
  EXPECT_EQ(large.nodes, 2);
  EXPECT_NE(large.why.find("across hosts (2 hosts x 2 rank(s))"), std::string::npos) << large.why;
  // alltoall: direct with 2 and 4 ranks per host, two-step from 8 (and 1 MiB).
  EXPECT_EQ(pick(ef::Collective::kAllToAll, 4, 16 * MiB, two_by_two).algorithm, "direct_alltoall");
  const HostLayout two_by_four = HostLayout::of({1, 1, 1, 1, 2, 2, 2, 2});
  EXPECT_EQ(pick(ef::Collective::kAllToAll, 8, 16 * MiB, two_by_four).algorithm, "direct_alltoall");
  const HostLayout two_by_eight = HostLayout::of({1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2});
  EXPECT_EQ(pick(ef::Collective::kAllToAll, 16, 16 * MiB, two_by_eight).algorithm,
            "two_step_alltoall");
  EXPECT_EQ(pick(ef::Collective::kAllToAll, 16, 64 * KiB, two_by_eight).algorithm,
            "direct_alltoall");
  // Many ranks: no all-pairs across hosts.
  const HostLayout four_by_eight =
      HostLayout::of(std::vector<uint64_t>{1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                           3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4});
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 32, 8, four_by_eight).algorithm,
            "multilane_allreduce");
  // The other collectives keep the single-host rings; the layout is named in the reason.
  const BuiltinChoice ag = pick(ef::Collective::kAllGather, 4, 16 * MiB, two_by_two);
  EXPECT_EQ(ag.algorithm, "ring_allgather");
  EXPECT_NE(ag.why.find("(2 hosts x 2 rank(s))"), std::string::npos) << ag.why;
  // One rank per host, or hosts not in blocks: the single-host table.
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 2, 64 * MiB, HostLayout::of({1, 2})).algorithm,
            "ring_allreduce");
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 4, 64 * MiB, HostLayout::of({1, 2, 1, 2})).algorithm,
            "ring_allreduce");
  EXPECT_EQ(pick(ef::Collective::kAllReduce, 4, 64 * MiB, HostLayout{}).algorithm,
            "ring_allreduce");
}

TEST(MultiHostSelection, TheRegistrysProgramsAcrossHostsVerify) {
  // 2 hosts x 2 ranks: every allreduce size class (with a count that leaves a tail piece) and
  // both modes, on the host executor.
  ProgramRegistry registry({}, ProtocolFilter{}, true);
  registry.set_host_layout(HostLayout::of({1, 1, 2, 2}));
  std::string seen;
  for (const uint64_t count :
       {uint64_t{3}, uint64_t{16 * 1024 + 5}, uint64_t{(1 << 20) + 7}, uint64_t{(2 << 20) + 3}}) {
    for (const bool inplace : {false, true}) {
      CallShape call;
      call.collective = ef::Collective::kAllReduce;
      call.nranks = 4;
      call.count = count;
      call.inplace = inplace;
      auto plan = registry.select(call);
      ASSERT_TRUE(plan) << plan.status().message();
      for (const PlanPiece& piece : plan->pieces) {
        seen += piece.program->name + " ";
        host::ExecOptions o;
        o.count = piece.count;
        o.inplace = inplace;
        o.op = ef::RedOp::kSum;
        o.dtype = ef::DataType::kInt32;
        const auto r = host::run_and_verify(*piece.program, o, 11);
        EXPECT_TRUE(r.pass) << piece.program->name << " count " << piece.count << ": " << r.message;
      }
    }
  }
  for (const char* name : {"allpairs_allreduce", "multilane_allreduce", "hierarchical_allreduce"})
    EXPECT_NE(seen.find(name), std::string::npos) << name << " not among: " << seen;
  CallShape a2a;
  a2a.collective = ef::Collective::kAllToAll;
  a2a.nranks = 16;
  a2a.count = 16 * 1024;  // elements per peer block: 1 MiB of float32 per rank
  ProgramRegistry sixteen({}, ProtocolFilter{}, true);
  sixteen.set_host_layout(HostLayout::of({1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2}));
  auto plan = sixteen.select(a2a);
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_EQ(plan->pieces.size(), 1u);
  EXPECT_EQ(plan->pieces[0].program->name.rfind("two_step_alltoall", 0), 0u)
      << plan->pieces[0].program->name;
  host::ExecOptions o;
  o.count = a2a.count;
  o.dtype = ef::DataType::kFloat32;
  const auto r = host::run_and_verify(*plan->pieces[0].program, o, 3);
  EXPECT_TRUE(r.pass) << r.message;
}

/// The timing model's prediction (µs) of `algorithm` over `gpus` GPUs of each of the two hosts
/// of two DGX H100 joined by rails, ranks in host blocks.
double predict(const std::string& algorithm, int32_t gpus, int32_t instances, int32_t channels,
               uint64_t bytes, ef::Collective collective) {
  auto t = topo::preset("dgx-h100", 2);
  EXPECT_TRUE(t) << t.status().message();
  const int32_t per_host = static_cast<int32_t>(t->gpus().size() / 2);
  std::vector<topo::NodeIndex> rank_gpus;
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t g = 0; g < gpus; ++g) rank_gpus.push_back(t->gpus()[h * per_host + g]);
  auto model = host::model_for_topology(*t, rank_gpus);
  EXPECT_TRUE(model) << model.status().message();
  algorithms::AlgorithmParams p;
  p.ranks = 2 * gpus;
  p.nodes = 2;
  p.instances = instances;
  p.channels = channels;
  p.min_bytes = 0;
  p.max_bytes = std::nullopt;
  auto program = algorithms::generate_algorithm(algorithm, p);
  EXPECT_TRUE(program) << program.status().message();
  host::ExecOptions o;
  o.dtype = ef::DataType::kFloat32;
  o.count = collective == ef::Collective::kAllReduce ? bytes / 4 : bytes / 4 / (2 * gpus);
  const host::TimingResult r = host::predict_time(*program, o, *model);
  EXPECT_TRUE(r.status.is_ok()) << r.status.message();
  return r.time_us;
}

TEST(MultiHostSelection, ThePicksAreTheTimingModelsOnTwoDgxHosts) {
  struct Candidate {
    const char* algorithm;
    int32_t instances, channels;
  };
  const std::vector<Candidate> allreduce = {
      {"ring_allreduce", 1, 1},          {"ring_allreduce", 8, 1},
      {"ring_allreduce", 32, 1},         {"allpairs_allreduce", 1, 1},
      {"hierarchical_allreduce", 1, 1},  {"hierarchical_allreduce", 4, 1},
      {"hierarchical_allreduce", 8, 1},  {"hierarchical_allreduce", 16, 1},
      {"hierarchical_allreduce", 32, 1}, {"multilane_allreduce", 1, 1},
      {"multilane_allreduce", 1, 4},     {"multilane_allreduce", 1, 8},
      {"multilane_allreduce", 1, 16}};
  for (const int32_t gpus : {2, 4, 8}) {
    std::vector<uint64_t> hosts;
    for (int32_t r = 0; r < 2 * gpus; ++r) hosts.push_back(r < gpus ? 1 : 2);
    const HostLayout layout = HostLayout::of(hosts);
    for (const uint64_t bytes : {8 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}) {
      const BuiltinChoice pick =
          choose_builtin(ef::Collective::kAllReduce, 2 * gpus, bytes, layout);
      const double picked = predict(std::string(pick.algorithm), gpus, pick.instances,
                                    pick.channels, bytes, ef::Collective::kAllReduce);
      double best = picked;
      std::string best_name = std::string(pick.algorithm);
      for (const Candidate& c : allreduce) {
        const double t =
            predict(c.algorithm, gpus, c.instances, c.channels, bytes, ef::Collective::kAllReduce);
        if (t < best) {
          best = t;
          best_name = std::string(c.algorithm) + " i" + std::to_string(c.instances) + " c" +
                      std::to_string(c.channels);
        }
      }
      EXPECT_LE(picked, 1.2 * best)
          << "2 x " << gpus << ", " << bytes << " bytes: " << pick.algorithm << " " << picked
          << " us, " << best_name << " " << best << " us";
      // The single-host table's choice (the ring from 1 MiB) is far slower across hosts.
      const BuiltinChoice flat = choose_builtin(ef::Collective::kAllReduce, 2 * gpus, bytes);
      if (bytes >= 1 * MiB) {
        const double ring = predict(std::string(flat.algorithm), gpus, flat.instances, 1, bytes,
                                    ef::Collective::kAllReduce);
        EXPECT_LT(picked * 1.2, ring) << "2 x " << gpus << ", " << bytes << " bytes";
      }
    }
  }
  // alltoall: the table's pick within 20% of the fastest of direct and two-step (1 and 4
  // instances each); with 8 ranks per host two-step beats direct from 1 MiB.
  for (const int32_t gpus : {2, 4, 8}) {
    std::vector<uint64_t> hosts;
    for (int32_t r = 0; r < 2 * gpus; ++r) hosts.push_back(r < gpus ? 1 : 2);
    const HostLayout layout = HostLayout::of(hosts);
    for (const uint64_t bytes : {64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}) {
      const BuiltinChoice pick = choose_builtin(ef::Collective::kAllToAll, 2 * gpus, bytes, layout);
      const double picked = predict(std::string(pick.algorithm), gpus, pick.instances, 1, bytes,
                                    ef::Collective::kAllToAll);
      double best = picked, best_direct = 0, best_two_step = 0;
      for (const char* algorithm : {"direct_alltoall", "two_step_alltoall"})
        for (const int32_t instances : {1, 4}) {
          const double t = predict(algorithm, gpus, instances, 1, bytes, ef::Collective::kAllToAll);
          best = std::min(best, t);
          double& mine = algorithm[0] == 'd' ? best_direct : best_two_step;
          mine = mine == 0 ? t : std::min(mine, t);
        }
      EXPECT_LE(picked, 1.2 * best)
          << "2 x " << gpus << ", " << bytes << " bytes: " << pick.algorithm << " " << picked
          << " us, best " << best;
      if (gpus == 8 && bytes >= 1 * MiB) {
        EXPECT_EQ(std::string(pick.algorithm), "two_step_alltoall") << bytes << " bytes";
        EXPECT_LT(best_two_step, best_direct) << "2 x 8, " << bytes << " bytes";
      }
    }
  }
}

}  // namespace
}  // namespace efccl::runtime
