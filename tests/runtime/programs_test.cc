// The runtime's own programs and its selection, checked on the host reference executor (no GPU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/common/log.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "efccl/runtime/observer.h"
#include "select/p2p_plan.h"
#include "select/program_registry.h"
#include "select/tuning.h"
#include "select/user_programs.h"

namespace efccl::runtime {
namespace {

void expect_verifies(const ef::Program& p, uint64_t count, ef::DataType dtype, ef::RedOp op) {
  for (bool inplace : host::allowed_inplace_modes(p)) {
    host::ExecOptions o;
    o.count = count;
    o.dtype = dtype;
    o.op = op;
    o.inplace = inplace;
    const auto r = host::run_and_verify(p, o, 7);
    EXPECT_TRUE(r.pass) << p.name << " count " << count << " inplace " << inplace << ": "
                        << r.message;
  }
}

// Gather and scatter run the library's direct programs, with the tuning table's instances
// (1, 4, 8), in place and out of place.
TEST(RuntimePrograms, GatherAndScatterRunTheLibraryPrograms) {
  ProgramRegistry registry({}, ProtocolFilter{});
  for (int n : {1, 2, 3, 8}) {
    for (int root : {0, n - 1}) {
      for (uint64_t count : {uint64_t{3}, uint64_t{4} << 20, uint64_t{64} << 20}) {
        for (bool inplace : {false, true}) {
          SCOPED_TRACE("n " + std::to_string(n) + " root " + std::to_string(root) + " count " +
                       std::to_string(count) + (inplace ? " in place" : " out of place"));
          for (ef::Collective c : {ef::Collective::kGather, ef::Collective::kScatter}) {
            CallShape shape;
            shape.collective = c;
            shape.nranks = n;
            shape.root = root;
            shape.count = count;
            shape.dtype = ef::DataType::kInt8;
            shape.inplace = inplace;
            auto plan = registry.select(shape);
            ASSERT_TRUE(plan) << plan.status().message();
            ASSERT_EQ(plan->pieces.size(), 1u);
            const ef::Program& p = *plan->pieces[0].program;
            EXPECT_EQ(p.name, c == ef::Collective::kGather ? "direct_gather" : "direct_scatter");
            EXPECT_EQ(p.root, root);
            EXPECT_TRUE(inplace ? p.inplace : p.outofplace);
            // Verified on the host at a small count of the same granularity.
            host::ExecOptions o;
            o.count = ef::count_granularity(p) * 3;
            o.dtype = ef::DataType::kFloat32;
            o.op = ef::RedOp::kSum;
            o.inplace = inplace;
            const auto r = host::run_and_verify(p, o, 7);
            EXPECT_TRUE(r.pass) << p.name << ": " << r.message;
          }
        }
      }
    }
  }
}

std::vector<char> g_arena(1 << 20);
void* at(std::size_t offset) { return g_arena.data() + offset; }

void expect_round_verifies(const P2pRound& round) {
  EXPECT_TRUE(ef::validate(round.program).empty()) << round.signature;
  expect_verifies(round.program, round.chunk_bytes, ef::DataType::kInt8, ef::RedOp::kSum);
}

TEST(RuntimePrograms, P2pRingIsOneRound) {
  std::vector<Transfer> ring;
  for (int r = 0; r < 4; ++r)
    ring.push_back({r, (r + 1) % 4, at(r * 8192), at(65536 + ((r + 1) % 4) * 8192), 4096});
  const auto rounds = plan_p2p_rounds(ring, [](uint64_t) { return 4; });
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].program.nranks, 4);
  EXPECT_EQ(rounds[0].program.nchannels, 4);
  EXPECT_EQ(rounds[0].chunk_bytes, 1024u);
  expect_round_verifies(rounds[0]);
}

TEST(RuntimePrograms, P2pSlicesOfOneBufferShareARound) {
  // All-to-all through send/recv: rank r sends slice q of its buffer to q.
  std::vector<Transfer> t;
  for (int r = 0; r < 3; ++r)
    for (int q = 0; q < 3; ++q)
      if (q != r) t.push_back({r, q, at(r * 4096 + q * 512), at(100000 + q * 4096 + r * 512), 512});
  const auto rounds = plan_p2p_rounds(t, &p2p_channels);
  ASSERT_EQ(rounds.size(), 1u);
  expect_round_verifies(rounds[0]);
}

TEST(RuntimePrograms, P2pRoundsPlannedWithoutProgramsBuildTheSameOnes) {
  // The runtime plans layouts and signatures only, and builds a program for a signature that
  // has no executor yet: the result must be the program the full plan gives.
  std::vector<Transfer> t;
  for (int r = 0; r < 3; ++r)
    for (int q = 0; q < 3; ++q)
      if (q != r) t.push_back({r, q, at(r * 4096 + q * 512), at(100000 + q * 4096 + r * 512), 512});
  t.push_back({0, 2, at(300001), at(400003), 96});  // another size: a second round
  const auto channels = [](uint64_t bytes) { return bytes >= 512 ? 4 : 2; };
  const auto protocol = [](uint64_t bytes) {
    return bytes >= 512 ? ef::Protocol::kSimple : ef::Protocol::kLL128;
  };
  const auto full = plan_p2p_rounds(t, channels, protocol);
  auto lazy = plan_p2p_rounds(t, channels, protocol, /*build_programs=*/false);
  ASSERT_EQ(full.size(), 2u);
  ASSERT_EQ(lazy.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    EXPECT_TRUE(lazy[i].program.ranks.empty()) << "planned without a program";
    EXPECT_EQ(lazy[i].signature, full[i].signature);
    EXPECT_EQ(lazy[i].ranks, full[i].ranks);
    EXPECT_EQ(lazy[i].inputs, full[i].inputs);
    EXPECT_EQ(lazy[i].outputs, full[i].outputs);
    EXPECT_EQ(lazy[i].chunk_bytes, full[i].chunk_bytes);
    build_p2p_program(lazy[i]);
    EXPECT_EQ(ef::save_json(lazy[i].program), ef::save_json(full[i].program));
    expect_round_verifies(lazy[i]);
  }
  EXPECT_EQ(full[1].program.protocol, ef::Protocol::kLL128);
  EXPECT_EQ(full[1].program.nchannels, 2);
  // Slots: a Simple round's chunk (128 B here) rounded up within [32 KiB, 512 KiB]; the
  // protocol's default (0) for LL128. They are part of the signature (the executor's key).
  EXPECT_EQ(full[0].slot_bytes, std::size_t{32} << 10);
  EXPECT_NE(full[0].signature.find(":slot32768"), std::string::npos) << full[0].signature;
  EXPECT_EQ(full[1].slot_bytes, 0u);
  const auto big =
      plan_p2p_rounds({{0, 1, at(0), at(1 << 24), 3u << 20}}, [](uint64_t) { return 4; });
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].slot_bytes, std::size_t{512} << 10);  // 768 KiB chunks: the Simple default
  const auto mid =
      plan_p2p_rounds({{0, 1, at(0), at(1 << 24), 400u << 10}}, [](uint64_t) { return 4; });
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(mid[0].slot_bytes, std::size_t{128} << 10);  // 100 KiB chunks
}

TEST(RuntimePrograms, P2pUnrelatedBuffersAndSizesSplitRounds) {
  std::vector<Transfer> t = {
      {0, 1, at(1000), at(5000), 300},   // base of rank 0's sends
      {0, 2, at(1301), at(9000), 300},   // not a chunk multiple away: another round
      {1, 0, at(20000), at(30000), 64},  // another size: another round
  };
  const auto rounds = plan_p2p_rounds(t, [](uint64_t) { return 1; });
  ASSERT_EQ(rounds.size(), 3u);
  for (const auto& r : rounds) expect_round_verifies(r);
}

TEST(RuntimePrograms, TuningTableCoversEveryCollective) {
  for (auto c :
       {ef::Collective::kAllReduce, ef::Collective::kAllGather, ef::Collective::kReduceScatter,
        ef::Collective::kBroadcast, ef::Collective::kReduce, ef::Collective::kAllToAll,
        ef::Collective::kGather, ef::Collective::kScatter})
    for (int n : {1, 2, 8, 16})
      for (uint64_t bytes : {uint64_t{0}, uint64_t{4} << 10, uint64_t{4} << 20, uint64_t{1} << 30})
        EXPECT_FALSE(choose_builtin(c, n, bytes).algorithm.empty()) << ef::to_string(c) << " " << n;
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 8, 1024).algorithm, "allpairs_allreduce");
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 8, 128 << 20).instances, 32);
}

TEST(RuntimePrograms, RanksSharingALaunchReduceInOnePass) {
  const HostLayout one_host;
  // About 128 CTAs (ranks x instances x channels) for large calls, one lane per rank for small.
  for (int n : {2, 3, 4, 16}) {
    const BuiltinChoice c =
        choose_builtin(ef::Collective::kAllReduce, n, uint64_t{64} << 20, one_host, true);
    EXPECT_EQ(c.algorithm, "shared_gpu_allreduce") << n;
    EXPECT_LE(c.instances, 32) << n;
    EXPECT_LE(n * c.instances * c.channels, 128) << n;
    EXPECT_GT(n * c.instances * c.channels, 128 - n * c.channels) << n;
  }
  const BuiltinChoice two = choose_builtin(ef::Collective::kAllReduce, 2, 64 << 20, one_host, true);
  EXPECT_EQ(two.instances, 32);
  EXPECT_EQ(two.channels, 2);
  const BuiltinChoice small = choose_builtin(ef::Collective::kAllReduce, 2, 8, one_host, true);
  EXPECT_EQ(small.algorithm, "shared_gpu_allreduce");
  EXPECT_EQ(small.instances * small.channels, 1);
  // Not shared, more ranks than an mrc takes, or another collective: the usual table.
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 64 << 20, one_host, false).algorithm,
            "ring_allreduce");
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 17, 64 << 20, one_host, true).algorithm,
            "ring_allreduce");
  for (auto [collective, name] : std::vector<std::pair<ef::Collective, std::string>>{
           {ef::Collective::kAllGather, "shared_gpu_allgather"},
           {ef::Collective::kReduceScatter, "shared_gpu_reducescatter"},
           {ef::Collective::kBroadcast, "shared_gpu_broadcast"},
           {ef::Collective::kReduce, "shared_gpu_reduce"}}) {
    EXPECT_EQ(choose_builtin(collective, 4, 64 << 20, one_host, true).algorithm, name);
    EXPECT_EQ(choose_builtin(collective, 4, 64 << 20, one_host, false).algorithm.rfind("ring_", 0),
              0u)
        << name;
  }
  // No mrc program for alltoall, gather, scatter: the usual table.
  for (ef::Collective c :
       {ef::Collective::kAllToAll, ef::Collective::kGather, ef::Collective::kScatter})
    EXPECT_EQ(choose_builtin(c, 4, 64 << 20, one_host, true).algorithm,
              choose_builtin(c, 4, 64 << 20, one_host, false).algorithm)
        << ef::to_string(c);

  // Through the registry: every count is covered (a tail through the usual table) and
  // verifies, for each collective with an mrc program.
  ProgramRegistry registry({}, ProtocolFilter{});
  registry.set_shared_launch(true);
  for (auto [collective, name] : std::vector<std::pair<ef::Collective, std::string>>{
           {ef::Collective::kAllReduce, "shared_gpu_allreduce"},
           {ef::Collective::kAllGather, "shared_gpu_allgather"},
           {ef::Collective::kReduceScatter, "shared_gpu_reducescatter"},
           {ef::Collective::kBroadcast, "shared_gpu_broadcast"},
           {ef::Collective::kReduce, "shared_gpu_reduce"}}) {
    for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{4096 + 3}}) {
      for (bool inplace : {false, true}) {
        CallShape s;
        s.collective = collective;
        s.nranks = 4;
        s.root = 3;
        s.count = count;
        s.inplace = inplace;
        auto plan = registry.select(s);
        ASSERT_TRUE(plan) << name << ": " << plan.status().message();
        uint64_t covered = 0;
        for (const PlanPiece& p : plan->pieces) {
          covered += p.count;
          expect_verifies(*p.program, p.count, ef::DataType::kFloat32, ef::RedOp::kSum);
        }
        EXPECT_EQ(covered, count) << name;
        if (count > 7) {
          EXPECT_EQ(plan->pieces.front().program->name, name);
        }
        // Below the mrc program's granularity: all of it in its one-threadblock variant (one
        // pass), not through a program of connections.
        if (count == 1 && collective != ef::Collective::kAllGather &&
            collective != ef::Collective::kReduceScatter) {
          ASSERT_EQ(plan->pieces.size(), 1u) << name;
          EXPECT_EQ(plan->pieces.front().program->name, name + "_single");
        }
      }
    }
  }
  // Allgather and reduce-scatter of 2 ranks from 4 MiB: 2 channels x 32 instances per rank;
  // an odd count drops to one lane per rank (instances, then channels), which takes it whole.
  for (ef::Collective c : {ef::Collective::kAllGather, ef::Collective::kReduceScatter}) {
    CallShape s;
    s.collective = c;
    s.nranks = 2;
    s.count = (uint64_t{1} << 20) + 1;
    auto plan = registry.select(s);
    ASSERT_TRUE(plan) << plan.status().message();
    ASSERT_EQ(plan->pieces.size(), 1u);
    const ef::Program& p = *plan->pieces.front().program;
    EXPECT_EQ(p.name.rfind("shared_gpu_", 0), 0u) << p.name;
    EXPECT_EQ(p.nchunksperloop, 2) << "one lane per rank";
    EXPECT_NE(plan->reason.find("1 lane(s) per rank"), std::string::npos) << plan->reason;
    expect_verifies(p, s.count, ef::DataType::kFloat32, ef::RedOp::kSum);
    s.count = uint64_t{1} << 20;  // even: the table's lanes
    plan = registry.select(s);
    ASSERT_TRUE(plan) << plan.status().message();
    EXPECT_EQ(plan->pieces.front().program->nchunksperloop, 2 * 64);
  }
}

CallShape shape(ef::Collective c, int n, uint64_t count, bool inplace = false,
                ef::DataType t = ef::DataType::kFloat32) {
  CallShape s;
  s.collective = c;
  s.nranks = n;
  s.root = n - 1;
  s.count = count;
  s.dtype = t;
  s.inplace = inplace;
  return s;
}

TEST(RuntimePrograms, LargeChunksOfElementWiseCollectivesHoldWhole16BytePacks) {
  ProgramRegistry registry({}, ProtocolFilter{});
  // 3 ranks, 1 Mi floats: the ring's 96 chunks would be 10922.67 elements; 43688-byte chunks
  // leave every other one off 16-byte alignment. The body now takes whole packs per chunk.
  struct Case {
    ef::Collective collective;
    int n;
    uint64_t count;
    ef::DataType dtype;
  };
  for (const Case& c : std::vector<Case>{
           {ef::Collective::kAllReduce, 3, uint64_t{1} << 20, ef::DataType::kFloat32},
           {ef::Collective::kAllReduce, 3, 96 * 10923,
            ef::DataType::kFloat32},  // divides, odd chunks
           {ef::Collective::kAllReduce, 6, (uint64_t{1} << 24) + 3, ef::DataType::kInt8},
           {ef::Collective::kAllReduce, 5, (uint64_t{1} << 22) + 1, ef::DataType::kFloat64},
           {ef::Collective::kBroadcast, 3, (uint64_t{1} << 20) + 2, ef::DataType::kFloat32},
           {ef::Collective::kReduce, 3, (uint64_t{1} << 20) + 2, ef::DataType::kBFloat16}}) {
    SCOPED_TRACE(std::string(ef::to_string(c.collective)) + " n " + std::to_string(c.n) +
                 " count " + std::to_string(c.count));
    auto plan = registry.select(shape(c.collective, c.n, c.count, false, c.dtype));
    ASSERT_TRUE(plan) << plan.status().message();
    ASSERT_EQ(plan->pieces.size(), 2u) << plan->reason;
    const PlanPiece& body = plan->pieces[0];
    const uint64_t pack = 16 / ef::size_of(c.dtype);
    auto chunk = ef::chunk_elements(*body.program, body.count);
    ASSERT_TRUE(chunk);
    EXPECT_EQ(*chunk % pack, 0u) << *chunk << " elements per chunk";
    EXPECT_EQ(plan->pieces[1].offset, body.count);
    EXPECT_EQ(body.count + plan->pieces[1].count, c.count);
    EXPECT_LT(plan->pieces[1].count, ef::count_granularity(*body.program) * pack);
    EXPECT_NE(plan->reason.find("16-byte packs"), std::string::npos) << plan->reason;
  }
  // Small chunks (under 16 KiB) keep one piece where the granularity divides the count.
  auto small = registry.select(shape(ef::Collective::kAllReduce, 3, 96 * 11));
  ASSERT_TRUE(small);
  EXPECT_EQ(small->pieces.size(), 1u) << small->reason;
  // Aligned chunks: one piece.
  auto aligned = registry.select(shape(ef::Collective::kAllReduce, 3, 96 * 4096));
  ASSERT_TRUE(aligned);
  EXPECT_EQ(aligned->pieces.size(), 1u) << aligned->reason;
}

TEST(RuntimePrograms, RingsOnGpusSharedBetweenProcessesTake128CtasPerGpu) {
  const HostLayout one_host;
  constexpr uint64_t kMiB = 1 << 20;
  // Two ranks per GPU: 64 CTAs each (32 instances x 2 lanes) from 4 MiB, for the three rings.
  for (ef::Collective c :
       {ef::Collective::kAllReduce, ef::Collective::kAllGather, ef::Collective::kReduceScatter}) {
    for (uint64_t bytes : {4 * kMiB, 64 * kMiB, 1024 * kMiB}) {
      const BuiltinChoice shared = choose_builtin(c, 2, bytes, one_host, false, 2);
      EXPECT_EQ(shared.algorithm.rfind("ring_", 0), 0u) << ef::to_string(c);
      EXPECT_EQ(shared.instances, 32) << ef::to_string(c) << " " << bytes;
      EXPECT_EQ(shared.channels, 2) << ef::to_string(c) << " " << bytes;
      EXPECT_NE(shared.why.find("several processes"), std::string::npos) << shared.why;
    }
    // Below 4 MiB, GPUs not shared (0), or in one launch (mrc programs): as before.
    for (auto [bytes, per_gpu, launch] : std::vector<std::tuple<uint64_t, int32_t, bool>>{
             {1 * kMiB, 2, false}, {64 * kMiB, 0, false}, {64 * kMiB, 2, true}}) {
      const BuiltinChoice a = choose_builtin(c, 2, bytes, one_host, launch, per_gpu);
      const BuiltinChoice b = choose_builtin(c, 2, bytes, one_host, launch);
      EXPECT_EQ(a.algorithm, b.algorithm);
      EXPECT_EQ(a.instances, b.instances);
      EXPECT_EQ(a.channels, b.channels);
    }
  }
  // Other counts of ranks per GPU (not measured) keep the table's rows, at 4 and 64 MiB.
  for (int32_t per_gpu : {3, 4, 8})
    for (uint64_t bytes : {4 * kMiB, 64 * kMiB}) {
      const BuiltinChoice a =
          choose_builtin(ef::Collective::kAllReduce, per_gpu, bytes, one_host, false, per_gpu);
      const BuiltinChoice b =
          choose_builtin(ef::Collective::kAllReduce, per_gpu, bytes, one_host, false);
      EXPECT_EQ(a.instances, b.instances) << per_gpu << " " << bytes;
      EXPECT_EQ(a.channels, b.channels) << per_gpu << " " << bytes;
    }
  // Other algorithms (broadcast's ring, alltoall) are left alone.
  for (ef::Collective c : {ef::Collective::kBroadcast, ef::Collective::kAllToAll})
    EXPECT_EQ(choose_builtin(c, 2, 64 * kMiB, one_host, false, 2).channels,
              choose_builtin(c, 2, 64 * kMiB, one_host, false).channels);

  // Through the registry: the 2-lane rings cover every count (per-block collectives drop
  // instances, then the lanes, until the count divides; every piece's count is a multiple of
  // its program's granularity).
  ProgramRegistry registry({}, ProtocolFilter{});
  registry.set_ranks_per_shared_gpu(2);
  for (ef::Collective c :
       {ef::Collective::kAllReduce, ef::Collective::kAllGather, ef::Collective::kReduceScatter}) {
    for (uint64_t count : {uint64_t{1} << 20, (uint64_t{1} << 20) + 1, (uint64_t{1} << 20) + 32,
                           uint64_t{3} << 20}) {
      SCOPED_TRACE(std::string(ef::to_string(c)) + " count " + std::to_string(count));
      auto plan = registry.select(shape(c, 2, count, false));
      ASSERT_TRUE(plan) << plan.status().message();
      uint64_t covered = 0;
      for (const PlanPiece& p : plan->pieces) {
        EXPECT_EQ(p.offset, covered);
        covered += p.count;
        EXPECT_EQ(p.count % ef::count_granularity(*p.program), 0u) << p.program->name;
      }
      EXPECT_EQ(covered, count) << plan->reason;
      if (count == (uint64_t{1} << 20))
        EXPECT_EQ(plan->pieces.front().program->nchannels, 64) << plan->reason;
    }
  }
}

TEST(RuntimePrograms, BuiltinPlansRunEveryCount) {
  ProgramRegistry registry({}, ProtocolFilter{});
  for (auto c :
       {ef::Collective::kAllReduce, ef::Collective::kAllGather, ef::Collective::kReduceScatter,
        ef::Collective::kBroadcast, ef::Collective::kReduce, ef::Collective::kAllToAll,
        ef::Collective::kGather, ef::Collective::kScatter}) {
    for (int n : {1, 3, 4}) {
      for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{(1 << 18) + 3}}) {
        for (bool inplace : {false, true}) {
          SCOPED_TRACE(std::string(ef::to_string(c)) + " n " + std::to_string(n) + " count " +
                       std::to_string(count) + " inplace " + std::to_string(inplace));
          auto plan = registry.select(shape(c, n, count, inplace));
          ASSERT_TRUE(plan) << plan.status().message();
          uint64_t covered = 0;
          for (const PlanPiece& p : plan->pieces) {
            EXPECT_EQ(p.offset, covered);
            covered += p.count;
            EXPECT_TRUE(ef::chunk_elements(*p.program, p.count)) << p.program->name;
            EXPECT_TRUE(inplace ? p.program->inplace : p.program->outofplace);
            for (const auto& rank : p.program->ranks)
              EXPECT_FALSE(rank.threadblocks.empty()) << p.program->name;
          }
          EXPECT_EQ(covered, count) << plan->reason;
          if (count < 100)
            for (const PlanPiece& p : plan->pieces)
              expect_verifies(*p.program, p.count, ef::DataType::kInt32, ef::RedOp::kSum);
        }
      }
    }
  }
}

TEST(RuntimePrograms, UserProgramsTakePrecedenceOrAreSkippedWithAReason) {
  algorithms::AlgorithmParams params;
  params.ranks = 4;
  auto four = algorithms::generate_algorithm("ring_allreduce", params);
  ASSERT_TRUE(four);
  four->name = "user_ring4";
  auto ll = *four;
  ll.name = "user_ll";
  ll.protocol = ef::Protocol::kLL;
  std::vector<std::pair<ef::Program, std::string>> user = {{ll, "ll.json"}, {*four, "ring4.json"}};
  ProtocolFilter no_ll;
  no_ll.allowed[static_cast<int>(ef::Protocol::kLL)] = false;
  no_ll.spec = "^LL";
  ProgramRegistry registry(user, no_ll);

  std::vector<SelectionRecord> seen;
  set_selection_observer([&](const SelectionRecord& r) { seen.push_back(r); });
  auto plan = registry.select(shape(ef::Collective::kAllReduce, 4, 400));
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->pieces.at(0).program->name, "user_ring4");
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].skipped);
  EXPECT_NE(seen[0].reason.find("NCCL_PROTO=^LL"), std::string::npos) << seen[0].reason;
  EXPECT_EQ(seen[1].source, "ring4.json");

  seen.clear();
  plan = registry.select(shape(ef::Collective::kAllReduce, 4, 401));  // granularity 4
  ASSERT_TRUE(plan);
  EXPECT_NE(plan->pieces.at(0).program->name, "user_ring4");
  ASSERT_GE(seen.size(), 2u);
  EXPECT_NE(seen[1].reason.find("granularity"), std::string::npos) << seen[1].reason;

  seen.clear();
  plan = registry.select(shape(ef::Collective::kAllReduce, 8, 400));
  ASSERT_TRUE(plan);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_NE(seen[1].reason.find("4 ranks"), std::string::npos) << seen[1].reason;
  set_selection_observer(nullptr);
}

TEST(RuntimePrograms, WithoutBuiltinsOnlyUserProgramsRun) {
  algorithms::AlgorithmParams params;
  params.ranks = 4;
  auto ring = algorithms::generate_algorithm("ring_allreduce", params);
  ASSERT_TRUE(ring);
  ring->name = "user_ring4";
  ProgramRegistry registry({{*ring, "ring4.json"}}, ProtocolFilter{}, /*builtins=*/false);

  auto plan = registry.select(shape(ef::Collective::kAllReduce, 4, 400));
  ASSERT_TRUE(plan) << plan.status().message();
  EXPECT_EQ(plan->pieces.at(0).program->name, "user_ring4");

  // A count the program cannot take, another collective: no built-in steps in.
  plan = registry.select(shape(ef::Collective::kAllReduce, 4, 401));
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.status().message().find("EFCCL_BUILTINS=0"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("user program 'user_ring4' (ring4.json) claims it but"),
            std::string::npos)
      << plan.status().message();
  plan = registry.select(shape(ef::Collective::kAllGather, 4, 400));
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.status().message().find("no user program covers allgather count 400"),
            std::string::npos)
      << plan.status().message();
}

TEST(RuntimePrograms, UserProgramFilesThatCannotBeLoadedAreLoggedAndSkipped) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("efccl_user_programs_" + std::to_string(getpid()));
  fs::create_directories(dir);
  algorithms::AlgorithmParams params;
  params.ranks = 2;
  auto ring = algorithms::generate_algorithm("ring_allreduce", params);
  ASSERT_TRUE(ring);
  ring->name = "good_ring";
  std::ofstream(dir / "good.json") << ef::save_json(*ring);
  std::ofstream(dir / "garbage.xml") << "<algo";
  {
    // Beyond the loaders' memory budget (about 30 bytes parsed per 3 bytes of text).
    std::ofstream big(dir / "empty_objects.json");
    big << "{\"ranks\": [{}";
    for (int i = 0; i < 12000000; ++i) big << ",{}";
    big << "]}";
  }
  const std::string missing = (dir / "missing.json").string();
  ASSERT_EQ(setenv("EFCCL_ALGO_DIR", dir.c_str(), 1), 0);
  ASSERT_EQ(setenv("EFCCL_ALGO_FILES", missing.c_str(), 1), 0);
  ASSERT_EQ(setenv("EFCCL_DEBUG", "WARN", 1), 0);
  reload_log_config();
  std::vector<std::string> lines;
  set_log_sink([&](const std::string& line) { lines.push_back(line); });

  std::vector<std::pair<ef::Program, std::string>> loaded;
  EXPECT_NO_THROW(loaded = load_user_programs());

  set_log_sink(nullptr);
  ASSERT_EQ(unsetenv("EFCCL_DEBUG"), 0);
  ASSERT_EQ(unsetenv("EFCCL_ALGO_DIR"), 0);
  ASSERT_EQ(unsetenv("EFCCL_ALGO_FILES"), 0);
  reload_log_config();
  fs::remove_all(dir);

  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].first.name, "good_ring");
  const auto warned = [&](const std::string& file, const std::string& why) {
    for (const std::string& line : lines)
      if (line.find("user program " + file + " is not used") != std::string::npos &&
          line.find(why) != std::string::npos)
        return true;
    return false;
  };
  EXPECT_TRUE(warned((dir / "empty_objects.json").string(), "the loaders' budget"));
  EXPECT_TRUE(warned((dir / "garbage.xml").string(), "[syntax]"));
  EXPECT_TRUE(warned(missing, "no such file"));
}

TEST(RuntimePrograms, BuiltinsSwitchReadsTheEnvironment) {
  for (const char* on : {"1", "on", "ON"}) {
    ASSERT_EQ(setenv("EFCCL_BUILTINS", on, 1), 0);
    EXPECT_TRUE(builtins_from_environment()) << on;
  }
  for (const char* off : {"0", "off", "Off"}) {
    ASSERT_EQ(setenv("EFCCL_BUILTINS", off, 1), 0);
    EXPECT_FALSE(builtins_from_environment()) << off;
  }
  ASSERT_EQ(setenv("EFCCL_BUILTINS", "maybe", 1), 0);
  EXPECT_TRUE(builtins_from_environment());  // a warning, and the default
  ASSERT_EQ(unsetenv("EFCCL_BUILTINS"), 0);
  EXPECT_TRUE(builtins_from_environment());
}

TEST(RuntimePrograms, P2pChannelsFollowTheTableWithinNcclBounds) {
  ASSERT_EQ(unsetenv("NCCL_MIN_P2P_NCHANNELS"), 0);
  ASSERT_EQ(unsetenv("NCCL_MAX_P2P_NCHANNELS"), 0);
  const auto unset = p2p_channel_bounds();
  EXPECT_EQ(unset, std::make_pair(1, 64));
  const int32_t at_4m = p2p_channels(4 << 20, unset);
  EXPECT_GT(at_4m, 1);  // large transfers spread over several channels
  EXPECT_EQ(p2p_channels(8, unset), 1);
  EXPECT_EQ(p2p_channels(4 << 20), at_4m);  // the cached bounds: nothing set in this process

  ASSERT_EQ(setenv("NCCL_MIN_P2P_NCHANNELS", "4", 1), 0);
  ASSERT_EQ(setenv("NCCL_MAX_P2P_NCHANNELS", "2", 1), 0);
  EXPECT_EQ(p2p_channel_bounds(), std::make_pair(2, 2));  // min > max: max for both
  ASSERT_EQ(setenv("NCCL_MAX_P2P_NCHANNELS", "6", 1), 0);
  const auto bounds = p2p_channel_bounds();
  EXPECT_EQ(bounds, std::make_pair(4, 6));
  EXPECT_EQ(p2p_channels(8, bounds), 4);
  EXPECT_EQ(p2p_channels(1 << 30, bounds), 6);
  for (const char* bad : {"0", "65", "-3", "4x", "", "lots"}) {
    ASSERT_EQ(setenv("NCCL_MIN_P2P_NCHANNELS", bad, 1), 0);
    EXPECT_EQ(p2p_channel_bounds(), std::make_pair(1, 6))
        << "NCCL_MIN_P2P_NCHANNELS='" << bad << "'";
  }
  ASSERT_EQ(unsetenv("NCCL_MIN_P2P_NCHANNELS"), 0);
  ASSERT_EQ(unsetenv("NCCL_MAX_P2P_NCHANNELS"), 0);
}

TEST(RuntimePrograms, ProtocolsFollowTheTuningTableAndNcclProto) {
  // The tuning table's protocols (measured on 2 H200s, docs/performance.md): collectives run
  // Simple; send/recv rounds below 4 KiB run LL128.
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 8).protocol, ef::Protocol::kSimple);
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 4, 8).protocol, ef::Protocol::kSimple);
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 128 << 20).protocol,
            ef::Protocol::kSimple);
  EXPECT_EQ(p2p_protocol(8), ef::Protocol::kLL128);
  EXPECT_EQ(p2p_protocol((4 << 10) - 1), ef::Protocol::kLL128);
  EXPECT_EQ(p2p_protocol(4 << 10), ef::Protocol::kSimple);
  EXPECT_EQ(p2p_protocol(1 << 30), ef::Protocol::kSimple);
  // Two ranks: all-pairs with more lanes as messages grow, then the ring.
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 8).instances, 1);
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 512 << 10).algorithm,
            "allpairs_allreduce");
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 512 << 10).instances, 8);
  EXPECT_EQ(choose_builtin(ef::Collective::kAllReduce, 2, 1 << 20).algorithm, "ring_allreduce");

  // The registry generates the built-in in that protocol, unless NCCL_PROTO excludes it.
  ProgramRegistry all({}, ProtocolFilter{});
  auto small = all.select(shape(ef::Collective::kAllReduce, 2, 16));
  ASSERT_TRUE(small) << small.status().message();
  EXPECT_EQ(small->pieces.at(0).program->protocol, ef::Protocol::kSimple) << small->reason;
  EXPECT_EQ(all.p2p_protocol(8), ef::Protocol::kLL128);

  ProtocolFilter no_ll128;
  no_ll128.allowed[static_cast<int>(ef::Protocol::kLL128)] = false;
  no_ll128.spec = "^LL128";
  ProgramRegistry simple_or_ll({}, no_ll128);
  EXPECT_EQ(simple_or_ll.p2p_protocol(8), ef::Protocol::kSimple);  // the first allowed
  auto kept = simple_or_ll.select(shape(ef::Collective::kAllReduce, 2, 16));
  ASSERT_TRUE(kept) << kept.status().message();
  EXPECT_EQ(kept->pieces.at(0).program->protocol, ef::Protocol::kSimple);

  ProtocolFilter only_ll;
  only_ll.allowed[static_cast<int>(ef::Protocol::kSimple)] = false;
  only_ll.allowed[static_cast<int>(ef::Protocol::kLL128)] = false;
  only_ll.spec = "LL";
  ProgramRegistry ll({}, only_ll);
  auto forced = ll.select(shape(ef::Collective::kAllReduce, 2, 1 << 20));
  ASSERT_TRUE(forced) << forced.status().message();
  EXPECT_EQ(forced->pieces.at(0).program->protocol, ef::Protocol::kLL);
  EXPECT_NE(forced->reason.find("NCCL_PROTO=LL excludes Simple"), std::string::npos)
      << forced->reason;
  EXPECT_EQ(ll.p2p_protocol(8), ef::Protocol::kLL);  // NCCL_PROTO=LL: send/recv too
  EXPECT_EQ(ll.p2p_protocol(1 << 30), ef::Protocol::kLL);
}

TEST(RuntimePrograms, P2pRoundsCarryTheProtocolInProgramAndSignature) {
  std::vector<char> a(1 << 20), b(1 << 20);
  const std::vector<Transfer> t = {{0, 1, a.data(), b.data(), 4096}};
  const auto ll128 =
      plan_p2p_rounds(t, &p2p_channels, [](uint64_t) { return ef::Protocol::kLL128; });
  const auto simple = plan_p2p_rounds(t, &p2p_channels);
  ASSERT_EQ(ll128.size(), 1u);
  ASSERT_EQ(simple.size(), 1u);
  EXPECT_EQ(ll128[0].program.protocol, ef::Protocol::kLL128);
  EXPECT_EQ(simple[0].program.protocol, ef::Protocol::kSimple);
  EXPECT_NE(ll128[0].signature, simple[0].signature);
  expect_round_verifies(ll128[0]);
}

}  // namespace
}  // namespace efccl::runtime
