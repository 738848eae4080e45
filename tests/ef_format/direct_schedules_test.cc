// ef::analyze_direct under random schedules (direct_schedule_sim.h): every library algorithm,
// with the direct transfers the analysis allows, gives the outputs it gives through slots, and
// no access races; the review's counterexample no longer races.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "direct_schedule_sim.h"
#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/direct_analysis.h"
#include "efccl/ef/validate.h"
#include "program_builders.h"

namespace efccl {
namespace {

namespace sim = test_support::sim;

/// Schedules per configuration (each with a FIFO depth of 2..8 slots).
constexpr int kSchedules = 12;

/// Runs `p` through slots and with `map` under kSchedules random schedules; empty when every
/// direct run matches the slot result and no run races, else what went wrong.
std::string check_schedules(const ef::Program& p, bool inplace, const ef::DirectMap& map) {
  const sim::Result reference = sim::run(p, inplace, nullptr, 12345, 7, 8);
  if (reference.deadlock) return "deadlock through slots";
  if (!reference.race.empty()) return "race through slots: " + reference.race;
  for (int s = 0; s < kSchedules; ++s) {
    const int slots = 2 + s % 7;
    // Some programs need deeper FIFOs than `slots` (hierarchical steps queue several units):
    // such depths deadlock through slots as well, and direct transfers wait the same way.
    const sim::Result through_slots = sim::run(p, inplace, nullptr, static_cast<uint64_t>(s), 7,
                                               slots);
    const sim::Result direct = sim::run(p, inplace, &map, static_cast<uint64_t>(s), 7, slots);
    if (direct.deadlock != through_slots.deadlock)
      return "schedule " + std::to_string(s) + " deadlocks only " +
             (direct.deadlock ? "with direct transfers" : "through slots");
    if (direct.deadlock) continue;
    if (!direct.race.empty()) return "race with direct transfers: " + direct.race;
    const std::string diff = sim::compare(p, reference, direct, false);
    if (!diff.empty()) return "schedule " + std::to_string(s) + ": " + diff + " differs";
  }
  return "";
}

TEST(DirectSchedules, EveryLibraryAlgorithmGivesTheSlotResults) {
  int configurations = 0;
  std::size_t direct_ends = 0;
  for (const auto& info : algorithms::list_algorithms()) {
    for (int nranks : {2, 3, 4, 8}) {
      if (nranks < info.min_ranks || nranks > info.max_ranks) continue;
      for (int channels : {1, 2}) {
        if (channels > info.max_channels) continue;
        for (bool generated_inplace : {false, true}) {
          for (int nodes : {1, 2}) {
            if (nodes == 2 && (!info.hierarchical || nranks % 2 != 0)) continue;
            algorithms::AlgorithmParams params;
            params.ranks = nranks;
            params.channels = channels;
            params.inplace = generated_inplace;
            params.nodes = nodes;
            auto program = algorithms::generate_algorithm(info.name, params);
            if (!program.is_ok()) continue;
            const ef::Program& p = *program;
            for (bool inplace : {false, true}) {
              if (inplace ? !p.inplace : !p.outofplace) continue;
              const ef::DirectMap map =
                  ef::analyze_direct(p, inplace, std::vector<bool>(p.ranks.size(), true));
              for (const auto& rank : map)
                for (const auto& tb : rank)
                  for (const ef::DirectFlags& f : tb)
                    direct_ends += (f.pop != ef::DirectPop::kSlot ? 1 : 0) +
                                   (f.push != ef::DirectPush::kSlot ? 1 : 0);
              const std::string failure = check_schedules(p, inplace, map);
              EXPECT_TRUE(failure.empty())
                  << info.name << " " << nranks << " ranks, " << channels << " channels, "
                  << nodes << " nodes, " << (inplace ? "in place" : "out of place") << ": "
                  << failure;
              ++configurations;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(configurations, 100);
  EXPECT_GT(direct_ends, 1000u);  // the analysis makes most library transfers direct
}

TEST(DirectSchedules, TheReviewsCounterexampleDoesNotRace) {
  // direct_analysis_test's TwoPairsJudgedApartDoNotRace, run: before the fix, 492 of 2000
  // schedules gave another output.
  const ef::Program p = ef::test_builders::direct_review_counterexample();
  ASSERT_TRUE(ef::validate(p).empty());
  const ef::DirectMap map = ef::analyze_direct(p, false, {true, true});
  const sim::Result reference = sim::run(p, false, nullptr, 1, 42, 8);
  for (uint64_t s = 0; s < 500; ++s) {
    const sim::Result direct = sim::run(p, false, &map, s, 42, 8);
    ASSERT_TRUE(direct.race.empty()) << "schedule " << s << ": " << direct.race;
    ASSERT_EQ(sim::compare(p, reference, direct, false), "") << "schedule " << s;
  }
}

}  // namespace
}  // namespace efccl
