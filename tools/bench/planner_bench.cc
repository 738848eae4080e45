// Planning time of the balancer (efccl/balance/planner.h) on presets, CPU only:
//   planner_bench [--repeat N]
// For each case: the candidate table is built and warmed once (as a communicator does), then
// the planner plans the same demand N times; prints the median and minimum per plan, the
// predicted maximum link load and the unbalanced one. Results: docs/performance.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/topology/presets.h"

namespace {

using namespace efccl;
constexpr uint64_t MiB = 1u << 20;

/// NIMBLE's hotspot all-to-all: `hot` of every rank's bytes to rank 0, the rest spread.
balance::Demand hotspot(int n, uint64_t per_rank, double hot) {
  balance::Demand d{n, std::vector<uint64_t>(static_cast<std::size_t>(n) * n, 0)};
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s == t || (s == 0 && t == 0)) continue;
      const double share = t == 0 ? hot : (1 - hot) / (n - (s == 0 ? 1 : 2));
      d.bytes[static_cast<std::size_t>(s) * n + t] =
          static_cast<uint64_t>(share * static_cast<double>(per_rank));
    }
  return d;
}

struct Case {
  const char* preset;
  int hosts;
  uint64_t per_rank;
  double hot;
};

}  // namespace

int main(int argc, char** argv) {
  int repeat = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: planner_bench [--repeat N]\n");
      return 2;
    }
  }
  if (repeat < 1) repeat = 1;
  std::printf("%-12s %5s %6s %10s %5s %12s %12s %14s %14s\n", "preset", "hosts", "ranks",
              "MiB/rank", "hot", "median_us", "min_us", "max_load_us", "direct_us");
  for (Case c : {Case{"nimble-h100", 2, 1024 * MiB, 0.5}, Case{"dgx-h100", 1, 1024 * MiB, 0.5},
                 Case{"nimble-h100", 16, 1024 * MiB, 0.5}, Case{"dgx-h100", 8, 1024 * MiB, 0.5},
                 Case{"dgx-h100", 128, 1024 * MiB, 0.5}}) {
    auto t = topo::preset(c.preset, c.hosts);
    if (!t) {
      std::fprintf(stderr, "%s\n", t.status().message().c_str());
      return 1;
    }
    auto table = balance::PathTable::build(*t, t->gpus());
    if (!table) {
      std::fprintf(stderr, "%s\n", table.status().message().c_str());
      return 1;
    }
    const int n = (*table)->nranks();
    const balance::Demand d = hotspot(n, c.per_rank, c.hot);
    balance::PlannerOptions options;
    options.hysteresis = 0;  // every call plans afresh (the cache would return the kept plan)
    balance::Planner warm(*table, options);
    auto first = warm.plan(d);  // fills the candidate table
    if (!first) {
      std::fprintf(stderr, "%s\n", first.status().message().c_str());
      return 1;
    }
    const int runs = n > 256 ? std::max(1, repeat / 10) : repeat;
    std::vector<double> times;
    for (int r = 0; r < runs; ++r) {
      balance::Planner planner(*table, options);
      const auto start = std::chrono::steady_clock::now();
      auto plan = planner.plan(d);
      const auto end = std::chrono::steady_clock::now();
      if (!plan) return 1;
      times.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
    std::sort(times.begin(), times.end());
    std::printf("%-12s %5d %6d %10llu %5.2f %12.1f %12.1f %14.1f %14.1f\n", c.preset, c.hosts, n,
                static_cast<unsigned long long>(c.per_rank / MiB), c.hot, times[times.size() / 2],
                times.front(), first->max_load_us, first->direct_max_load_us);
  }
  return 0;
}
