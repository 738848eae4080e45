// NCCL's manners: a program linked against efccl prints nothing unless NCCL_DEBUG (or
// EFCCL_DEBUG) asks; VERSION prints the version line, WARN adds the warnings.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct ProbeRun {
  int status = -1;
  std::string output;  ///< stdout and stderr together
  std::string report;  ///< the probe's reason for failing, if any
};

/// Runs the probe with `debug` as NCCL_DEBUG ("": unset), the other debug variables unset.
ProbeRun run_probe(const std::string& debug) {
  char dir[] = "/tmp/efccl_silent_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  const std::string out = std::string(dir) + "/out", report = std::string(dir) + "/report";
  const pid_t pid = fork();
  if (pid == 0) {
    for (const char* v : {"NCCL_DEBUG", "EFCCL_DEBUG", "NCCL_DEBUG_FILE", "EFCCL_DEBUG_FILE",
                          "NCCL_DEBUG_SUBSYS", "EFCCL_DEBUG_SUBSYS"})
      unsetenv(v);
    if (!debug.empty()) setenv("NCCL_DEBUG", debug.c_str(), 1);
    if (std::freopen(out.c_str(), "w", stdout) == nullptr) _exit(125);
    dup2(fileno(stdout), fileno(stderr));
    execl(SILENT_PROBE_PATH, SILENT_PROBE_PATH, report.c_str(), static_cast<char*>(nullptr));
    _exit(126);
  }
  ProbeRun r;
  waitpid(pid, &r.status, 0);
  std::stringstream o, p;
  o << std::ifstream(out).rdbuf();
  r.output = o.str();
  if (std::ifstream rep(report); rep) {
    p << rep.rdbuf();
    r.report = p.str();
  }
  std::remove(out.c_str());
  std::remove(report.c_str());
  rmdir(dir);
  return r;
}

TEST(Silent, NothingIsPrintedWithoutDebugVariables) {
  const ProbeRun r = run_probe("");
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.report;
  EXPECT_EQ(r.output, "");
}

TEST(Silent, VersionAndWarnLevelsPrintWhatTheyName) {
  const ProbeRun version = run_probe("VERSION");
  ASSERT_TRUE(WIFEXITED(version.status) && WEXITSTATUS(version.status) == 0) << version.report;
  EXPECT_NE(version.output.find("EFCCL VERSION"), std::string::npos) << version.output;
  EXPECT_EQ(version.output.find("EFCCL WARN"), std::string::npos) << version.output;
  const ProbeRun warn = run_probe("WARN");
  ASSERT_TRUE(WIFEXITED(warn.status) && WEXITSTATUS(warn.status) == 0) << warn.report;
  EXPECT_NE(warn.output.find("EFCCL VERSION"), std::string::npos) << warn.output;
  EXPECT_NE(warn.output.find("EFCCL WARN ncclCommCount: comm is NULL"), std::string::npos)
      << warn.output;
  EXPECT_EQ(warn.output.find("EFCCL INFO"), std::string::npos) << warn.output;
}

}  // namespace
