// The balancer's planner (efccl/balance/planner.h) against the exact optimum of its linear
// program (lp_optimum.h) on the presets with 1-4 hosts and many demand shapes.
#include "efccl/balance/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <span>
#include <thread>

#include "efccl/topology/presets.h"
#include "lp_optimum.h"
#include "preset_table.h"

namespace {

using namespace efccl;
using balance::Demand;
using balance::Plan;

constexpr uint64_t MiB = 1u << 20;

using test_support::table_of;

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

TEST(Planner, WithoutHostMemoryTheNodeKeepsItsNvlinkPaths) {
  // PathTableOptions::host_memory = false (the runtime's default on real machines): no
  // candidate through pinned host memory, the NVLink walks unchanged, and the plan the best of
  // what is left: 1 GiB over direct + two relays at 150 GB/s each.
  auto t = topo::preset("nimble-h100", 1);
  ASSERT_TRUE(t) << t.status().message();
  balance::PathTableOptions options;
  options.host_memory = false;
  auto without = balance::PathTable::build(*t, t->gpus(), options);
  ASSERT_TRUE(without) << without.status().message();
  auto with = balance::PathTable::build(*t, t->gpus());
  ASSERT_TRUE(with) << with.status().message();
  auto all = (*with)->candidates(0, 1);
  auto some = (*without)->candidates(0, 1);
  ASSERT_TRUE(all && some);
  ASSERT_EQ((*all)->size(), 4u);
  ASSERT_EQ((*some)->size(), 3u);
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_EQ((**some)[c].links, (**all)[c].links) << c;
    EXPECT_NE((**some)[c].kind, balance::CandidateKind::kHost) << c;
  }
  EXPECT_EQ((**all)[3].kind, balance::CandidateKind::kHost);
  const Demand d = lone_pair(4, 0, 1, 1024 * MiB);
  check_plan(**without, d, "lone pair without host memory");
  balance::Planner planner(*without, {});
  auto plan = planner.plan(d);
  ASSERT_TRUE(plan);
  EXPECT_NEAR(plan->max_load_us, 1024.0 * MiB / 450e3, plan->max_load_us * 0.03);
  // The two-H200 machine: NVLink alone, so nothing to balance.
  auto h200 = topo::preset("h200-nv18-x2", 1);
  ASSERT_TRUE(h200);
  auto pair = balance::PathTable::build(*h200, h200->gpus(), options);
  ASSERT_TRUE(pair);
  balance::Planner p2(*pair, {});
  auto plan2 = p2.plan(lone_pair(2, 0, 1, 2048 * MiB));
  ASSERT_TRUE(plan2);
  EXPECT_DOUBLE_EQ(plan2->max_load_us, plan2->direct_max_load_us);
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

TEST(Planner, ThreadsFillingOneTableGetTheSamePlans) {
  // Rows and candidate sets are filled on first use and read without a lock: planners in
  // several threads over one fresh table must see complete entries and agree with a table
  // filled by one thread.
  auto shared = table_of("dgx-h100", 2);
  const std::vector<Demand> demands = {hotspot(16, 512 * MiB, 0.6), moe(16), sparse(16, 3),
                                       uniform(16, 64 * MiB)};
  std::vector<std::vector<Plan>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      balance::Planner p(shared, {});
      for (std::size_t k = 0; k < demands.size(); ++k)
        got[static_cast<std::size_t>(i)].push_back(
            *p.plan(demands[(k + static_cast<std::size_t>(i)) % demands.size()]));
    });
  for (auto& t : threads) t.join();
  auto alone = table_of("dgx-h100", 2);
  for (int i = 0; i < 4; ++i)
    for (std::size_t k = 0; k < demands.size(); ++k) {
      const Plan want = *balance::Planner(alone, {}).plan(demands[(k + static_cast<std::size_t>(i)) % demands.size()]);
      const Plan& have = got[static_cast<std::size_t>(i)][k];
      EXPECT_EQ(have.max_load_us, want.max_load_us);
      ASSERT_EQ(have.pairs.size(), want.pairs.size());
      for (std::size_t j = 0; j < want.pairs.size(); ++j) {
        // (A small pair lists candidates[0] alone, or all of them when some plan needed them
        // before: that history differs between the tables; the walks used may not.)
        const auto& h = have.pairs[j];
        const auto& w = want.pairs[j];
        ASSERT_EQ(h.paths.size(), w.paths.size());
        for (std::size_t q = 0; q < w.paths.size(); ++q) {
          EXPECT_EQ(h.paths[q].candidate, w.paths[q].candidate);
          EXPECT_EQ(h.paths[q].bytes, w.paths[q].bytes);
          EXPECT_EQ((*h.candidates)[h.paths[q].candidate].links,
                    (*w.candidates)[w.paths[q].candidate].links);
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

TEST(Planner, TheDefaultPathIsCandidatesZeroOfTheWholeSet) {
  // The planner adds small pairs onto a row's flat default paths and splits the big ones over
  // their whole candidate sets: both must agree on candidates[0].
  for (auto [preset, hosts] : {std::pair{"nimble-h100", 3}, std::pair{"dgx-h100", 2},
                               std::pair{"hgx-h200", 1}, std::pair{"h200-nv18-x2", 1}}) {
    auto table = table_of(preset, hosts);
    for (int s = 0; s < table->nranks(); ++s)
      for (int d = 0; d < table->nranks(); ++d) {
        auto alone = table->candidates(s, d, /*only_default=*/true);
        auto all = table->candidates(s, d);
        ASSERT_TRUE(alone && all) << preset << " " << s << "->" << d;
        EXPECT_EQ((*alone)->front().links, (*all)->front().links) << preset << " " << s << "->" << d;
        EXPECT_EQ((*alone)->front().via, (*all)->front().via) << preset << " " << s << "->" << d;
      }
  }
}

TEST(Planner, ACompactPlanListsThePairsOffTheirDefaultPath) {
  auto table = table_of("nimble-h100", 2);
  const Demand d = hotspot(8, 512 * MiB, 0.6);
  balance::PlannerOptions compact;
  compact.list_direct_pairs = false;
  auto full = balance::Planner(table, {}).plan(d);
  auto some = balance::Planner(table, compact).plan(d);
  ASSERT_TRUE(full && some);
  EXPECT_TRUE(full->lists_direct_pairs);
  EXPECT_FALSE(some->lists_direct_pairs);
  EXPECT_EQ(some->max_load_us, full->max_load_us);
  EXPECT_EQ(some->link_bytes, full->link_bytes);
  std::size_t k = 0;
  for (const auto& p : full->pairs) {
    if (p.paths.size() == 1 && p.paths[0].candidate == 0) continue;
    ASSERT_LT(k, some->pairs.size());
    const auto& q = some->pairs[k++];
    EXPECT_EQ(q.src, p.src);
    EXPECT_EQ(q.dst, p.dst);
    EXPECT_EQ(q.bytes, p.bytes);
    EXPECT_EQ(q.candidates, p.candidates);
    ASSERT_EQ(q.paths.size(), p.paths.size());
    for (std::size_t i = 0; i < p.paths.size(); ++i) {
      EXPECT_EQ(q.paths[i].candidate, p.paths[i].candidate);
      EXPECT_EQ(q.paths[i].bytes, p.paths[i].bytes);
    }
  }
  EXPECT_EQ(k, some->pairs.size());
  EXPECT_GT(k, 0u);
}

TEST(Planner, ARepeatUnderTheSameLoadIsThePlanInForce) {
  auto table = table_of("dgx-h100", 2);
  balance::Planner planner(table, {});
  const Demand d = hotspot(16, 256 * MiB, 0.5);
  auto first = planner.plan(d);
  auto again = planner.plan(d);
  ASSERT_TRUE(first && again);
  EXPECT_EQ(again->max_load_us, first->max_load_us);
  EXPECT_EQ(again->link_bytes, first->link_bytes);
  ASSERT_EQ(again->pairs.size(), first->pairs.size());
  for (std::size_t i = 0; i < first->pairs.size(); ++i) {
    ASSERT_EQ(again->pairs[i].paths.size(), first->pairs[i].paths.size());
    for (std::size_t k = 0; k < first->pairs[i].paths.size(); ++k)
      EXPECT_EQ(again->pairs[i].paths[k].bytes, first->pairs[i].paths[k].bytes);
  }
}

TEST(Planner, RandomDemandsWithinFivePercentOfTheOptimum) {
  // Shapes the named tests do not cover: random sizes from 1 KiB to 1 GiB, hot sources and
  // destinations, partial densities, background load.
  std::mt19937_64 rng(20261127);
  const std::vector<std::pair<const char*, int>> presets = {
      {"nimble-h100", 1}, {"nimble-h100", 2}, {"dgx-h100", 1}, {"hgx-h200", 1}, {"h200-nv18-x2", 1}};
  std::vector<std::shared_ptr<const balance::PathTable>> tables;
  for (auto [name, hosts] : presets) tables.push_back(table_of(name, hosts));
  for (int k = 0; k < 60; ++k) {
    const std::size_t which = rng() % tables.size();
    const auto& table = tables[which];
    const int n = table->nranks();
    Demand d = zeros(n);
    const int shape = static_cast<int>(rng() % 4);
    const double density = 0.1 + static_cast<double>(rng() % 90) / 100.0;
    for (int s = 0; s < n; ++s)
      for (int t = 0; t < n; ++t) {
        if (s == t || static_cast<double>(rng() % 1000) / 1000.0 > density) continue;
        const uint64_t bytes = shape == 0   ? (rng() % 1024 + 1) * MiB
                               : shape == 1 ? (t < 2 ? 512 : 16) * MiB
                               : shape == 2 ? (s == 0 ? 512 : 8) * MiB
                                            : uint64_t{1} << (10 + rng() % 21);
        set(d, s, t, bytes);
      }
    std::vector<double> background;
    if (rng() % 3 == 0) {
      background.assign(table->topology().links().size(), 0.0);
      for (double& b : background)
        if (rng() % 8 == 0) b = static_cast<double>(rng() % (512 * MiB));
    }
    const std::string what = std::string(presets[which].first) + " x" +
                             std::to_string(presets[which].second) + " case " + std::to_string(k);
    balance::Planner planner(table, {});
    auto plan = planner.plan(d, background);
    ASSERT_TRUE(plan) << what << ": " << plan.status().message();
    const double optimum = lp::optimum_max_load_us(table->topology(), *plan, background);
    EXPECT_LE(plan->max_load_us, optimum * 1.05 + 1e-9)
        << what << ": plan " << plan->max_load_us << " us, optimum " << optimum << " us";
    EXPECT_LE(plan->max_load_us, plan->direct_max_load_us * (1 + 1e-12)) << what;
    for (const auto& p : plan->pairs) {
      uint64_t sum = 0;
      for (const auto& s : p.paths) sum += s.bytes;
      EXPECT_EQ(sum, p.bytes) << what;
      if (p.bytes < plan->min_split_bytes) {
        ASSERT_EQ(p.paths.size(), 1u) << what;
        EXPECT_EQ(p.paths[0].candidate, 0u) << what;
      }
    }
  }
}

TEST(Planner, AThousandRanksPlanTheirHotPairs) {
  // 128 hosts x 8: a million pairs, NIMBLE's hotspot. Listing only the pairs off their default
  // path keeps the plan small; every pair's bytes must still be accounted for in the loads.
  auto table = table_of("dgx-h100", 128);
  const int n = table->nranks();
  ASSERT_EQ(n, 1024);
  const Demand d = hotspot(n, 1024 * MiB, 0.5);
  balance::PlannerOptions compact;
  compact.list_direct_pairs = false;
  auto plan = balance::Planner(table, compact).plan(d);
  ASSERT_TRUE(plan) << plan.status().message();
  EXPECT_LT(plan->max_load_us * 4, plan->direct_max_load_us);
  ASSERT_FALSE(plan->pairs.empty());
  uint64_t moved = 0;
  for (const auto& p : plan->pairs) {
    EXPECT_EQ(p.dst, 0) << "only the hot rank's senders need to spread";
    uint64_t sum = 0;
    for (const auto& s : p.paths) sum += s.bytes;
    EXPECT_EQ(sum, p.bytes);
    moved += p.bytes;
  }
  // The loads count every byte of every pair once per link of its path: the busiest of them
  // is the plan's maximum.
  EXPECT_DOUBLE_EQ(balance::max_load_us(table->topology(), plan->link_bytes), plan->max_load_us);
  EXPECT_GT(moved, 0u);
}

/// A demand that depends only on the ranks' places on their hosts (`per_host` ranks a host,
/// host by host) and on whether the hosts are the same: what the plan by class covers.
Demand by_place(int n, int per_host, const std::function<uint64_t(int, int)>& same,
                const std::function<uint64_t(int, int)>& other) {
  Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t)
      if (s != t)
        set(d, s, t, s / per_host == t / per_host ? same(s % per_host, t % per_host)
                                                  : other(s % per_host, t % per_host));
  return d;
}

StatusOr<Plan> plan_with(std::shared_ptr<const balance::PathTable> table, const Demand& d,
                         bool by_class, std::span<const double> background = {}) {
  balance::PlannerOptions options;
  options.by_class = by_class;
  return balance::Planner(std::move(table), options).plan(d, background);
}

void expect_same_plan(const Plan& a, const Plan& b, const std::string& what) {
  EXPECT_EQ(a.max_load_us, b.max_load_us) << what;
  EXPECT_EQ(a.link_bytes, b.link_bytes) << what;
  ASSERT_EQ(a.pairs.size(), b.pairs.size()) << what;
  for (std::size_t i = 0; i < a.pairs.size(); ++i) {
    EXPECT_EQ(a.pairs[i].src, b.pairs[i].src) << what;
    EXPECT_EQ(a.pairs[i].dst, b.pairs[i].dst) << what;
    ASSERT_EQ(a.pairs[i].paths.size(), b.pairs[i].paths.size()) << what;
    for (std::size_t k = 0; k < a.pairs[i].paths.size(); ++k) {
      EXPECT_EQ(a.pairs[i].paths[k].candidate, b.pairs[i].paths[k].candidate) << what;
      EXPECT_EQ(a.pairs[i].paths[k].bytes, b.pairs[i].paths[k].bytes) << what;
    }
  }
}

TEST(Planner, ThePlanByClassMatchesTheGeneralPlannerAndTheOptimum) {
  struct Case {
    const char* preset;
    int hosts;
    bool exact;  // small enough for the exact LP
  };
  int by_class = 0;
  for (Case c : {Case{"dgx-h100", 2, true}, Case{"nimble-h100", 2, true},
                 Case{"nimble-h100", 4, true}, Case{"dgx-h100", 3, false},
                 Case{"dgx-h100", 8, false}}) {
    auto table = table_of(c.preset, c.hosts);
    const int n = table->nranks();
    const int k = n / c.hosts;
    const std::string at = std::string(c.preset) + " x" + std::to_string(c.hosts) + ": ";
    const struct {
      std::string name;
      Demand demand;
    } demands[] = {
        {"uniform 1 GiB a rank", uniform(n, 1024 * MiB / static_cast<uint64_t>(n - 1))},
        {"uniform 16 MiB a pair", uniform(n, 16 * MiB)},
        {"skewed by place",
         by_place(n, k, [](int i, int j) { return (1 + (3 * i + j) % 5) * 8 * MiB; },
                  [](int i, int j) { return (1 + (i + 2 * j) % 7) * 16 * MiB; })},
        {"some classes under the threshold",
         by_place(n, k, [](int i, int j) { return (i + j) % 2 == 0 ? 512 * 1024 : 40 * MiB; },
                  [](int i, int j) { return (i + j) % 3 == 0 ? 256 * 1024 : 24 * MiB; })},
    };
    for (const auto& d : demands) {
      const std::string what = at + d.name;
      auto fast = plan_with(table, d.demand, true);
      auto general = plan_with(table, d.demand, false);
      ASSERT_TRUE(fast) << what << ": " << fast.status().message();
      ASSERT_TRUE(general) << what << ": " << general.status().message();
      EXPECT_FALSE(general->by_class) << what;
      if (!fast->by_class) {
        expect_same_plan(*fast, *general, what + " (not by class)");
        continue;
      }
      ++by_class;
      // Within the certificate's 1% of the general planner's answer (both are within 1% of
      // the same proven lower bound), never above the direct plan, and within 5% of the LP.
      EXPECT_LE(fast->max_load_us, general->max_load_us * 1.01 + 1e-9) << what;
      EXPECT_LT(fast->max_load_us, fast->direct_max_load_us) << what;
      EXPECT_EQ(fast->direct_max_load_us, general->direct_max_load_us) << what;
      EXPECT_DOUBLE_EQ(balance::max_load_us(table->topology(), fast->link_bytes),
                       fast->max_load_us)
          << what;
      if (c.exact) {
        const double optimum = lp::optimum_max_load_us(table->topology(), *fast);
        EXPECT_LE(fast->max_load_us, optimum * 1.05 + 1e-9)
            << what << ": plan " << fast->max_load_us << " us, optimum " << optimum << " us";
      }
      // Every pair with bytes listed once (src-major), its bytes adding up, the small ones on
      // candidates[0].
      std::size_t listed = 0;
      for (const auto& p : fast->pairs) {
        EXPECT_EQ(p.bytes, d.demand.at(p.src, p.dst)) << what;
        uint64_t sum = 0;
        for (const auto& s : p.paths) {
          sum += s.bytes;
          ASSERT_LT(s.candidate, p.candidates->size()) << what;
        }
        EXPECT_EQ(sum, p.bytes) << what << " pair " << p.src << "->" << p.dst;
        // The general planner's granularity: every share but the largest in 1/64 pieces.
        if (p.paths.size() > 1) {
          const uint64_t grain = balance::PlannerOptions{}.piece_bytes / 64;
          const auto largest = std::max_element(
              p.paths.begin(), p.paths.end(),
              [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
          for (auto it = p.paths.begin(); it != p.paths.end(); ++it)
            if (it != largest) {
              EXPECT_EQ(it->bytes % grain, 0u)
                  << what << " pair " << p.src << "->" << p.dst << " candidate " << it->candidate;
            }
        }
        if (p.bytes < fast->min_split_bytes) {
          ASSERT_EQ(p.paths.size(), 1u) << what;
          EXPECT_EQ(p.paths[0].candidate, 0u) << what;
        }
        ++listed;
      }
      EXPECT_EQ(listed, static_cast<std::size_t>(
                            std::count_if(d.demand.bytes.begin(), d.demand.bytes.end(),
                                          [](uint64_t b) { return b > 0; })))
          << what;
      // The compact listing: the same plan, only the pairs off their default path.
      balance::PlannerOptions compact;
      compact.list_direct_pairs = false;
      auto short_plan = balance::Planner(table, compact).plan(d.demand);
      ASSERT_TRUE(short_plan) << what;
      EXPECT_TRUE(short_plan->by_class) << what;
      EXPECT_EQ(short_plan->link_bytes, fast->link_bytes) << what;
      std::size_t off = 0;
      for (const auto& p : fast->pairs)
        if (p.paths.size() != 1 || p.paths[0].candidate != 0) ++off;
      EXPECT_EQ(short_plan->pairs.size(), off) << what;
    }
  }
  // Where balancing helps on identical hosts (the inter-socket links of dgx-h100) the
  // classes decide: the fast path must be taken somewhere, uniform traffic included.
  EXPECT_GE(by_class, 3);
  auto table = table_of("dgx-h100", 8);
  auto uniform_plan = plan_with(table, uniform(64, 16 * MiB), true);
  ASSERT_TRUE(uniform_plan);
  EXPECT_TRUE(uniform_plan->by_class);
}

TEST(Planner, RandomDemandsByPlaceMatchTheGeneralPlanner) {
  // Sizes by (same host?, i, j) drawn around the threshold and far above it, some zero: the
  // plan by class, where taken, within 1% of the general planner and 5% of the exact LP.
  std::mt19937 rng(11);
  int by_class = 0;
  for (int round = 0; round < 24; ++round) {
    const char* preset = round % 3 == 2 ? "nimble-h100" : "dgx-h100";
    const int hosts = preset[0] == 'n' ? 2 + round % 2 : 2;  // up to 16 ranks: the exact LP
    auto table = table_of(preset, hosts);
    const int n = table->nranks();
    const int k = n / hosts;
    std::vector<uint64_t> same(static_cast<std::size_t>(k * k)), other(same.size());
    for (auto* v : {&same, &other})
      for (uint64_t& b : *v) {
        const uint32_t r = rng() % 8;
        b = r == 0 ? 0 : r < 3 ? (512 + rng() % 1024) * 1024 : (1 + rng() % 256) * MiB;
      }
    const Demand d = by_place(
        n, k, [&](int i, int j) { return same[static_cast<std::size_t>(i * k + j)]; },
        [&](int i, int j) { return other[static_cast<std::size_t>(i * k + j)]; });
    const std::string what = std::string(preset) + " x" + std::to_string(hosts) + " round " +
                             std::to_string(round);
    auto fast = plan_with(table, d, true);
    auto general = plan_with(table, d, false);
    ASSERT_TRUE(fast) << what;
    ASSERT_TRUE(general) << what;
    if (!fast->by_class) {
      expect_same_plan(*fast, *general, what);
      continue;
    }
    ++by_class;
    EXPECT_LE(fast->max_load_us, general->max_load_us * 1.01 + 1e-9) << what;
    EXPECT_LT(fast->max_load_us, fast->direct_max_load_us) << what;
    const double optimum = lp::optimum_max_load_us(table->topology(), *fast);
    EXPECT_LE(fast->max_load_us, optimum * 1.05 + 1e-9) << what;
    for (const auto& p : fast->pairs) {
      uint64_t sum = 0;
      for (const auto& s : p.paths) sum += s.bytes;
      EXPECT_EQ(sum, p.bytes) << what;
      if (p.bytes < fast->min_split_bytes) {
        EXPECT_EQ(p.paths[0].candidate, 0u) << what;
      }
    }
  }
  EXPECT_GT(by_class, 0);
}

TEST(Planner, AnAsymmetricDemandIsNotPlannedByClass) {
  auto table = table_of("dgx-h100", 2);
  const int n = table->nranks();
  Demand d = uniform(n, 64 * MiB);
  auto symmetric = plan_with(table, d, true);
  ASSERT_TRUE(symmetric);
  ASSERT_TRUE(symmetric->by_class);
  // One pair one byte off, a pair on one host only, a background load on one link: the
  // general planner, bit for bit.
  std::vector<Demand> skewed(3, d);
  set(skewed[0], 3, 12, 64 * MiB + 1);
  set(skewed[1], 9, 10, 80 * MiB);
  set(skewed[2], 0, 9, 0);
  for (std::size_t i = 0; i < skewed.size(); ++i) {
    auto fast = plan_with(table, skewed[i], true);
    auto general = plan_with(table, skewed[i], false);
    ASSERT_TRUE(fast);
    ASSERT_TRUE(general);
    EXPECT_FALSE(fast->by_class) << i;
    expect_same_plan(*fast, *general, "skewed " + std::to_string(i));
  }
  std::vector<double> background(table->topology().links().size(), 0.0);
  background[0] = 1e6;
  auto loaded = plan_with(table, d, true, background);
  auto loaded_general = plan_with(table, d, false, background);
  ASSERT_TRUE(loaded);
  ASSERT_TRUE(loaded_general);
  EXPECT_FALSE(loaded->by_class);
  expect_same_plan(*loaded, *loaded_general, "background");
  // Ranks not host by host in the same order: no classes.
  auto t = topo::preset("dgx-h100", 2);
  ASSERT_TRUE(t);
  std::vector<topo::NodeIndex> gpus = t->gpus();
  std::swap(gpus[0], gpus[1]);  // host 0's first two ranks swapped, host 1's not
  auto swapped = balance::PathTable::build(*t, gpus);
  ASSERT_TRUE(swapped);
  auto swapped_plan = plan_with(*swapped, d, true);
  auto swapped_general = plan_with(*swapped, d, false);
  ASSERT_TRUE(swapped_plan);
  ASSERT_TRUE(swapped_general);
  EXPECT_FALSE(swapped_plan->by_class);
  expect_same_plan(*swapped_plan, *swapped_general, "swapped ranks");
  // Two ranks a GPU, and hosts that differ (one link of host 1 at half its capacity): no
  // classes either.
  std::vector<topo::NodeIndex> twice;
  for (topo::NodeIndex g : t->gpus()) twice.insert(twice.end(), {g, g});
  auto shared = balance::PathTable::build(*t, twice);
  ASSERT_TRUE(shared);
  const Demand d32 = uniform(32, 64 * MiB);
  auto shared_plan = plan_with(*shared, d32, true);
  auto shared_general = plan_with(*shared, d32, false);
  ASSERT_TRUE(shared_plan);
  ASSERT_TRUE(shared_general);
  EXPECT_FALSE(shared_plan->by_class);
  expect_same_plan(*shared_plan, *shared_general, "two ranks a GPU");
  topo::Topology uneven;
  for (const topo::Node& node : t->nodes()) ASSERT_TRUE(uneven.add_node(node));
  bool halved = false;
  for (const topo::Link& link : t->links()) {
    topo::Link copy = link;
    if (!halved && t->node(link.from).host == 1 && t->node(link.to).host == 1) {
      copy.gbps /= 2;
      halved = true;
    }
    ASSERT_TRUE(uneven.add_link(copy));
  }
  ASSERT_TRUE(halved);
  auto uneven_table = balance::PathTable::build(uneven, uneven.gpus());
  ASSERT_TRUE(uneven_table);
  auto uneven_plan = plan_with(*uneven_table, d, true);
  auto uneven_general = plan_with(*uneven_table, d, false);
  ASSERT_TRUE(uneven_plan);
  ASSERT_TRUE(uneven_general);
  EXPECT_FALSE(uneven_plan->by_class);
  expect_same_plan(*uneven_plan, *uneven_general, "hosts that differ");
}

TEST(Planner, ClassesAbove2To53BytesGoToTheGeneralPlanner) {
  // Ten hosts, every pair between hosts just under the planner's 2^50-byte limit: a class
  // carries nine pairs' bytes, beyond what doubles hold exactly, so the general planner plans
  // it, and every pair's bytes still add up.
  auto table = table_of("dgx-h100", 10);
  const int n = table->nranks();
  const Demand d = by_place(n, n / 10, [](int, int) { return uint64_t{0}; },
                            [](int, int) { return (uint64_t{1} << 50) - 3; });
  auto plan = plan_with(table, d, true);
  ASSERT_TRUE(plan) << plan.status().message();
  EXPECT_FALSE(plan->by_class);
  for (const auto& p : plan->pairs) {
    uint64_t sum = 0;
    for (const auto& s : p.paths) sum += s.bytes;
    ASSERT_EQ(sum, p.bytes) << p.src << "->" << p.dst;
  }
}

TEST(Planner, PlansByClassAreTheSameEverywhere) {
  const Demand d = uniform(32, 1024 * MiB / 31);
  auto first = plan_with(table_of("dgx-h100", 4), d, true);
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->by_class);
  std::vector<Plan> others(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      others[static_cast<std::size_t>(i)] = *plan_with(table_of("dgx-h100", 4), d, true);
    });
  for (auto& t : threads) t.join();
  for (const Plan& o : others) expect_same_plan(o, *first, "another table");
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
