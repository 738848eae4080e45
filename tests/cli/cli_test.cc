// The `efccl` command as a user runs it: exit codes, output shapes, conversions.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_fixture.h"
#include "msccl_corpus.h"

namespace {

namespace fs = std::filesystem;

using Outcome = CliOutcome;

class CliTest : public CliFixture {
 protected:
  Outcome run(const std::string& args) { return run_cli(args); }

  static std::string example(const std::string& name) {
    return std::string(EFCCL_SOURCE_DIR) + "/examples/ef/" + name;
  }
  static std::string corpus(const std::string& name) {
    return efccl::test_support::msccl_corpus_file(name);
  }
};

TEST_F(CliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(run("").exit_code, 2);
  EXPECT_EQ(run("frobnicate").exit_code, 2);
  EXPECT_EQ(run("validate").exit_code, 2);
  EXPECT_EQ(run("run-host").exit_code, 2);
  auto o = run("run-host " + example("ring_allgather_4r.json") + " --dtype float128");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("unknown datatype 'float128'"), std::string::npos) << o.err;
  EXPECT_EQ(run("run-host x.json --count -3").exit_code, 2);
  EXPECT_EQ(run("run-host x.json --inplace --outofplace").exit_code, 2);
  EXPECT_EQ(run("import-msccl in.xml").exit_code, 2);  // no -o
  EXPECT_EQ(run("help").exit_code, 0);
}

TEST_F(CliTest, ValidateAcceptsExamples) {
  auto o = run("validate " + example("ring_allreduce_4r_2ch.json") + " " +
               example("shift_custom_4r.json"));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err, "");
}

TEST_F(CliTest, ValidatesImportsAndShowsCorpusFiles) {
  EFCCL_REQUIRE_MSCCL_CORPUS();
  auto o = run("validate " + corpus("alltoall-8n-0-9kb.xml") + " " +
               corpus("all-reduce-ring-ll128.xml"));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  const auto json = dir_ / "a2a.json";
  o = run("import-msccl " + corpus("alltoall-8n-9kb-190kb.xml") + " -o " + json.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(run("run-host " + json.string()).exit_code, 0);
  o = run("show " + corpus("alltoall-8n-0-9kb.xml"));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("collective:     alltoall"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("ranks:          8"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("recv=56"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("copy=8"), std::string::npos) << o.out;
}

TEST_F(CliTest, ValidateReportsFileLocationAndRule) {
  auto bad = write("bad.json", "{\"format\": \"efccl-ef\", \"version\": 1, \"bogus\": 3}");
  auto o = run("validate " + bad.string());
  EXPECT_EQ(o.exit_code, 1);
  // Every line: FILE: LOCATION: message
  std::istringstream lines(o.err);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_EQ(line.rfind(bad.string() + ": ", 0), 0u) << line;
  }
  EXPECT_GT(n, 0);
  EXPECT_NE(o.err.find("/bogus"), std::string::npos) << o.err;

  o = run("validate " + (dir_ / "missing.json").string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no such file"), std::string::npos) << o.err;
}

TEST_F(CliTest, GarbageNeverCrashes) {
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage.push_back(static_cast<char>((i * 7919) % 251));
  for (const auto& text : {garbage, std::string("<"), std::string("{"), std::string(""),
                           std::string("<!DOCTYPE x [<!ENTITY a \"aaaa\">]><algo/>")}) {
    auto f = write("garbage", text);
    for (const char* cmd : {"validate", "run-host", "show"}) {
      auto o = run(std::string(cmd) + " " + f.string());
      EXPECT_EQ(o.exit_code, 1) << cmd << ": " << o.err;
    }
  }
}

TEST_F(CliTest, RunHostPassesAndPrintsOneLine) {
  auto o = run("run-host " + example("ring_allreduce_4r_2ch.json") +
               " --dtype bfloat16 --op max --inplace --seed 7");
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(o.out.rfind("PASS", 0), 0u) << o.out;
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1);

  o = run("run-host " + example("ring_allreduce_4r_2ch.json") + " --count 7");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out.rfind("FAIL", 0), 0u) << o.out;

  // The alltoall example is out-of-place only.
  o = run("run-host " + example("direct_alltoall_4r.json") + " --inplace");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out.rfind("FAIL", 0), 0u) << o.out;
}

TEST_F(CliTest, RunHostReportsDeadlockWithTooFewSlots) {
  // The chain broadcast root sends 3 chunks in a row; with one slot per connection it still
  // drains (no cycle), so it passes; a program that exchanges 2 units each way first cannot.
  auto ok = run("run-host " + example("chain_broadcast_4r.json") + " --slots 1");
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;

  const std::string exchange = R"({"format": "efccl-ef", "version": 1, "collective": "custom",
    "protocol": "Simple", "nranks": 2, "nchunksperloop": 2, "outofplace": true, "inplace": false,
    "ranks": [
     {"input_chunks": 2, "output_chunks": 2, "threadblocks": [{"send": 1, "recv": 1, "channel": 0,
       "ops": [{"op": "send", "src": {"buf": "input", "off": 0}, "count": 2},
               {"op": "recv", "dst": {"buf": "output", "off": 0}, "count": 2}]}]},
     {"input_chunks": 2, "output_chunks": 2, "threadblocks": [{"send": 0, "recv": 0, "channel": 0,
       "ops": [{"op": "send", "src": {"buf": "input", "off": 0}, "count": 2},
               {"op": "recv", "dst": {"buf": "output", "off": 0}, "count": 2}]}]}],
    "postconditions": [
      {"rank": 0, "index": 0, "sources": [{"rank": 1, "index": 0}]},
      {"rank": 0, "index": 1, "sources": [{"rank": 1, "index": 1}]},
      {"rank": 1, "index": 0, "sources": [{"rank": 0, "index": 0}]},
      {"rank": 1, "index": 1, "sources": [{"rank": 0, "index": 1}]}]})";
  auto f = write("exchange.json", exchange);
  auto pass = run("run-host " + f.string());
  EXPECT_EQ(pass.exit_code, 0) << pass.out << pass.err;
  auto stuck = run("run-host " + f.string() + " --slots 1");
  EXPECT_EQ(stuck.exit_code, 1);
  EXPECT_EQ(stuck.out.rfind("FAIL", 0), 0u) << stuck.out;
  EXPECT_NE(stuck.out.find("rank 0"), std::string::npos) << stuck.out;
  EXPECT_NE(stuck.out.find("rank 1"), std::string::npos) << stuck.out;
}

TEST_F(CliTest, ImportExportRoundTrip) {
  const auto first_xml = dir_ / "first.xml";
  const auto json = dir_ / "a2a.json", xml = dir_ / "a2a.xml", json2 = dir_ / "a2a2.json";
  auto o = run("export-msccl " + example("direct_alltoall_4r.json") + " -o " + first_xml.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  o = run("import-msccl " + first_xml.string() + " -o " + json.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  o = run("export-msccl " + json.string() + " -o " + xml.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  o = run("import-msccl " + xml.string() + " -o " + json2.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(read_text_file(json), read_text_file(json2));
  o = run("run-host " + xml.string());
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  // Wrong input format for the command.
  EXPECT_EQ(run("import-msccl " + json.string() + " -o " + (dir_ / "x").string()).exit_code, 1);
}

TEST_F(CliTest, ShowSummarises) {
  auto o = run("show " + example("direct_alltoall_4r.json"));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("collective:     alltoall"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("ranks:          4"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("threadblocks:   7 per rank"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("ops:            28 total: send=12 recv=12 copy=4"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("  rank 3: 4 / 4 / 0, 7 threadblocks"), std::string::npos) << o.out;
}

TEST_F(CliTest, CheckPrintsVerdictTable) {
  auto o = run("check " + example("ring_reducescatter_4r.json") + " " +
               example("allpairs_allreduce_3r.json"));
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("float/sum"), std::string::npos);
  EXPECT_NE(o.out.find("f8e4m3/sum"), std::string::npos);
  EXPECT_EQ(o.out.find("FAIL"), std::string::npos) << o.out;
  // 2 programs x 2 modes x 5 pairs
  EXPECT_NE(o.out.find("20 runs passed, 0 failed"), std::string::npos) << o.out;
}

TEST_F(CliTest, ListsAndGeneratesLibraryAlgorithms) {
  auto o = run("list-algorithms");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("ring_allreduce"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("direct_alltoall"), std::string::npos) << o.out;
  // The name column fits the longest name: a space after each.
  EXPECT_NE(o.out.find("shared_gpu_allreduce_single allreduce"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("shared_gpu_reducescatter    reducescatter"), std::string::npos) << o.out;

  const auto json = dir_ / "ring.json", xml = dir_ / "ring.xml";
  o = run("generate ring_allreduce --ranks 5 --instances 2 -o " + json.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  o = run("generate ring_allreduce --ranks 5 --instances 2 --protocol LL -o " + xml.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(read_text_file(xml).find("proto=\"LL\""), std::string::npos);
  for (const auto& f : {json, xml}) {
    o = run("run-host " + f.string() + " --dtype int32 --op prod");
    EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  }
  // An unknown name is a usage error (README: exit 2), and says where the names are listed.
  o = run("generate no_such_algorithm --ranks 2 -o " + json.string());
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("unknown algorithm 'no_such_algorithm' (`efccl list-algorithms` lists "
                       "them)"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(run("generate ring_allreduce -o " + json.string()).exit_code, 2);  // no --ranks
  EXPECT_EQ(run("generate ring_allreduce --ranks 0 -o " + json.string()).exit_code, 2);
  EXPECT_EQ(run("generate hierarchical_allreduce --nodes 2 -o " + json.string()).exit_code, 2);
  // A valid parameter the algorithm refuses is a failed run, not a usage error.
  o = run("generate ring_broadcast --ranks 3 --root 5 -o " + json.string());
  EXPECT_EQ(o.exit_code, 1) << o.err;
}

TEST_F(CliTest, GenerateTakesNodesTimesGpusWithoutRanks) {
  const auto split = dir_ / "split.json", explicit_ranks = dir_ / "ranks.json";
  auto o = run("generate hierarchical_allreduce --nodes 2 --gpus-per-node 3 -o " + split.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  o = run("generate hierarchical_allreduce --ranks 6 --nodes 2 --gpus-per-node 3 -o " +
          explicit_ranks.string());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(read_text_file(split), read_text_file(explicit_ranks));
  EXPECT_NE(read_text_file(split).find("\"nranks\": 6,"), std::string::npos);
  o = run("run-host " + split.string());
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  o = run("generate ring_allreduce --nodes 64 --gpus-per-node 65 -o " + split.string());
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("4160 ranks; at most 4096"), std::string::npos) << o.err;
}

TEST_F(CliTest, AMissingFileIsNamedAsMissing) {
  const std::string missing = (dir_ / "ring.json").string();
  auto o = run("run-host " + missing);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out, "FAIL " + missing + ": no such file (see the messages above)\n");
  EXPECT_EQ(o.err, missing + ": (file): cannot open: no such file [io]\n");
  o = run("check " + missing);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.out.find("ring.json" + std::string(31, ' ') + "FAIL: no such file"),
            std::string::npos)
      << o.out;
  // An invalid program is still called one.
  auto bad = write("bad.json", "{}");
  o = run("run-host " + bad.string());
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out, "FAIL " + bad.string() + ": invalid program (see the messages above)\n");
}

// `efccl compile` needs the Python package the build puts at build/python (next to bin/).
bool python_package_built(std::string* where) {
  const fs::path dir = fs::path(EFCCL_CLI_PATH).parent_path().parent_path() / "python" / "efccl";
  *where = dir.string();
  return fs::is_directory(dir);
}

#define SKIP_WITHOUT_PYTHON_PACKAGE()                                                    \
  do {                                                                                   \
    std::string where;                                                                   \
    if (!python_package_built(&where))                                                   \
      GTEST_SKIP() << "the efccl Python package was not built (" << where << " missing)"; \
  } while (0)

TEST_F(CliTest, CompileWritesJsonAndXmlThatRun) {
  SKIP_WITHOUT_PYTHON_PACKAGE();
  const std::string script = std::string(EFCCL_SOURCE_DIR) + "/examples/gc3/fig1a_ring_allreduce.py";
  const auto json = dir_ / "ring.json", xml = dir_ / "ring.xml";
  auto o = run("compile " + script + " -o " + json.string() + " -- 4 --channels 2");
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_NE(read_text_file(json).find("\"efccl-ef\""), std::string::npos);
  EXPECT_EQ(o.out, "");  // saved, not also printed
  o = run("compile " + script + " -o " + xml.string() + " -- 4");
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_NE(read_text_file(xml).find("<algo"), std::string::npos);
  for (const auto& f : {json, xml}) {
    o = run("run-host " + f.string());
    EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
    EXPECT_EQ(o.out.rfind("PASS", 0), 0u) << o.out;
  }
}

TEST_F(CliTest, CompileSavesWhereTheScriptCallsJsonOrXml) {
  SKIP_WITHOUT_PYTHON_PACKAGE();
  auto script = write("direct.py", R"(
from efccl.language import *
from efccl.language.collectives import AllGather
from efccl.topologies import fully_connected

with MSCCLProgram("direct_allgather", fully_connected(3), AllGather(3, 1, False), 1):
    for r in range(3):
        for d in range(3):
            chunk(r, Buffer.input, 0).copy(d, Buffer.output, r)
    JSON()
)");
  const auto out = dir_ / "ag.json";
  auto o = run("compile " + script.string() + " -o " + out.string());
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_EQ(o.out, "");  // saved, not printed
  o = run("run-host " + out.string());
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
}

TEST_F(CliTest, CompileFailures) {
  SKIP_WITHOUT_PYTHON_PACKAGE();
  const auto out = dir_ / "out.json";
  // A script that raises: exit 1, and no output left behind.
  auto raises = write("raises.py", "raise ValueError('boom')\n");
  std::ofstream(out) << "stale";
  auto o = run("compile " + raises.string() + " -o " + out.string());
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("boom"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("exited with status 1"), std::string::npos) << o.err;
  EXPECT_FALSE(fs::exists(out));
  // A script that compiles nothing.
  auto nothing = write("nothing.py", "print('hello')\n");
  o = run("compile " + nothing.string() + " -o " + out.string());
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("did not compile a program"), std::string::npos) << o.err;
  // A missing script.
  o = run("compile " + (dir_ / "missing.py").string() + " -o " + out.string());
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("no such file"), std::string::npos) << o.err;
  // Usage errors.
  EXPECT_EQ(run("compile " + raises.string()).exit_code, 2);  // no -o
  EXPECT_EQ(run("compile -o " + out.string()).exit_code, 2);  // no script
}

}  // namespace
