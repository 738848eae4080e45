// The plan by class as its callers read it (efccl/balance/planner.h, PairList): its pairs are
// listed lazily, and must read exactly as a listing pair by pair would; its loads are summed
// per class, and must be exactly the pair-by-pair sums over what the pairs read.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "efccl/balance/planner.h"
#include "efccl/topology/presets.h"
#include "preset_table.h"

namespace {

using namespace efccl;
using balance::Demand;
using balance::PairPlan;
using balance::Plan;
using topo::LinkIndex;

constexpr uint64_t MiB = 1u << 20;

using test_support::table_of;

/// Bytes by (same host?, place of the source, place of the destination), `per_host` ranks a
/// host: what the plan by class covers. `self`: the bytes of a rank to itself.
Demand by_place(int n, int per_host, const std::vector<uint64_t>& same,
                const std::vector<uint64_t>& other, uint64_t self = 0) {
  Demand d{n, std::vector<uint64_t>(static_cast<std::size_t>(n * n), 0)};
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      const std::size_t at = static_cast<std::size_t>((s % per_host) * per_host + t % per_host);
      d.bytes[static_cast<std::size_t>(s * n + t)] = s == t                         ? self
                                                     : s / per_host == t / per_host ? same[at]
                                                                                    : other[at];
    }
  return d;
}

StatusOr<Plan> plan_of(std::shared_ptr<const balance::PathTable> table, const Demand& d,
                       bool list_direct_pairs, bool by_class = true) {
  balance::PlannerOptions o;
  o.list_direct_pairs = list_direct_pairs;
  o.by_class = by_class;
  return balance::Planner(std::move(table), o).plan(d);
}

/// The largest load over capacity as the planner computes it (bytes times microseconds per
/// byte; balance::max_load_us divides, which may differ in the last bit).
double planner_max_us(const topo::Topology& t, const std::vector<double>& bytes) {
  double worst = 0;
  for (std::size_t l = 0; l < bytes.size(); ++l)
    worst = std::max(worst, bytes[l] * (1.0 / (t.links()[l].gbps * 1e3)));
  return worst;
}

bool same_pair(const PairPlan& a, const PairPlan& b) {
  if (a.src != b.src || a.dst != b.dst || a.bytes != b.bytes || a.paths.size() != b.paths.size())
    return false;
  for (std::size_t k = 0; k < a.paths.size(); ++k)
    if (a.paths[k].candidate != b.paths[k].candidate || a.paths[k].bytes != b.paths[k].bytes)
      return false;
  if (a.candidates == nullptr || b.candidates == nullptr ||
      a.candidates->size() != b.candidates->size())
    return false;
  return std::equal(a.candidates->begin(), a.candidates->end(), b.candidates->begin(),
                    [](const balance::Candidate& x, const balance::Candidate& y) {
                      return x.links == y.links && x.via == y.via && x.kind == y.kind &&
                             x.relays == y.relays && x.rail == y.rail;
                    });
}

/// The demands of these tests on `table`: uniform above and around the threshold, and random
/// bytes by place (some classes under it, some zero).
std::vector<std::pair<std::string, Demand>> demands_for(const balance::PathTable& table, int hosts,
                                                        uint32_t seed) {
  const int n = table.nranks(), k = n / hosts;
  std::vector<std::pair<std::string, Demand>> out;
  const std::size_t kk = static_cast<std::size_t>(k * k);
  out.emplace_back("uniform 16 MiB", by_place(n, k, std::vector<uint64_t>(kk, 16 * MiB),
                                              std::vector<uint64_t>(kk, 16 * MiB)));
  out.emplace_back("uniform 1 GiB a rank",
                   by_place(n, k, std::vector<uint64_t>(kk, 1024 * MiB / (n - 1)),
                            std::vector<uint64_t>(kk, 1024 * MiB / (n - 1))));
  std::mt19937 rng(seed);
  for (int r = 0; r < 4; ++r) {
    std::vector<uint64_t> same(kk), other(kk);
    for (auto* v : {&same, &other})
      for (uint64_t& b : *v) {
        const uint32_t x = rng() % 8;
        b = x == 0  ? 0
            : x < 3 ? (512 + rng() % 1024) * 1024
                    : (1 + rng() % 256) * MiB + rng() % 999;
      }
    out.emplace_back("by place " + std::to_string(r),
                     by_place(n, k, same, other, r == 3 ? 8 * MiB : 0));
  }
  return out;
}

TEST(PlanByClass, ListedLazilyAsAPairByPairListingWouldList) {
  int lazy = 0;
  for (const auto& [preset, hosts] : {std::pair{"dgx-h100", 2}, std::pair{"dgx-h100", 3},
                                      std::pair{"nimble-h100", 4}, std::pair{"dgx-h100", 8}}) {
    auto table = table_of(preset, hosts);
    const int n = table->nranks();
    for (const auto& [name, d] : demands_for(*table, hosts, 3)) {
      for (bool list : {true, false}) {
        const std::string what = std::string(preset) + " x" + std::to_string(hosts) + " " + name +
                                 (list ? " (every pair)" : " (pairs off their default path)");
        auto plan = plan_of(table, d, list);
        ASSERT_TRUE(plan) << what << ": " << plan.status().message();
        if (!plan->pairs.lazy()) continue;
        ++lazy;
        // Iteration, operator[] and find() read the same pairs, src-major, each once.
        std::vector<PairPlan> read(plan->pairs.begin(), plan->pairs.end());
        ASSERT_EQ(read.size(), plan->pairs.size()) << what;
        for (std::size_t i = 0; i < read.size(); ++i) {
          if (i > 0) {
            ASSERT_LT(std::make_pair(read[i - 1].src, read[i - 1].dst),
                      std::make_pair(read[i].src, read[i].dst))
                << what;
          }
          ASSERT_TRUE(same_pair(read[i], plan->pairs[i])) << what << " pair " << i;
        }
        std::size_t next = 0, with_bytes = 0, off = 0;
        for (int s = 0; s < n; ++s)
          for (int t = 0; t < n; ++t) {
            const std::optional<PairPlan> p = plan->pairs.find(s, t);
            const uint64_t bytes = d.at(s, t);
            with_bytes += bytes > 0;
            if (next < read.size() && read[next].src == s && read[next].dst == t) {
              ASSERT_TRUE(p) << what;
              EXPECT_TRUE(same_pair(*p, read[next++])) << what;
              // Bytes add up; a pair under the threshold on candidates[0]; shares candidate
              // ascending, none empty.
              uint64_t sum = 0;
              for (std::size_t k = 0; k < p->paths.size(); ++k) {
                sum += p->paths[k].bytes;
                EXPECT_GT(p->paths[k].bytes, 0u) << what;
                ASSERT_LT(p->paths[k].candidate, p->candidates->size()) << what;
                if (k > 0) {
                  EXPECT_LT(p->paths[k - 1].candidate, p->paths[k].candidate) << what;
                }
              }
              EXPECT_EQ(sum, bytes) << what;
              if (bytes < plan->min_split_bytes) {
                ASSERT_EQ(p->paths.size(), 1u) << what;
                EXPECT_EQ(p->paths[0].candidate, 0u) << what;
              }
              off += p->paths.size() != 1 || p->paths[0].candidate != 0;
            } else {
              EXPECT_FALSE(p) << what << " pair " << s << "->" << t;
            }
          }
        EXPECT_EQ(next, read.size()) << what;
        EXPECT_EQ(read.size(), list ? with_bytes : off) << what;
        EXPECT_FALSE(plan->pairs.find(-1, 0) || plan->pairs.find(0, n)) << what;
        // A copy reads the same; the listing outlives the planner that made it.
        const Plan copy = *plan;
        EXPECT_EQ(copy.pairs.size(), read.size()) << what;
        if (!read.empty()) {
          EXPECT_TRUE(same_pair(copy.pairs[read.size() - 1], read.back())) << what;
        }
      }
    }
  }
  EXPECT_GT(lazy, 8);
}

TEST(PlanByClass, LoadsPerClassAreThePairByPairSums) {
  // The plan by class sums its loads per class and stretch, in integers; summed pair by pair
  // over what its pairs read (every pair listed), they are the same to the last bit, and so
  // are the maximum and the direct plan's.
  int checked = 0;
  for (const auto& [preset, hosts] : {std::pair{"dgx-h100", 2}, std::pair{"dgx-h100", 3},
                                      std::pair{"nimble-h100", 4}, std::pair{"dgx-h100", 8}}) {
    auto table = table_of(preset, hosts);
    const topo::Topology& t = table->topology();
    for (const auto& [name, d] : demands_for(*table, hosts, 7)) {
      const std::string what = std::string(preset) + " x" + std::to_string(hosts) + " " + name;
      auto plan = plan_of(table, d, true);
      ASSERT_TRUE(plan) << what;
      if (!plan->pairs.lazy()) continue;
      std::vector<double> load(t.links().size(), 0.0), direct(t.links().size(), 0.0);
      for (const PairPlan& p : plan->pairs) {
        for (const balance::PathShare& s : p.paths)
          for (LinkIndex l : (*p.candidates)[s.candidate].links)
            load[l] += static_cast<double>(s.bytes);
        for (LinkIndex l : p.candidates->front().links) direct[l] += static_cast<double>(p.bytes);
      }
      EXPECT_EQ(load, plan->link_bytes) << what;
      EXPECT_EQ(planner_max_us(t, load), plan->max_load_us) << what;
      EXPECT_EQ(planner_max_us(t, direct), plan->direct_max_load_us) << what;
      EXPECT_DOUBLE_EQ(balance::max_load_us(t, load), plan->max_load_us) << what;
      // The general planner sees the same direct plan.
      auto general = plan_of(table, d, true, false);
      ASSERT_TRUE(general) << what;
      EXPECT_EQ(general->direct_max_load_us, plan->direct_max_load_us) << what;
      if (plan->by_class) {
        EXPECT_LE(plan->max_load_us, general->max_load_us * 1.01 + 1e-9) << what;
      } else {  // every pair on its default path: the general planner's plan
        EXPECT_EQ(general->max_load_us, plan->max_load_us) << what;
        EXPECT_EQ(general->link_bytes, plan->link_bytes) << what;
        ASSERT_EQ(general->pairs.size(), plan->pairs.size()) << what;
        for (std::size_t i = 0; i < general->pairs.size(); ++i)
          ASSERT_TRUE(same_pair(general->pairs[i], plan->pairs[i])) << what;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 8);
}

TEST(PlanByClass, AListedPlanListsByValueAndFinds) {
  // A plan listed pair by pair (a general plan, or one a caller writes) reads through the same
  // PairList: operator[] by value, find() by binary search.
  auto table = table_of("dgx-h100", 1);
  Demand d{8, std::vector<uint64_t>(64, 0)};
  d.bytes[1] = 64 * MiB;
  d.bytes[2 * 8 + 5] = 3 * MiB;
  auto plan = plan_of(table, d, true);
  ASSERT_TRUE(plan);
  EXPECT_FALSE(plan->pairs.lazy());
  ASSERT_EQ(plan->pairs.size(), 2u);
  EXPECT_EQ(plan->pairs[1].src, 2);
  ASSERT_TRUE(plan->pairs.find(2, 5));
  EXPECT_EQ(plan->pairs.find(2, 5)->bytes, 3 * MiB);
  EXPECT_FALSE(plan->pairs.find(5, 2));
  Plan written;
  written.pairs = {plan->pairs[0]};
  EXPECT_EQ(written.pairs.size(), 1u);
  EXPECT_TRUE(written.pairs.find(0, 1));
  const Plan empty;
  EXPECT_TRUE(empty.pairs.empty());
  EXPECT_TRUE(empty.pairs.begin() == empty.pairs.end());
}

}  // namespace

namespace {

/// dgx-h100 x `hosts` with the links of one GPU of host 2 changed by `change` (that GPU not a
/// rank: ranks are GPUs 0-3 of every host), and its table.
template <typename Change>
std::shared_ptr<const balance::PathTable> odd_host_table(int hosts, const char* gpu,
                                                         Change change) {
  auto t = topo::preset("dgx-h100", hosts);
  EXPECT_TRUE(t) << t.status().message();
  topo::Topology out;
  for (const topo::Node& n : t->nodes()) EXPECT_TRUE(out.add_node(n));
  const auto odd = t->find(gpu);
  EXPECT_TRUE(odd);
  int changed = 0;
  for (const topo::Link& from : t->links()) {
    topo::Link l = from;
    if (l.from == *odd || l.to == *odd) changed += change(l) ? 1 : 0;
    EXPECT_TRUE(out.add_link(l));
  }
  EXPECT_GT(changed, 0);
  std::vector<topo::NodeIndex> ranks;
  for (int h = 0; h < hosts; ++h)
    for (int g = 0; g < 4; ++g)
      ranks.push_back(*out.find("h" + std::to_string(h) + ".gpu" + std::to_string(g)));
  auto table = balance::PathTable::build(out, ranks);
  EXPECT_TRUE(table) << table.status().message();
  return *table;
}

/// Every share of `plan` on a candidate its pair lists, and the plan's link loads exactly the
/// bytes over the pairs' own paths.
void expect_consistent(const Plan& plan, const topo::Topology& t) {
  std::vector<double> load(t.links().size(), 0.0);
  for (const PairPlan& p : plan.pairs) {
    ASSERT_NE(p.candidates, nullptr) << p.src << " -> " << p.dst;
    for (const balance::PathShare& s : p.paths) {
      ASSERT_LT(s.candidate, p.candidates->size()) << p.src << " -> " << p.dst;
      for (LinkIndex l : (*p.candidates)[s.candidate].links) load[l] += double(s.bytes);
    }
  }
  EXPECT_DOUBLE_EQ(planner_max_us(t, load), planner_max_us(t, plan.link_bytes));
}

TEST(PlanByClass, AHostDifferingInALinksKindOrLatencyIsNotFolded) {
  // Host 2 (never one of the sampled hosts with 4) differs only in the links of a GPU that is
  // not a rank: their kind (the walks follow links by kind) or their latency (ties broken by
  // it). Its pairs' candidates differ from the representatives': the plan by class must not
  // be taken, and the plan must be consistent (a review found shares on candidates a pair did
  // not list, and loads that were not the pairs').
  const std::vector<uint64_t> none(16, 0);
  std::vector<uint64_t> other(16, 0);
  other[0] = 1024 * MiB;  // local 0 -> local 0 of every other host
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "kind" : "latency");
    auto table = odd_host_table(4, "h2.gpu5", [&](topo::Link& l) {
      if (l.kind != topo::LinkKind::kPcie) return false;
      if (variant == 0)
        l.kind = topo::LinkKind::kNvlink;
      else
        l.latency_us += 0.25;
      return true;
    });
    const Demand d = by_place(table->nranks(), 4, none, other);
    auto plan = plan_of(table, d, true);
    ASSERT_TRUE(plan) << plan.status().message();
    EXPECT_FALSE(plan->by_class);
    expect_consistent(*plan, table->topology());
    // The same table with host 2 as the others folds (the check is not simply off).
    auto alike = odd_host_table(4, "h2.gpu5", [](topo::Link&) { return true; });
    auto folded = plan_of(alike, by_place(alike->nranks(), 4, none, other), true);
    ASSERT_TRUE(folded) << folded.status().message();
    EXPECT_TRUE(folded->by_class);
    expect_consistent(*folded, alike->topology());
  }
}

TEST(PlanByClass, APairUnderTheThresholdReadsTheSameAfterAnotherPlan) {
  // Small pairs list candidates[0] alone, whenever they are read: a later plan on the same
  // table that learns the pair's other candidates changes nothing in this plan.
  auto table = table_of("dgx-h100", 3);
  const int n = table->nranks(), k = 8;
  const Demand d =
      by_place(n, k, std::vector<uint64_t>(64, 64 * MiB), std::vector<uint64_t>(64, 64 << 10));
  auto plan = plan_of(table, d, true);
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_TRUE(plan->by_class);
  const int s = 2 * k + 1, t = k + 3;  // host 2 -> host 1, 64 KiB
  auto before = plan->pairs.find(s, t);
  ASSERT_TRUE(before);
  Demand big = d;
  big.bytes[static_cast<std::size_t>(s * n + t)] = 512 * MiB;
  ASSERT_TRUE(plan_of(table, big, true));
  auto after = plan->pairs.find(s, t);
  ASSERT_TRUE(after);
  EXPECT_TRUE(same_pair(*before, *after));
  EXPECT_EQ(after->candidates->size(), 1u);
  // A representative's small pair (host 0 -> host 1) lists as one of another host.
  auto rep = plan->pairs.find(1, k + 3);
  ASSERT_TRUE(rep);
  EXPECT_EQ(rep->candidates->size(), 1u);
}

TEST(PlanByClass, NoRanksPlansNothing) {
  auto t = topo::preset("dgx-h100", 2);
  ASSERT_TRUE(t) << t.status().message();
  auto table = balance::PathTable::build(*t, {});
  ASSERT_TRUE(table) << table.status().message();
  auto plan = plan_of(*table, Demand{0, {}}, true);
  ASSERT_TRUE(plan) << plan.status().message();
  EXPECT_FALSE(plan->by_class);
  EXPECT_EQ(plan->pairs.size(), 0u);
}

}  // namespace
