// Planning time of the balancer (efccl/balance/planner.h) on presets, CPU only:
//   planner_bench [--repeat N] [--only RANKS] [--demand NAME] [--list]
// Demand families (docs/performance.md): "hotspot" (NIMBLE's skewed all-to-all, half of every
// rank's 1 GiB to rank 0), "uniform" (1 GiB a rank spread evenly), "moe" (dispatch of 16K
// tokens x 4096 bf16, top-2, a third of them to rank 1's expert) and "sparse" (as many random
// pairs as ranks, 1-512 MiB each). For each case the candidate table is built and warmed once
// (as a communicator does); then
//   new:  a planner with an empty cache plans the demand (what a new demand costs);
//   hit:  the same planner plans it again under the same background (the plan in force).
// Each is timed N times (N/10 at 1024 ranks); printed: median and fastest wall-clock time, and
// the fastest thread CPU time (what the other work on a shared machine did not steal). Plans
// list only the pairs with bytes off their default path (PlannerOptions::list_direct_pairs =
// false) unless --list. Results: docs/performance.md.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/topology/presets.h"

namespace {

using namespace efccl;
constexpr uint64_t MiB = 1u << 20;

balance::Demand zeros(int n) {
  return balance::Demand{n, std::vector<uint64_t>(static_cast<std::size_t>(n) * n, 0)};
}
void set(balance::Demand& d, int s, int t, uint64_t bytes) {
  d.bytes[static_cast<std::size_t>(s) * d.nranks + t] = bytes;
}

/// NIMBLE's hotspot all-to-all: `hot` of every rank's bytes to rank 0, the rest spread.
balance::Demand hotspot(int n, uint64_t per_rank, double hot) {
  balance::Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s == t || (s == 0 && t == 0)) continue;
      const double share = t == 0 ? hot : (1 - hot) / (n - (s == 0 ? 1 : 2));
      set(d, s, t, static_cast<uint64_t>(share * static_cast<double>(per_rank)));
    }
  return d;
}

balance::Demand uniform(int n, uint64_t per_rank) {
  balance::Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t)
      if (s != t) set(d, s, t, per_rank / static_cast<uint64_t>(n - 1));
  return d;
}

/// MoE dispatch: 16K tokens x 4096 bf16 over the ranks, top-2, rank 1's expert takes a third.
balance::Demand moe(int n) {
  const uint64_t token = 4096 * 2;
  const uint64_t tokens_per_rank = 16384 / static_cast<uint64_t>(n) * 2;
  balance::Demand d = zeros(n);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s == t) continue;
      const double share = t == 1 ? 1.0 / 3 : (2.0 / 3) / (n - 1);
      set(d, s, t, static_cast<uint64_t>(share * static_cast<double>(tokens_per_rank * token)));
    }
  return d;
}

/// As many random pairs as ranks, 1-512 MiB each.
balance::Demand sparse(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  balance::Demand d = zeros(n);
  for (int k = 0; k < n; ++k) {
    const int s = static_cast<int>(rng() % static_cast<uint32_t>(n));
    const int t = static_cast<int>(rng() % static_cast<uint32_t>(n));
    if (s != t) set(d, s, t, (1 + rng() % 512) * MiB);
  }
  return d;
}

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

struct Times {
  std::vector<double> wall, cpu;
  void add(double w, double c) {
    wall.push_back(w);
    cpu.push_back(c);
  }
  double median() {
    std::sort(wall.begin(), wall.end());
    return wall[wall.size() / 2];
  }
  double fastest() const { return *std::min_element(wall.begin(), wall.end()); }
  double fastest_cpu() const { return *std::min_element(cpu.begin(), cpu.end()); }
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Case {
  const char* preset;
  int hosts;
};

}  // namespace

int main(int argc, char** argv) {
  int repeat = 50;
  int only = 0;
  std::string only_demand;  // one family by name; empty: all
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--demand") == 0 && i + 1 < argc) {
      only_demand = argv[++i];
    } else if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else {
      std::fprintf(stderr,
                   "usage: planner_bench [--repeat N] [--only RANKS] [--demand NAME] [--list]\n");
      return 2;
    }
  }
  if (repeat < 1) repeat = 1;
  std::printf("load average before: %s\n", load_average().c_str());
  std::printf("%-12s %5s %6s %-8s %7s %10s %10s %10s %10s %10s %12s %12s\n", "preset", "hosts",
              "ranks", "demand", "listed", "new_med", "new_min", "new_cpu", "hit_med", "hit_min",
              "max_load_us", "direct_us");
  for (Case c : {Case{"nimble-h100", 2}, Case{"dgx-h100", 1}, Case{"nimble-h100", 16},
                 Case{"dgx-h100", 8}, Case{"dgx-h100", 128}}) {
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
    if (only != 0 && only != n) continue;
    const struct {
      const char* name;
      balance::Demand demand;
    } families[] = {{"hotspot", hotspot(n, 1024 * MiB, 0.5)},
                    {"uniform", uniform(n, 1024 * MiB)},
                    {"moe", moe(n)},
                    {"sparse", sparse(n, 7)}};
    for (const auto& f : families) {
      if (!only_demand.empty() && only_demand != f.name) continue;
      balance::PlannerOptions options;
      options.list_direct_pairs = list;
      auto first = balance::Planner(*table, options).plan(f.demand);  // fills the table
      if (!first) {
        std::fprintf(stderr, "%s\n", first.status().message().c_str());
        return 1;
      }
      const int runs = n > 256 ? std::max(1, repeat / 10) : repeat;
      Times fresh, hit;
      for (int r = 0; r < runs; ++r) {
        balance::Planner planner(*table, options);
        for (Times* times : {&fresh, &hit}) {
          const double cpu0 = thread_cpu_us();
          const auto start = std::chrono::steady_clock::now();
          auto plan = planner.plan(f.demand);
          const auto end = std::chrono::steady_clock::now();
          const double cpu1 = thread_cpu_us();
          if (!plan) return 1;
          times->add(std::chrono::duration<double, std::micro>(end - start).count(), cpu1 - cpu0);
        }
      }
      std::printf("%-12s %5d %6d %-8s %7zu %10.1f %10.1f %10.1f %10.1f %10.1f %12.1f %12.1f\n",
                  c.preset, c.hosts, n, f.name, first->pairs.size(), fresh.median(),
                  fresh.fastest(), fresh.fastest_cpu(), hit.median(), hit.fastest(),
                  first->max_load_us, first->direct_max_load_us);
    }
  }
  std::printf("load average after: %s\n", load_average().c_str());
  return 0;
}
