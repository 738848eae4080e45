// `efccl plan --topology PRESET|FILE [--nodes N] --demand D.json [--json]
//              [--min-split-bytes B]` (plan_command.h).
//
// Rank r is the r-th GPU of the topology (Topology::gpus(): host by host). --json prints the
// fields docs/balancer.md lists; the summary gives every pair's split.
#include "plan_command.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "args.h"
#include "input_file.h"
#include "efccl/balance/planner.h"
#include "efccl/topology/nccl_xml.h"
#include "efccl/topology/presets.h"

namespace efccl::cli {
namespace {

/// A preset name, or a file: NCCL topology XML (".xml") or efccl's topology JSON.
std::optional<topo::Topology> load_topology(const std::string& what, int32_t nodes) {
  for (std::string_view name : topo::preset_names())
    if (what == name) {
      auto t = topo::preset(what, nodes);
      if (!t) std::cerr << "efccl plan: " << t.status().message() << '\n';
      return t ? std::optional<topo::Topology>(std::move(*t)) : std::nullopt;
    }
  if (!std::filesystem::exists(what)) {
    std::string known;
    for (std::string_view n : topo::preset_names()) known += " " + std::string(n);
    throw UsageError{"--topology '" + what + "' is neither a preset (" + known.substr(1) +
                     ") nor a file"};
  }
  StatusOr<topo::Topology> host = Status::error("");
  if (what.size() > 4 && what.compare(what.size() - 4, 4, ".xml") == 0) {
    host = topo::load_nccl_xml(what);
  } else {
    auto text = read_input_file(what, "efccl plan");
    if (!text) return std::nullopt;
    host = topo::from_json(*text, what);
  }
  if (!host) {
    std::cerr << "efccl plan: " << host.status().message() << '\n';
    return std::nullopt;
  }
  if (nodes == 1) return std::move(*host);
  auto merged = topo::repeat_host(*host, nodes, what);
  if (!merged) {
    std::cerr << "efccl plan: --nodes " << nodes << ": " << merged.status().message() << '\n';
    return std::nullopt;
  }
  return std::move(*merged);
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  Args args(argv, {"--topology", "--nodes", "--demand", "--min-split-bytes"}, {"--json"});
  if (!args.positional().empty())
    throw UsageError{"plan takes no positional arguments (got '" + args.positional()[0] + "')"};
  const auto topology_arg = args.value("--topology");
  const auto demand_arg = args.value("--demand");
  if (!topology_arg) throw UsageError{"plan needs --topology PRESET|FILE"};
  if (!demand_arg) throw UsageError{"plan needs --demand FILE"};
  const int32_t nodes =
      args.value("--nodes") ? parse_i32("--nodes", *args.value("--nodes"), 1, topo::kMaxHosts) : 1;
  auto options = balance::PlannerOptions::from_environment();
  if (!options) {
    std::cerr << "efccl plan: " << options.status().message() << '\n';
    return 1;
  }
  if (auto v = args.value("--min-split-bytes")) options->min_split_bytes = parse_u64("--min-split-bytes", *v);

  auto t = load_topology(*topology_arg, nodes);
  if (!t) return 1;
  auto demand_text = read_input_file(*demand_arg, "efccl plan");
  if (!demand_text) return 1;
  auto demand = balance::demand_from_json(*demand_text, *demand_arg);
  if (!demand) {
    std::cerr << "efccl plan: " << demand.status().message() << '\n';
    return 1;
  }
  const auto gpus = t->gpus();
  if (static_cast<std::size_t>(demand->nranks) > gpus.size()) {
    std::cerr << "efccl plan: " << *demand_arg << " has " << demand->nranks
              << " ranks; the topology has " << gpus.size() << " GPUs\n";
    return 1;
  }
  auto table = balance::PathTable::build(
      *t, std::vector<topo::NodeIndex>(gpus.begin(), gpus.begin() + demand->nranks));
  if (!table) {
    std::cerr << "efccl plan: " << table.status().message() << '\n';
    return 1;
  }
  balance::Planner planner(*table, *options);
  // The candidate table fills on first use; planning time is that of a warm table, as in a
  // communicator that plans repeatedly.
  if (auto warm = balance::Planner(*table, *options).plan(*demand); !warm) {
    std::cerr << "efccl plan: " << warm.status().message() << '\n';
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  auto plan = planner.plan(*demand);
  const double plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!plan) {
    std::cerr << "efccl plan: " << plan.status().message() << '\n';
    return 1;
  }
  if (args.has("--json")) {
    nlohmann::json j;
    j["rank_nodes"] = nlohmann::json::array();
    for (int32_t r = 0; r < demand->nranks; ++r) j["rank_nodes"].push_back(t->node(gpus[r]).id);
    j["min_split_bytes"] = plan->min_split_bytes;
    std::map<topo::LinkIndex, std::size_t> index;  // topology link -> position in "links"
    j["links"] = nlohmann::json::array();
    const auto link_index = [&](topo::LinkIndex l) {
      auto [it, fresh] = index.emplace(l, index.size());
      if (fresh)
        j["links"].push_back({{"from", t->node(t->link(l).from).id},
                              {"to", t->node(t->link(l).to).id},
                              {"kind", std::string(topo::to_string(t->link(l).kind))},
                              {"gbps", t->link(l).gbps}});
      return it->second;
    };
    j["pairs"] = nlohmann::json::array();
    for (const balance::PairPlan& p : plan->pairs) {
      nlohmann::json pair = {{"src", p.src}, {"dst", p.dst}, {"bytes", p.bytes}};
      pair["candidates"] = nlohmann::json::array();
      pair["via"] = nlohmann::json::array();
      for (const balance::Candidate& c : *p.candidates) {
        nlohmann::json links = nlohmann::json::array();
        for (topo::LinkIndex l : c.links) links.push_back(link_index(l));
        pair["candidates"].push_back(std::move(links));
        pair["via"].push_back(c.via);
      }
      pair["paths"] = nlohmann::json::array();
      for (const balance::PathShare& s : p.paths)
        pair["paths"].push_back({{"links", pair["candidates"][s.candidate]}, {"bytes", s.bytes},
                                 {"candidate", s.candidate}});
      j["pairs"].push_back(std::move(pair));
    }
    j["max_load_us"] = plan->max_load_us;
    j["direct_max_load_us"] = plan->direct_max_load_us;
    j["plan_us"] = plan_us;
    std::cout << j.dump(1) << '\n';
    return 0;
  }
  std::printf("%d ranks on %s, %zu pairs with bytes, threshold %llu bytes\n", demand->nranks,
              topology_arg->c_str(), plan->pairs.size(),
              static_cast<unsigned long long>(plan->min_split_bytes));
  for (const balance::PairPlan& p : plan->pairs) {
    std::printf("  %d -> %d  %llu bytes:", p.src, p.dst, static_cast<unsigned long long>(p.bytes));
    for (const balance::PathShare& s : p.paths)
      std::printf("  %s %llu", (*p.candidates)[s.candidate].via.c_str(),
                  static_cast<unsigned long long>(s.bytes));
    std::printf("\n");
  }
  std::printf("max link load %.1f us (every pair on its default path: %.1f us); planned in %.1f us\n",
              plan->max_load_us, plan->direct_max_load_us, plan_us);
  return 0;
}

}  // namespace efccl::cli
