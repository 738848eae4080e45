// `efccl plan` as a user runs it: the documented JSON fields, the summary, bad inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class PlanCliTest : public CliFixture {
 protected:
  CliOutcome plan(const std::string& args) { return run_cli("plan " + args); }
};

TEST_F(PlanCliTest, ALonePairSplitsOverEveryPathOfTheNimbleNode) {
  const auto d = write("d.json", R"({"ranks": 4, "bytes": [[0, 1073741824, 0, 0], [0, 0, 0, 0],
                                     [0, 0, 0, 0], [0, 0, 0, 0]]})");
  auto o = plan("--topology nimble-h100 --demand " + d.string() + " --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const json j = json::parse(o.out);
  EXPECT_EQ(j["rank_nodes"], json({"h0.gpu0", "h0.gpu1", "h0.gpu2", "h0.gpu3"}));
  EXPECT_EQ(j["min_split_bytes"], 1048576);
  ASSERT_EQ(j["pairs"].size(), 1u);
  const json& p = j["pairs"][0];
  EXPECT_EQ(p["src"], 0);
  EXPECT_EQ(p["dst"], 1);
  EXPECT_EQ(p["candidates"].size(), 4u);  // direct, two relays, host memory
  uint64_t sum = 0;
  for (const json& path : p["paths"]) {
    sum += path["bytes"].get<uint64_t>();
    for (const json& l : path["links"]) EXPECT_LT(l.get<std::size_t>(), j["links"].size());
  }
  EXPECT_EQ(sum, 1073741824u);
  EXPECT_EQ(p["paths"].size(), 4u);
  // The first candidate is the direct NVLink.
  const json& first = j["links"][p["candidates"][0][0].get<std::size_t>()];
  EXPECT_EQ(first["kind"], "nvlink");
  EXPECT_EQ(first["from"], "h0.gpu0");
  EXPECT_EQ(first["to"], "h0.gpu1");
  EXPECT_LT(j["max_load_us"].get<double>(), j["direct_max_load_us"].get<double>() / 3);
  EXPECT_GT(j["plan_us"].get<double>(), 0);
  o = plan("--topology nimble-h100 --demand " + d.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("0 -> 1  1073741824 bytes:  direct"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("host memory"), std::string::npos) << o.out;
}

TEST_F(PlanCliTest, BadInputsAreNamed) {
  const auto d = write("d.json", R"({"ranks": 2, "bytes": [[0, 1], [1, 0]]})");
  auto o = plan("--topology dgx-a100 --demand " + d.string());
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("neither a preset"), std::string::npos) << o.err;
  o = plan("--topology dgx-h100");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("--demand"), std::string::npos) << o.err;
  const auto bad = write("bad.json", R"({"ranks": 2, "bytes": [[0, -1], [1, 0]]})");
  o = plan("--topology dgx-h100 --demand " + bad.string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("bytes[0][1] must be a non-negative integer"), std::string::npos) << o.err;
  const auto big = write("big.json", R"({"ranks": 3, "bytes": [[0,1,1],[1,0,1],[1,1,0]]})");
  o = plan("--topology h200-nv18-x2 --demand " + big.string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("has 3 ranks; the topology has 2 GPUs"), std::string::npos) << o.err;
  o = plan("--topology dgx-h100 --demand " + (dir_ / "missing.json").string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("missing.json: no such file"), std::string::npos) << o.err;
}

/// NIMBLE's hotspot on two nimble-h100 hosts: every rank sends 64 MiB, half of it to rank 0.
std::string hotspot_demand() {
  const uint64_t MiB = 1u << 20;
  json bytes = json::array();
  for (int s = 0; s < 8; ++s) {
    json row = json::array();
    for (int t = 0; t < 8; ++t) {
      if (s == t) {
        row.push_back(0);
        continue;
      }
      const uint64_t b = t == 0 ? 32 * MiB : (s == 0 ? 9 * MiB : 5 * MiB);
      row.push_back(b);
    }
    bytes.push_back(row);
  }
  return json{{"ranks", 8}, {"bytes", bytes}}.dump();
}

TEST_F(PlanCliTest, WritesTheBalancedProgramWhichRunHostVerifies) {
  const auto d = write("d.json", hotspot_demand());
  const auto prog = dir_ / "prog.json";
  auto o = plan("--topology nimble-h100 --nodes 2 --demand " + d.string() + " --json -o " +
                prog.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const json j = json::parse(o.out);
  // Predictions from the timing model on both programs: balancing helps here.
  const double balanced = j["predicted_us"].get<double>();
  const double direct = j["direct_predicted_us"].get<double>();
  EXPECT_GT(balanced, 0);
  EXPECT_LT(balanced, direct);
  // Every rank has a GPU, so relays forward through ranks: no slot devices.
  EXPECT_EQ(j["program"]["ranks"].size(), 8u);
  EXPECT_EQ(j["program"]["slot_devices"].size(), 0u);
  EXPECT_TRUE(j["exact_chunks"].get<bool>());
  const uint64_t chunk = j["chunk_bytes"].get<uint64_t>();
  EXPECT_GT(chunk, 0u);
  for (const json& p : j["pairs"]) {
    EXPECT_EQ(p["bytes"].get<uint64_t>() % chunk, 0u);
    for (const json& path : p["paths"]) EXPECT_EQ(path["bytes"].get<uint64_t>() % chunk, 0u);
  }
  auto run = run_cli("run-host " + prog.string());
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.out.rfind("PASS custom", 0), 0u) << run.out;
  // The summary says the same.
  o = plan("--topology nimble-h100 --nodes 2 --demand " + d.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("predicted (timing model, chunks of " + std::to_string(chunk) +
                       " bytes, exact): balanced"),
            std::string::npos)
      << o.out;
}

TEST_F(PlanCliTest, RelaysWithoutRanksBecomeSlotDevices) {
  // Two ranks on a four-GPU host: the relays' GPUs run no rank, so their connections keep
  // slots there; --relays forward adds ranks that only forward instead.
  const auto d = write("d.json", R"({"ranks": 2, "bytes": [[0, 268435456], [0, 0]]})");
  const auto prog = dir_ / "prog.json";
  auto o = plan("--topology nimble-h100 --demand " + d.string() + " --json -o " + prog.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  json j = json::parse(o.out);
  EXPECT_EQ(j["program"]["ranks"], json({"h0.gpu0", "h0.gpu1"}));
  EXPECT_EQ(j["program"]["slot_devices"], json({"h0.gpu2", "h0.gpu3"}));
  EXPECT_GE(j["program"]["placements"].get<int>(), 3);  // two slot devices and host memory
  const std::string text = read_text_file(prog);
  EXPECT_NE(text.find("\"slot_devices\": 2,"), std::string::npos);
  EXPECT_NE(text.find("\"slots\": \"host\""), std::string::npos);
  EXPECT_NE(text.find("\"slots\": \"device\""), std::string::npos);
  auto run = run_cli("run-host " + prog.string());
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  // MSCCL XML cannot carry it.
  auto xml = run_cli("export-msccl " + prog.string() + " -o " + (dir_ / "p.xml").string());
  EXPECT_NE(xml.exit_code, 0);
  EXPECT_NE((xml.out + xml.err).find("cannot carry connection placement"), std::string::npos)
      << xml.out << xml.err;

  o = plan("--topology nimble-h100 --demand " + d.string() + " --json --relays forward -o " +
           prog.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  j = json::parse(o.out);
  EXPECT_EQ(j["program"]["ranks"], json({"h0.gpu0", "h0.gpu1", "h0.gpu2", "h0.gpu3"}));
  EXPECT_EQ(j["program"]["slot_devices"].size(), 0u);
  run = run_cli("run-host " + prog.string());
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  // With slot devices or forwards the lone pair beats the direct NVLink.
  EXPECT_LT(j["predicted_us"].get<double>(), j["direct_predicted_us"].get<double>());
}

TEST_F(PlanCliTest, DrawsLinkLoadsBeforeAndAfter) {
  const auto d = write("d.json", hotspot_demand());
  const auto svg = dir_ / "loads.svg";
  auto o =
      plan("--topology nimble-h100 --nodes 2 --demand " + d.string() + " --svg " + svg.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const std::string text = read_text_file(svg);
  EXPECT_EQ(text.rfind("<?xml", 0), 0u);
  EXPECT_NE(text.find(">all pairs on their default path (max "), std::string::npos);
  EXPECT_NE(text.find(">balanced (max "), std::string::npos);
  EXPECT_NE(text.find("(one scale for every panel)"), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 7), "</svg>\n");
}

TEST_F(PlanCliTest, BenchTimesRepeatedPlans) {
  const auto d = write("d.json", hotspot_demand());
  auto o = plan("--topology nimble-h100 --nodes 2 --demand " + d.string() + " --json --bench");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const json j = json::parse(o.out);
  EXPECT_GE(j["bench"]["runs"].get<int>(), 5);
  EXPECT_GT(j["bench"]["min_us"].get<double>(), 0);
  EXPECT_LE(j["bench"]["min_us"].get<double>(), j["bench"]["median_us"].get<double>());
  o = plan("--topology nimble-h100 --nodes 2 --demand " + d.string() + " --bench");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("planner: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(" plans, min "), std::string::npos) << o.out;
}

TEST_F(PlanCliTest, ProgramOptionsAreChecked) {
  const auto d = write("d.json", R"({"ranks": 2, "bytes": [[0, 3000000], [0, 0]]})");
  auto o = plan("--topology nimble-h100 --demand " + d.string() + " --relays sideways");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("--relays: expected forward, slot-device or forward-or-slot-device"),
            std::string::npos)
      << o.err;
  o = plan("--topology nimble-h100 --demand " + d.string() + " --chunk-bytes 0");
  EXPECT_EQ(o.exit_code, 2);
  o = plan("--topology nimble-h100 --demand " + d.string() + " --chunk-bytes 1048576");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("ranks 0 -> 1: 3000000 bytes are not a whole number of 1048576-byte "
                       "chunks"),
            std::string::npos)
      << o.err;
  // A coarser chunk than the exact one: shares are rounded to whole chunks.
  o = plan("--topology nimble-h100 --demand " + d.string() + " --chunk-bytes 1000000 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_FALSE(json::parse(o.out)["exact_chunks"].get<bool>());
  const auto empty = write("e.json", R"({"ranks": 2, "bytes": [[0, 0], [0, 0]]})");
  o = plan("--topology nimble-h100 --demand " + empty.string() + " -o " + (dir_ / "p").string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no bytes"), std::string::npos) << o.err;
}

}  // namespace
