// `efccl topo` as a user runs it: presets as JSON and pictures, clusters, usage errors, files
// that are missing, and detection on this (possibly GPU-less) machine.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Outcome = CliOutcome;

class TopoCliTest : public CliFixture {
 protected:
  /// Runs `efccl topo ARGS` with `env` ("NAME=value ..." or "") in front.
  Outcome topo(const std::string& args, const std::string& env = "") {
    return run_cli("topo " + args, env);
  }
};

TEST_F(TopoCliTest, PresetAsJsonHasEightGpusEachWithItsRailNic) {
  auto o = topo("--preset dgx-h100 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const json j = json::parse(o.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << o.out;
  EXPECT_EQ(j["hosts"], 1);
  ASSERT_EQ(j["gpus"].size(), 8u);
  ASSERT_EQ(j["nics"].size(), 8u);
  std::set<std::string> rails;
  for (const auto& g : j["gpus"]) {
    ASSERT_TRUE(g["rail"].is_string()) << g.dump();
    rails.insert(g["rail"].get<std::string>());
    EXPECT_EQ(g["sm"], 90);
  }
  EXPECT_EQ(rails.size(), 8u) << "one NIC per GPU";
  for (const auto& n : j["nics"]) EXPECT_EQ(n["gbps"], 50);  // NDR400
}

TEST_F(TopoCliTest, NodesMakesACluster) {
  auto o = topo("--preset dgx-h100 --nodes 2 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const json j = json::parse(o.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["hosts"], 2);
  ASSERT_EQ(j["gpus"].size(), 16u);
  std::set<std::string> rails;
  for (const auto& g : j["gpus"]) rails.insert(g["rail"].get<std::string>());
  EXPECT_EQ(rails.size(), 16u);
  EXPECT_EQ(j["gpus"][15]["id"], "h1.gpu7");

  // The same JSON read back and repeated: --json-file with --nodes.
  const auto file = dir_ / "one.json";
  ASSERT_EQ(topo("--preset nimble-h100 --json").exit_code, 0);
  std::ofstream(file) << read_text_file(dir_ / "stdout");
  o = topo("--json-file " + file.string() + " --nodes 3 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(json::parse(o.out)["gpus"].size(), 12u);
}

TEST_F(TopoCliTest, SummaryNamesGpusNicsAndLinks) {
  auto o = topo("--preset nimble-h100");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  for (const char* want : {"source: preset nimble-h100", "hosts 1, GPUs 4, NICs 4", "h0.gpu3",
                           "h0.nic3 (mlx5_3)", "450 (18 links)", "gpu0 gpu1 gpu2", "mlx5_0",
                           "h0.pcisw0", "h0.cpu1 (numa 1, memory h0.mem1", "rail3"})
    EXPECT_NE(o.out.find(want), std::string::npos) << want << "\n" << o.out;
}

TEST_F(TopoCliTest, SvgWritesAPicture) {
  const auto svg = dir_ / "dgx.svg";
  auto o = topo("--preset dgx-h100 --nodes 2 --svg " + svg.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const std::string text = read_text_file(svg);
  EXPECT_EQ(text.rfind("<?xml", 0), 0u);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  EXPECT_NE(text.find(">h1.gpu7<"), std::string::npos);
  EXPECT_NE(o.out.find("picture: " + svg.string()), std::string::npos) << o.out;

  o = topo("--preset dgx-h100 --svg " + (dir_ / "no" / "such" / "dir.svg").string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("cannot write"), std::string::npos) << o.err;
}

TEST_F(TopoCliTest, UsageErrorsExitTwoAndSayWhy) {
  auto o = topo("--preset dgx-a100");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("unknown preset 'dgx-a100'"), std::string::npos) << o.err;
  for (const char* known : {"nimble-h100", "dgx-h100", "hgx-h200", "h200-nv18-x2"})
    EXPECT_NE(o.err.find(known), std::string::npos) << known;

  o = topo("--frobnicate");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("unknown option '--frobnicate'"), std::string::npos) << o.err;
  o = topo("--preset dgx-h100 --nodes 0");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("--nodes"), std::string::npos) << o.err;
  o = topo("--preset dgx-h100 --nodes two");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("'two'"), std::string::npos) << o.err;
  o = topo("--preset dgx-h100 --xml x.xml");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("exclude each other"), std::string::npos) << o.err;
  EXPECT_EQ(topo("--preset").exit_code, 2);  // no value
  EXPECT_EQ(topo("extra").exit_code, 2);
}

TEST_F(TopoCliTest, MissingOrBadFilesAreNamed) {
  const auto missing = dir_ / "missing.xml";
  auto o = topo("--xml " + missing.string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find(missing.string()), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("no such file"), std::string::npos) << o.err;

  o = topo("--json-file " + (dir_ / "missing.json").string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("missing.json: no such file"), std::string::npos) << o.err;
  const auto bad = dir_ / "bad.json";
  std::ofstream(bad) << "{\"hosts\": 1, \"gpus\": 3}";
  o = topo("--json-file " + bad.string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find(bad.string()), std::string::npos) << o.err;

  // A two-host graph cannot be repeated.
  const auto two = dir_ / "two.json";
  ASSERT_EQ(topo("--preset h200-nv18-x2 --nodes 2 --json").exit_code, 0);
  std::ofstream(two) << read_text_file(dir_ / "stdout");
  o = topo("--json-file " + two.string() + " --nodes 2");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("already has 2 hosts"), std::string::npos) << o.err;
}

TEST_F(TopoCliTest, DetectIsTheDefaultAndNeverFails) {
  // Whatever this machine has, detection gives a graph: exit 0, a summary of the detected host.
  auto o = topo("", "NCCL_TOPO_FILE=");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("source: detected on this host"), std::string::npos) << o.out;
  if (o.out.find("GPUs 0,") != std::string::npos) {
    EXPECT_NE(o.out.find("no GPU was found"), std::string::npos) << o.out;
  }
  auto j = topo("--detect --json", "NCCL_TOPO_FILE=");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_FALSE(json::parse(j.out, nullptr, false).is_discarded()) << j.out;
  // NCCL_TOPO_FILE is passed on (and named in the source line).
  o = topo("--detect", "NCCL_TOPO_FILE=" + (dir_ / "topo.xml").string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("NCCL_TOPO_FILE=" + (dir_ / "topo.xml").string()), std::string::npos)
      << o.out;
}

}  // namespace
