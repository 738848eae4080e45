// The runtime's balancer without a GPU (launch/balancer.h, select/balanced_transfer.h): groups
// and pair messages planned on simulated topologies (EFCCL_BALANCE_TOPOLOGY) become programs
// that validate and verify bit-exactly on the host executor, with relays as forwards through
// ranks taking part or as slot devices, the host path, tails, the caches, forced spreading,
// pair-local plans that both processes of a pair derive alike, and the timing model's
// prediction.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "launch/balancer.h"
#include "scoped_env.h"
#include "select/balance_prediction.h"

namespace efccl::runtime {
namespace {

constexpr uint64_t MiB = uint64_t{1} << 20;

/// A balancer for `n` ranks on one real GPU planning on `preset`.
std::unique_ptr<Balancer> balancer_on(const std::string& preset, int n, bool multiprocess = false) {
  ScopedEnv topology("EFCCL_BALANCE_TOPOLOGY", ("preset:" + preset).c_str());
  auto b = std::make_unique<Balancer>(nullptr, std::vector<int>(static_cast<std::size_t>(n), 0),
                                      multiprocess, true);
  EXPECT_TRUE(b->active());
  return b;
}

/// Validates the transfer's program and runs it on the host executor, 64 bytes a chunk, with
/// whole and 7-byte tiles.
void expect_verifies(const BalancedTransfer& t) {
  const Diagnostics d = ef::validate(t.program);
  ASSERT_TRUE(d.empty()) << d.front().to_string();
  for (std::size_t slot : {std::size_t{0}, std::size_t{7}}) {
    host::ExecOptions o;
    o.count = 64;
    o.dtype = ef::DataType::kInt8;
    o.slot_bytes = slot;
    const host::VerifyResult r = host::run_and_verify(t.program, o, 5);
    EXPECT_TRUE(r.pass) << r.message;
  }
}

std::set<std::string> route_texts(const BalancedTransfer& t) {
  std::set<std::string> out;
  for (const BalancedTransfer::Share& s : t.shares) out.insert(s.text);
  return out;
}

bool has_text(const BalancedTransfer& t, const std::string& part) {
  for (const std::string& s : route_texts(t))
    if (s.find(part) != std::string::npos) return true;
  return false;
}

TEST(BalancedTransfer, ChunksAreWholeLinesAndTailsAreSmall) {
  EXPECT_EQ(chunks_of(16 * 1024).chunks, 0);  // fewer than two chunks: not split
  EXPECT_EQ(chunks_of(MiB).chunks, 64);
  EXPECT_EQ(chunks_of(MiB).chunk_bytes, 16u * 1024);
  EXPECT_EQ(chunks_of(64 * MiB).chunks, 64);
  EXPECT_EQ(chunks_of(200 * MiB).chunks, 128);
  EXPECT_EQ(chunks_of(1024 * MiB).chunks, 1024);
  for (uint64_t bytes : {MiB + 3, 5 * MiB + 4097, 64 * MiB + 12345, 333 * MiB + 1}) {
    const TransferChunks c = chunks_of(bytes);
    EXPECT_EQ(c.chunk_bytes % 256, 0u) << bytes;
    EXPECT_LE(c.chunk_bytes * static_cast<uint64_t>(c.chunks), bytes);
    EXPECT_LT(bytes - c.chunk_bytes * static_cast<uint64_t>(c.chunks), 16u * 1024) << bytes;
  }
}

TEST(Balancer, LonePairUsesSlotDevicesAndTheHostPath) {
  // Two ranks on GPUs 0 and 1 of nimble-h100 (four GPUs, a full NVLink mesh): the relays
  // through GPUs 2 and 3 take no part, so their connections keep slots there.
  auto b = balancer_on("nimble-h100", 2);
  auto prepared = b->prepare_group({{0, 1, 64 * MiB + 12345}}, "p2p");
  ASSERT_TRUE(prepared) << prepared.status().message();
  ASSERT_GE((*prepared)->plan, 0);
  const BalancedTransfer& t = *(*prepared)->transfers[0];
  EXPECT_GE(t.shares.size(), 3u);
  EXPECT_TRUE(has_text(t, "no kernel there")) << ::testing::PrintToString(route_texts(t));
  EXPECT_EQ(t.ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_GE(t.program.slot_devices, 1);
  EXPECT_EQ(t.main_bytes, static_cast<uint64_t>(t.chunks) * t.chunk_bytes);
  EXPECT_GT(64 * MiB + 12345, t.main_bytes);  // a tail goes on the default path
  expect_verifies(t);
  // The simulated relays bind to the receiver's real GPU.
  EXPECT_EQ(b->slot_devices(t, true), std::vector<int>(t.slot_device_gpus.size(), 0));
  EXPECT_EQ(b->slot_devices(t, false), std::vector<int>(t.slot_device_gpus.size(), -1));
  // A repeat is the same prepared group: no planning, no program building.
  auto again = b->prepare_group({{0, 1, 64 * MiB + 12345}}, "p2p");
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *prepared);
  // The record lists the paths as run, adding up to the transfer.
  const BalancePlanRecord& r = b->stats().plan((*prepared)->plan);
  ASSERT_EQ(r.pairs.size(), 1u);
  uint64_t sum = 0;
  for (const auto& p : r.pairs[0].paths) sum += p.bytes;
  EXPECT_EQ(sum, 64 * MiB + 12345);
  EXPECT_LT(r.max_load_us, r.direct_max_load_us);
}

TEST(Balancer, SkewedGroupForwardsThroughRanksThatTakePart) {
  // Four ranks on nimble-h100's four GPUs; rank 0 sends 64 MiB to rank 1, everyone else 1 MiB
  // to everyone: relays of 0 -> 1 run through ranks 2 and 3, which take part.
  auto b = balancer_on("nimble-h100", 4);
  std::vector<Balancer::TransferKey> group;
  for (int32_t s = 0; s < 4; ++s)
    for (int32_t d = 0; d < 4; ++d)
      if (s != d) group.push_back({s, d, s == 0 && d == 1 ? 64 * MiB : MiB + 517});
  auto prepared = b->prepare_group(group, "p2p");
  ASSERT_TRUE(prepared) << prepared.status().message();
  const BalancedTransfer* hot = nullptr;
  for (std::size_t i = 0; i < group.size(); ++i)
    if (group[i].sender == 0 && group[i].receiver == 1) hot = (*prepared)->transfers[i].get();
  ASSERT_NE(hot, nullptr);
  EXPECT_TRUE(has_text(*hot, "forwarded by rank")) << ::testing::PrintToString(route_texts(*hot));
  EXPECT_GT(hot->ranks.size(), 2u);
  for (const auto& t : (*prepared)->transfers)
    if (t) expect_verifies(*t);
}

TEST(Balancer, PairLocalPlansAreTheSameInBothProcessesAndNeverForward) {
  // Across processes each end plans the pair from its bytes alone: two balancers (the two
  // processes) derive byte-identical programs, with relays as slot devices only.
  auto mine = balancer_on("nimble-h100", 4, true);
  auto theirs = balancer_on("nimble-h100", 4, true);
  auto a = mine->prepare_pair(0, 1, 64 * MiB, 3 * MiB + 5, 0);
  auto b = theirs->prepare_pair(0, 1, 64 * MiB, 3 * MiB + 5, 0);
  ASSERT_TRUE(a && b);
  ASSERT_GE((*a)->plan, 0);
  for (int i = 0; i < 2; ++i) {
    const auto& x = (*a)->transfers[i];
    const auto& y = (*b)->transfers[i];
    ASSERT_EQ(x == nullptr, y == nullptr) << i;
    if (!x) continue;
    EXPECT_EQ(x->signature, y->signature);
    EXPECT_EQ(x->program, y->program);
    EXPECT_EQ(x->ranks.size(), 2u) << "no third rank across processes";
    EXPECT_FALSE(has_text(*x, "forwarded"));
    expect_verifies(*x);
  }
  EXPECT_EQ((*a)->transfers[0]->ranks, (std::vector<int32_t>{0, 1}));
  // An all-to-all's pairs come from the global plan (the host path adds to every GPU's cut, so
  // even uniform traffic moves some bytes there), the same in both processes.
  auto uniform = mine->alltoall_balances(64 * MiB);
  ASSERT_TRUE(uniform);
  EXPECT_TRUE(*uniform);
  auto x = mine->prepare_pair(1, 2, 64 * MiB, 64 * MiB, 64 * MiB);
  auto y = theirs->prepare_pair(1, 2, 64 * MiB, 64 * MiB, 64 * MiB);
  ASSERT_TRUE(x && y);
  ASSERT_GE((*x)->plan, 0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_NE((*x)->transfers[i], nullptr);
    EXPECT_EQ((*x)->transfers[i]->program, (*y)->transfers[i]->program);
    EXPECT_TRUE(has_text(*(*x)->transfers[i], "host memory"));
  }
}

TEST(Balancer, HostPathOnTwoGpusAndForcedSpreading) {
  {
    // h200-nv18-x2: NVLink and the host path; the planner gives the host its share.
    auto b = balancer_on("h200-nv18-x2", 2);
    auto prepared = b->prepare_group({{0, 1, 256 * MiB}, {1, 0, 256 * MiB}}, "p2p");
    ASSERT_TRUE(prepared);
    for (const auto& t : (*prepared)->transfers) {
      ASSERT_NE(t, nullptr);
      EXPECT_TRUE(has_text(*t, "host memory"));
      expect_verifies(*t);
    }
  }
  {
    // Four ranks on two GPUs (0 and 2 on one, 1 and 3 on the other), small transfers forced
    // evenly over every candidate; pairs on one GPU have one path.
    ScopedEnv force("EFCCL_BALANCE_FORCE", "spread");
    ScopedEnv min("EFCCL_BALANCE_MIN_BYTES", "65536");
    auto b = balancer_on("h200-nv18-x2", 4);
    std::vector<Balancer::TransferKey> group;
    for (int32_t s = 0; s < 4; ++s)
      for (int32_t d = 0; d < 4; ++d)
        if (s != d) group.push_back({s, d, 200 * 1024 + 3 * static_cast<uint64_t>(s + d)});
    auto prepared = b->prepare_group(group, "p2p");
    ASSERT_TRUE(prepared);
    for (std::size_t i = 0; i < group.size(); ++i) {
      const auto& t = (*prepared)->transfers[i];
      const bool same_gpu = group[i].sender % 2 == group[i].receiver % 2;
      ASSERT_EQ(t == nullptr, same_gpu) << group[i].sender << " -> " << group[i].receiver;
      if (!t) continue;
      ASSERT_EQ(t->shares.size(), 2u);
      EXPECT_EQ(t->shares[0].chunks, t->shares[1].chunks);
      expect_verifies(*t);
    }
  }
}

TEST(Balancer, PredictionFavoursTheBalancedPlan) {
  auto b = balancer_on("nimble-h100", 2);
  auto prepared = b->prepare_group({{0, 1, 256 * MiB}}, "p2p");
  ASSERT_TRUE(prepared);
  const BalancedTransfer* t = (*prepared)->transfers[0].get();
  ASSERT_NE(t, nullptr);
  auto p = predict_group(b->machine(), {{0, 1, 256 * MiB, t}});
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_GT(p->direct_us, 0);
  EXPECT_LT(p->balanced_us, 0.7 * p->direct_us);  // three NVLink paths and the host, not one
}

TEST(Balancer, OffOrUnusableTopologiesLeaveEverythingAlone) {
  {
    ScopedEnv off("EFCCL_BALANCE", "0");
    ScopedEnv topology("EFCCL_BALANCE_TOPOLOGY", "preset:nimble-h100");
    Balancer b(nullptr, {0, 0}, false, true);
    EXPECT_FALSE(b.active());
  }
  for (const char* bad :
       {"preset:no-such-machine", "preset:nimble-h100:0", "/nonexistent/t.json"}) {
    ScopedEnv topology("EFCCL_BALANCE_TOPOLOGY", bad);
    Balancer b(nullptr, {0, 0}, false, true);
    EXPECT_FALSE(b.active()) << bad;
  }
  {
    ScopedEnv topology("EFCCL_BALANCE_TOPOLOGY", nullptr);
    Balancer b(nullptr, {0, 0}, false, true);  // no machine graph either
    EXPECT_FALSE(b.active());
  }
  // Ranks sharing one GPU of the topology have nothing to balance.
  auto b = balancer_on("h200-nv18-x2", 3);
  auto prepared = b->prepare_group({{0, 2, 64 * MiB}}, "p2p");
  ASSERT_TRUE(prepared);
  EXPECT_EQ((*prepared)->plan, -1);
  EXPECT_EQ((*prepared)->transfers[0], nullptr);
}

TEST(Balancer, TwoHostPresetsUseOnlyRoutesTheRuntimeRuns) {
  // Between hosts the rail-matched candidates (two relays) are not run yet: their bytes go to
  // the default path; within a host relays and the host path still apply.
  auto b = balancer_on("nimble-h100:2", 8);
  std::vector<Balancer::TransferKey> group = {{0, 4, 256 * MiB}, {1, 2, 256 * MiB}};
  auto prepared = b->prepare_group(group, "p2p");
  ASSERT_TRUE(prepared) << prepared.status().message();
  for (const auto& t : (*prepared)->transfers) {
    if (!t) continue;
    for (const auto& s : t->shares) EXPECT_EQ(s.text.find("rail 1"), std::string::npos) << s.text;
    expect_verifies(*t);
  }
}

TEST(Balancer, TheGpuTestsDemandsSplitAsThoseTestsExpect) {
  // runtime_balance_test's skewed all-to-all-v (int32 counts; EFCCL_BALANCE_MIN_BYTES 65536)
  // must run multi-path plans with the host path and the relay kind each case names.
  ScopedEnv min("EFCCL_BALANCE_MIN_BYTES", "65536");
  const auto count = [](int s, int d, int n) -> uint64_t {
    if (s == d) return 1000 + 17 * static_cast<uint64_t>(s);
    if (s == 0 && d == 1 % n) return 3 * MiB / 4 + 13;
    return 40000 + 9973 * static_cast<uint64_t>((s * 3 + d) % 5) + static_cast<uint64_t>(d);
  };
  struct Case {
    const char* preset;
    int n;
    const char* relay;
  };
  for (const Case& k : {Case{"nimble-h100", 2, "no kernel there"},
                        Case{"nimble-h100", 4, "forwarded by rank"}, Case{"h200-nv18-x2", 4, ""}}) {
    SCOPED_TRACE(std::string(k.preset) + " x" + std::to_string(k.n));
    auto b = balancer_on(k.preset, k.n);
    std::vector<Balancer::TransferKey> group;
    for (int32_t r = 0; r < k.n; ++r)
      for (int32_t q = 0; q < k.n; ++q) group.push_back({r, q, 4 * count(r, q, k.n)});
    auto prepared = b->prepare_group(group, "p2p");
    ASSERT_TRUE(prepared) << prepared.status().message();
    bool host = false, relay = *k.relay == 0;
    for (const auto& t : (*prepared)->transfers) {
      if (!t) continue;
      host = host || has_text(*t, "host memory");
      relay = relay || has_text(*t, k.relay);
      expect_verifies(*t);
    }
    EXPECT_TRUE(host);
    EXPECT_TRUE(relay) << k.relay;
  }
  // The batch_isend_irecv-like ring of four ranks on nimble-h100: both directions, about
  // 1.2 MB a message.
  auto b = balancer_on("nimble-h100", 4);
  std::vector<Balancer::TransferKey> ring;
  for (int32_t r = 0; r < 4; ++r)
    for (int32_t q : {(r + 1) % 4, (r + 3) % 4})
      ring.push_back(
          {r, q, 4 * (300000 + 4099 * static_cast<uint64_t>(r) + static_cast<uint64_t>(q))});
  auto prepared = b->prepare_group(ring, "p2p");
  ASSERT_TRUE(prepared);
  std::size_t split = 0;
  bool host = false;
  for (const auto& t : (*prepared)->transfers)
    if (t) {
      ++split;
      host = host || has_text(*t, "host memory");
    }
  EXPECT_GT(split, 0u);
  EXPECT_TRUE(host);
}

}  // namespace
}  // namespace efccl::runtime
