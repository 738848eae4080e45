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

}  // namespace
