// The balancer's planner (efccl/balance/planner.h) against the exact optimum of its linear
// program (lp_optimum.h) on the presets with 1-4 hosts and many demand shapes.
#include "efccl/balance/planner.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "efccl/topology/presets.h"
#include "lp_optimum.h"

namespace {

using namespace efccl;
using balance::Demand;
using balance::Plan;

constexpr uint64_t MiB = 1u << 20;

std::shared_ptr<const balance::PathTable> table_of(const char* name, int nodes) {
  auto t = topo::preset(name, nodes);
  EXPECT_TRUE(t) << t.status().message();
  auto table = balance::PathTable::build(*t, t->gpus());
  EXPECT_TRUE(table) << table.status().message();
  return *table;
}

Demand zeros(int n) { return Demand{n, std::vector<uint64_t>(static_cast<std::size_t>(n * n), 0)}; }
void set(Demand& d, int s, int t, uint64_t b) { d.bytes[static_cast<std::size_t>(s * d.nranks + t)] = b; }

/// Skewed all-to-all (NIMBLE's hotspot): a fraction `hot` of every rank's bytes goes to rank 0,
/// the rest spread evenly.
Demand hotspot(int n, uint64_t per_rank, double hot) {
  Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s == t) continue;
      const double share = t == 0 ? hot : (1 - hot) / (n - (s == 0 ? 1 : 2));
      set(d, s, t, s == 0 && t == 0 ? 0 : static_cast<uint64_t>(share * static_cast<double>(per_rank)));
    }
  return d;
}

Demand uniform(int n, uint64_t pair) {
  Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t)
      if (s != t) set(d, s, t, pair);
  return d;
}

/// MoE dispatch, top-2, one hot expert: 16K tokens x 4096 bf16 spread over ranks, rank 1's
/// expert takes a third of the routed tokens.
Demand moe(int n) {
  const uint64_t token = 4096 * 2;
  const uint64_t tokens_per_rank = 16384 / static_cast<uint64_t>(n) * 2;  // top-2
  Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s == t) continue;
      const double share = t == 1 ? 1.0 / 3 : (2.0 / 3) / (n - 1);
      set(d, s, t, static_cast<uint64_t>(share * static_cast<double>(tokens_per_rank * token)));
    }
  return d;
}

Demand many_to_few(int n) {
  Demand d = zeros(n);
  for (int s = 2; s < n; ++s) {
    set(d, s, 0, 96 * MiB);
    set(d, s, 1, 64 * MiB);
  }
  return d;
}

Demand stencil(int n) {  // neighbours, boundary ranks heavy
  Demand d = zeros(n);
  for (int s = 0; s < n; ++s) {
    const uint64_t b = (s == 0 || s == n - 1) ? 256 * MiB : 32 * MiB;
    set(d, s, (s + 1) % n, b);
    set(d, s, (s + n - 1) % n, b);
  }
  return d;
}

Demand sparse(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  Demand d = zeros(n);
  for (int k = 0; k < n; ++k) {
    const int s = static_cast<int>(rng() % static_cast<uint32_t>(n));
    const int t = static_cast<int>(rng() % static_cast<uint32_t>(n));
    if (s != t) set(d, s, t, (1 + rng() % 512) * MiB);
  }
  return d;
}

Demand lone_pair(int n, int s, int t, uint64_t b) {
  Demand d = zeros(n);
  set(d, s, t, b);
  return d;
}

/// Every acceptance property of one plan.
void check_plan(const balance::PathTable& table, const Demand& demand, const std::string& what,
                bool uniform_traffic = false) {
  balance::Planner planner(std::shared_ptr<const balance::PathTable>(&table, [](auto*) {}),
                           balance::PlannerOptions{});
  auto plan = planner.plan(demand);
  ASSERT_TRUE(plan) << what << ": " << plan.status().message();
  const double optimum = lp::optimum_max_load_us(table.topology(), *plan);
  EXPECT_LE(plan->max_load_us, optimum * 1.05 + 1e-9)
      << what << ": plan " << plan->max_load_us << " us, optimum " << optimum << " us";
  EXPECT_LE(plan->max_load_us, plan->direct_max_load_us * (1 + 1e-12)) << what;
  if (uniform_traffic) {
    EXPECT_LE(plan->max_load_us, plan->direct_max_load_us * 1.01) << what;
  }
  for (const auto& p : plan->pairs) {
    uint64_t sum = 0;
    for (const auto& s : p.paths) {
      sum += s.bytes;
      ASSERT_LT(s.candidate, p.candidates->size());
    }
    EXPECT_EQ(sum, p.bytes) << what << " pair " << p.src << "->" << p.dst;
    if (p.bytes < plan->min_split_bytes) {
      ASSERT_EQ(p.paths.size(), 1u) << what;
      EXPECT_EQ(p.paths[0].candidate, 0u) << what;
    }
  }
}

TEST(Planner, LonePairUsesEveryPathOfTheNimbleNode) {
  auto table = table_of("nimble-h100", 1);
  const Demand d = lone_pair(4, 0, 1, 1024 * MiB);
  check_plan(*table, d, "lone pair");
  balance::Planner planner(table, {});
  auto plan = planner.plan(d);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->pairs.size(), 1u);
  EXPECT_EQ(plan->pairs[0].candidates->size(), 4u);  // direct, two relays, host memory
  EXPECT_EQ(plan->pairs[0].paths.size(), 4u);
  // Direct alone: 1 GiB / 150 GB/s; all four: / (150 + 150 + 150 + 63).
  EXPECT_NEAR(plan->direct_max_load_us, 1024.0 * MiB / 150e3, 1e-6);
  EXPECT_NEAR(plan->max_load_us, 1024.0 * MiB / (450e3 + topo::pcie_gbps(32, 16) * 1e3),
              plan->max_load_us * 0.03);
}

TEST(Planner, HostPathOfTheTwoH200Machine) {
  auto table = table_of("h200-nv18-x2", 1);
  check_plan(*table, lone_pair(2, 0, 1, 2048 * MiB), "h200 pair");
  balance::Planner planner(table, {});
  auto plan = planner.plan(lone_pair(2, 0, 1, 2048 * MiB));
  ASSERT_TRUE(plan);
  EXPECT_NEAR(plan->max_load_us, 2048.0 * MiB / 450e3, plan->max_load_us * 0.02);
}

TEST(Planner, SkewedAllToAllAcrossHostsWithinFivePercentOfTheOptimum) {
  for (int hosts : {1, 2}) {
    auto table = table_of("nimble-h100", hosts);
    const int n = 4 * hosts;
    for (double hot : {0.1, 0.3, 0.5, 0.7, 0.9})
      for (uint64_t per_rank : {64 * MiB, 1024 * MiB})
        check_plan(*table, hotspot(n, per_rank, hot),
                   "nimble x" + std::to_string(hosts) + " hot " + std::to_string(hot) + " " +
                       std::to_string(per_rank / MiB) + " MiB");
  }
}

TEST(Planner, ManyShapesOnEveryPreset) {
  struct Case {
    const char* preset;
    int hosts;
  };
  for (Case c : {Case{"nimble-h100", 1}, Case{"nimble-h100", 3}, Case{"dgx-h100", 1},
                 Case{"hgx-h200", 1}, Case{"h200-nv18-x2", 1}, Case{"dgx-h100", 2},
                 Case{"nimble-h100", 4}}) {
    auto table = table_of(c.preset, c.hosts);
    const int n = table->nranks();
    const std::string at = std::string(c.preset) + " x" + std::to_string(c.hosts) + ": ";
    check_plan(*table, moe(n), at + "moe");
    check_plan(*table, many_to_few(n), at + "many to few");
    check_plan(*table, stencil(n), at + "stencil");
    check_plan(*table, sparse(n, 7), at + "sparse");
    check_plan(*table, lone_pair(n, n - 1, 0, 512 * MiB), at + "lone pair");
    check_plan(*table, uniform(n, 64 * MiB), at + "uniform", /*uniform_traffic=*/true);
    check_plan(*table, hotspot(n, 256 * MiB, 0.2), at + "small skew");
  }
}

TEST(Planner, SmallPairsStayOnTheirDefaultPath) {
  auto table = table_of("nimble-h100", 1);
  balance::Planner planner(table, {});
  auto plan = planner.plan(lone_pair(4, 0, 1, MiB - 1));
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->pairs[0].paths.size(), 1u);
  EXPECT_EQ(plan->pairs[0].paths[0].candidate, 0u);
  EXPECT_EQ(plan->max_load_us, plan->direct_max_load_us);
}

TEST(Planner, PlansAreTheSameEverywhere) {
  auto table = table_of("nimble-h100", 2);
  const Demand d = hotspot(8, 512 * MiB, 0.6);
  balance::Planner a(table, {});
  auto first = a.plan(d);
  ASSERT_TRUE(first);
  std::vector<Plan> others(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      // A table of its own, as another rank would build it.
      balance::Planner p(table_of("nimble-h100", 2), {});
      others[static_cast<std::size_t>(i)] = *p.plan(d);
    });
  for (auto& t : threads) t.join();
  for (const Plan& o : others) {
    ASSERT_EQ(o.pairs.size(), first->pairs.size());
    EXPECT_EQ(o.max_load_us, first->max_load_us);
    for (std::size_t i = 0; i < o.pairs.size(); ++i) {
      ASSERT_EQ(o.pairs[i].paths.size(), first->pairs[i].paths.size());
      for (std::size_t k = 0; k < o.pairs[i].paths.size(); ++k) {
        EXPECT_EQ(o.pairs[i].paths[k].candidate, first->pairs[i].paths[k].candidate);
        EXPECT_EQ(o.pairs[i].paths[k].bytes, first->pairs[i].paths[k].bytes);
      }
    }
  }
}

TEST(Planner, ARepeatingDemandKeepsItsPlanUnlessANewOneIsClearlyBetter) {
  auto table = table_of("nimble-h100", 1);
  balance::PlannerOptions o;
  o.hysteresis = 0.5;
  balance::Planner planner(table, o);
  const Demand d = lone_pair(4, 0, 1, 1024 * MiB);
  auto first = planner.plan(d);
  ASSERT_TRUE(first);
  // Load on the relay through gpu2: a fresh plan would avoid it, but not by 50%.
  std::vector<double> background(table->topology().links().size(), 0.0);
  const auto& relay = (*first->pairs[0].candidates)[1].links;
  background[relay[0]] = 200.0 * MiB;
  auto second = planner.plan(d, background);
  ASSERT_TRUE(second);
  ASSERT_EQ(second->pairs[0].paths.size(), first->pairs[0].paths.size());
  for (std::size_t k = 0; k < first->pairs[0].paths.size(); ++k)
    EXPECT_EQ(second->pairs[0].paths[k].bytes, first->pairs[0].paths[k].bytes);
  EXPECT_GT(second->max_load_us, first->max_load_us) << "the kept plan, under today's load";
}

TEST(Planner, BadInputsAreErrors) {
  auto table = table_of("nimble-h100", 1);
  balance::Planner planner(table, {});
  EXPECT_FALSE(planner.plan(zeros(3)));
  EXPECT_FALSE(planner.plan(zeros(4), std::vector<double>(3, 0.0)));
  Demand huge = zeros(4);
  set(huge, 0, 1, ~uint64_t{0} - 10);  // built directly, not through demand_from_json
  auto refused = planner.plan(huge);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().message(), "the demand of ranks 0 -> 1 is more than 2^50 bytes");
  set(huge, 0, 1, uint64_t{1} << 50);
  auto largest = planner.plan(huge);
  ASSERT_TRUE(largest) << largest.status().message();
  uint64_t sum = 0;
  for (const auto& s : largest->pairs[0].paths) sum += s.bytes;
  EXPECT_EQ(sum, uint64_t{1} << 50);
  auto bad = balance::demand_from_json(R"({"ranks": 2, "bytes": [[0, 1], [2]]})", "d.json");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message(), "d.json: bytes[1] must have 2 entries");
  EXPECT_FALSE(balance::demand_from_json(R"({"ranks": 1, "bytes": [[-1]]})", "d.json"));
  EXPECT_FALSE(balance::demand_from_json(R"({"ranks": 0, "bytes": []})", "d.json"));
  auto good = balance::demand_from_json(R"({"ranks": 2, "bytes": [[0, 5], [7, 0]]})", "d.json");
  ASSERT_TRUE(good) << good.status().message();
  EXPECT_EQ(good->at(1, 0), 7u);
}

}  // namespace
