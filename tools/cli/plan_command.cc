// `efccl plan --topology PRESET|FILE [--nodes N] --demand D.json [--json] [-o PROG.json]
//              [--svg FILE] [--bench] [--min-split-bytes B] [--chunk-bytes B]
//              [--relays POLICY]` (plan_command.h).
//
// Rank r is the r-th GPU of the topology (Topology::gpus(): host by host). --json prints the
// fields docs/balancer.md lists; the summary gives every pair's split. The balanced and the
// all-direct programs of the demand (plan_program.h) are built in one chunk size and timed by
// the timing model on the topology; -o writes the balanced one, --svg draws the link loads
// before and after, --bench times repeated plans.
#include "plan_command.h"

#include <algorithm>
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
#include "efccl/balance/plan_program.h"
#include "efccl/balance/planner.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/validate.h"
#include "efccl/host/topology_model.h"
#include "efccl/topology/nccl_xml.h"
#include "efccl/topology/presets.h"
#include "efccl/topology/svg.h"
#include "input_file.h"

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

/// Programs of a demand with at most this many chunks in all, of at most this many bytes
/// where exact chunks allow, unless --chunk-bytes says (docs/balancer.md, "efccl plan").
constexpr uint64_t kMaxProgramChunks = 65536;
constexpr uint64_t kMaxChunkBytes = 1u << 20;

balance::RelayPolicy parse_relays(const std::string& v) {
  if (v == "forward") return balance::RelayPolicy::kForward;
  if (v == "slot-device") return balance::RelayPolicy::kSlotDevice;
  if (v == "forward-or-slot-device") return balance::RelayPolicy::kForwardOrSlotDevice;
  throw UsageError{"--relays: expected forward, slot-device or forward-or-slot-device, got '" + v +
                   "'"};
}

/// A program of the demand and its predicted time on the topology.
struct TimedProgram {
  balance::DemandProgram built;
  double predicted_us = 0;
};

StatusOr<TimedProgram> build_and_time(const balance::PathTable& table, const balance::Plan& plan,
                                      uint64_t chunk, balance::RelayPolicy relays) {
  balance::DemandProgramOptions options;
  options.relays = relays;
  auto built = balance::build_demand_program(table, plan, chunk, options);
  if (!built) return built.status();
  if (const Diagnostics d = ef::validate(built->program); !d.empty())
    return Status::error("the generated program is invalid: " + d.front().to_string());
  auto model = host::model_for_topology(table.topology(), built->binding.rank_gpus, {},
                                        built->binding.slot_device_gpus);
  if (!model) return model.status();
  host::ExecOptions call;
  call.count = chunk;
  call.dtype = ef::DataType::kInt8;
  const host::TimingResult time = host::predict_time(built->program, call, *model);
  if (!time.status) return Status::error("timing model: " + time.status.message());
  return TimedProgram{std::move(*built), time.time_us};
}

/// Per link, microseconds of traffic: bytes / capacity.
std::vector<double> load_us(const topo::Topology& t, std::span<const double> bytes) {
  std::vector<double> us(t.links().size(), 0.0);
  for (std::size_t l = 0; l < us.size() && l < bytes.size(); ++l)
    us[l] = bytes[l] / (t.links()[l].gbps * 1e3);
  return us;
}

/// Min and median microseconds of repeated plans of one demand (at least 5 runs, until a second
/// has passed or 1000 ran).
struct Bench {
  std::size_t runs = 0;
  double min_us = 0, median_us = 0;
};
StatusOr<Bench> bench(balance::Planner& planner, const balance::Demand& demand) {
  std::vector<double> times;
  const auto begin = std::chrono::steady_clock::now();
  while (times.size() < 5 || (times.size() < 1000 &&
                              std::chrono::steady_clock::now() - begin < std::chrono::seconds(1))) {
    const auto start = std::chrono::steady_clock::now();
    auto plan = planner.plan(demand);
    times.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
    if (!plan) return plan.status();
  }
  std::sort(times.begin(), times.end());
  return Bench{times.size(), times.front(), times[times.size() / 2]};
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) std::cerr << "efccl plan: " << path << ": cannot write\n";
  return static_cast<bool>(out);
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  Args args(argv,
            {"--topology", "--nodes", "--demand", "--min-split-bytes", "--chunk-bytes", "--relays",
             "-o", "--svg"},
            {"--json", "--bench"});
  if (!args.positional().empty())
    throw UsageError{"plan takes no positional arguments (got '" + args.positional()[0] + "')"};
  const auto topology_arg = args.value("--topology");
  const auto demand_arg = args.value("--demand");
  if (!topology_arg) throw UsageError{"plan needs --topology PRESET|FILE"};
  if (!demand_arg) throw UsageError{"plan needs --demand FILE"};
  const int32_t nodes =
      args.value("--nodes") ? parse_i32("--nodes", *args.value("--nodes"), 1, topo::kMaxHosts) : 1;
  std::optional<uint64_t> chunk_arg;
  if (auto v = args.value("--chunk-bytes")) {
    chunk_arg = parse_u64("--chunk-bytes", *v);
    if (*chunk_arg == 0) throw UsageError{"--chunk-bytes must be at least 1"};
  }
  const balance::RelayPolicy relays =
      parse_relays(args.value("--relays").value_or("forward-or-slot-device"));
  auto options = balance::PlannerOptions::from_environment();
  if (!options) {
    std::cerr << "efccl plan: " << options.status().message() << '\n';
    return 1;
  }
  if (auto v = args.value("--min-split-bytes")) options->min_split_bytes = parse_u64("--min-split-bytes", *v);
  const auto fail = [](const Status& s) {
    std::cerr << "efccl plan: " << s.message() << '\n';
    return 1;
  };

  auto t = load_topology(*topology_arg, nodes);
  if (!t) return 1;
  auto demand_text = read_input_file(*demand_arg, "efccl plan");
  if (!demand_text) return 1;
  auto demand = balance::demand_from_json(*demand_text, *demand_arg);
  if (!demand) return fail(demand.status());
  const auto gpus = t->gpus();
  if (static_cast<std::size_t>(demand->nranks) > gpus.size()) {
    std::cerr << "efccl plan: " << *demand_arg << " has " << demand->nranks
              << " ranks; the topology has " << gpus.size() << " GPUs\n";
    return 1;
  }
  auto table = balance::PathTable::build(
      *t, std::vector<topo::NodeIndex>(gpus.begin(), gpus.begin() + demand->nranks));
  if (!table) return fail(table.status());
  balance::Planner planner(*table, *options);
  // The candidate table fills on first use; planning time is that of a warm table, as in a
  // communicator that plans repeatedly.
  if (auto warm = balance::Planner(*table, *options).plan(*demand); !warm)
    return fail(warm.status());
  const auto start = std::chrono::steady_clock::now();
  auto plan = planner.plan(*demand);
  const double plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!plan) return fail(plan.status());
  std::optional<Bench> timing;
  if (args.has("--bench")) {
    auto b = bench(planner, *demand);
    if (!b) return fail(b.status());
    timing = *b;
  }

  // The balanced and the all-direct programs, in one chunk size (docs/balancer.md, "efccl plan").
  const uint64_t exact = balance::exact_chunk_bytes(*plan);
  const uint64_t chunk =
      chunk_arg ? *chunk_arg
                : balance::demand_chunk_bytes(*plan, kMaxProgramChunks, kMaxChunkBytes);
  std::optional<TimedProgram> balanced, direct;
  if (chunk > 0) {
    auto b = build_and_time(**table, *plan, chunk, relays);
    if (!b) return fail(b.status());
    auto d = build_and_time(**table, balance::direct_plan(*plan), chunk, relays);
    if (!d) return fail(d.status());
    balanced = std::move(*b);
    direct = std::move(*d);
  }
  if (auto path = args.value("-o")) {
    if (!balanced) return fail(Status::error("-o: the demand has no bytes, so no program"));
    if (!write_file(*path, ef::save_json(balanced->built.program))) return 1;
  }
  if (auto path = args.value("--svg")) {
    const std::vector<topo::LinkHeat> panels = {
        {"all pairs on their default path (max " +
             std::to_string(static_cast<int64_t>(plan->direct_max_load_us)) + " us)",
         load_us(*t, balance::direct_plan(*plan).link_bytes)},
        {"balanced (max " + std::to_string(static_cast<int64_t>(plan->max_load_us)) + " us)",
         load_us(*t, plan->link_bytes)}};
    if (!write_file(*path, topo::to_svg(*t, panels, "us"))) return 1;
  }
  const double predicted_us = balanced ? balanced->predicted_us : 0.0;
  const double direct_predicted_us = direct ? direct->predicted_us : 0.0;

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
    j["predicted_us"] = predicted_us;
    j["direct_predicted_us"] = direct_predicted_us;
    j["chunk_bytes"] = chunk;
    j["exact_chunks"] = chunk > 0 && chunk == exact;
    if (balanced) {
      const balance::ProgramBinding& b = balanced->built.binding;
      nlohmann::json program = {{"ranks", nlohmann::json::array()},
                                {"slot_devices", nlohmann::json::array()}};
      for (topo::NodeIndex g : b.rank_gpus) program["ranks"].push_back(t->node(g).id);
      for (topo::NodeIndex g : b.slot_device_gpus) program["slot_devices"].push_back(t->node(g).id);
      program["placements"] = balanced->built.program.placements.size();
      j["program"] = std::move(program);
    }
    if (timing)
      j["bench"] = {
          {"runs", timing->runs}, {"min_us", timing->min_us}, {"median_us", timing->median_us}};
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
  if (balanced)
    std::printf(
        "predicted (timing model, chunks of %llu bytes%s): balanced %.1f us, every pair "
        "on its default path %.1f us\n",
        static_cast<unsigned long long>(chunk), chunk == exact ? ", exact" : "", predicted_us,
        direct_predicted_us);
  if (timing)
    std::printf("planner: %zu plans, min %.1f us, median %.1f us\n", timing->runs, timing->min_us,
                timing->median_us);
  return 0;
}

}  // namespace efccl::cli
