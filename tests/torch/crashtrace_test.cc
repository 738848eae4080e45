// crashtrace.so (tests/torch/crashtrace.c, preloaded by run_gpu_checks.sh --crash-trace): a
// crashing program still dies of its signal, and stderr holds the signal, the faulting address,
// the thread and frames that symbolize_crashtrace.py names; a handler the program installs is
// chained after the trace.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Outcome {
  int signal = 0;  ///< the signal that ended the child (0: it exited)
  std::string stderr_text;
};

/// Runs `argv` with `LD_PRELOAD=<crashtrace.so>`, collecting its stderr.
Outcome run_preloaded(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    setenv("LD_PRELOAD", CRASHTRACE_LIBRARY, 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  Outcome out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.stderr_text.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  out.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Crashtrace, ASegfaultPrintsSignalAddressAndFramesAndStillKills) {
  const Outcome o = run_preloaded({CRASHER, "segv"});
  EXPECT_EQ(o.signal, SIGSEGV) << o.stderr_text;
  EXPECT_TRUE(contains(o.stderr_text, "=== crashtrace: pid")) << o.stderr_text;
  EXPECT_TRUE(contains(o.stderr_text, "signal 11 (Segmentation fault), address 0x10"))
      << o.stderr_text;
  EXPECT_TRUE(contains(o.stderr_text, "crashtrace_crasher+0x")) << o.stderr_text;
  EXPECT_TRUE(contains(o.stderr_text, "=== crashtrace: end of pid")) << o.stderr_text;
}

TEST(Crashtrace, TheProgramsOwnHandlerRunsAfterTheTrace) {
  const Outcome o = run_preloaded({CRASHER, "chained"});
  EXPECT_EQ(o.signal, SIGSEGV) << o.stderr_text;
  const auto end = o.stderr_text.find("=== crashtrace: end of pid");
  const auto own = o.stderr_text.find("crasher: its own handler ran");
  ASSERT_NE(end, std::string::npos) << o.stderr_text;
  ASSERT_NE(own, std::string::npos) << o.stderr_text;
  EXPECT_LT(end, own) << o.stderr_text;
  // Once: the re-raise after the chained handler prints no second trace.
  EXPECT_EQ(o.stderr_text.find("=== crashtrace: pid", end), std::string::npos) << o.stderr_text;
}

TEST(Crashtrace, NamesTheThreadAndTracesAbort) {
  const Outcome t = run_preloaded({CRASHER, "thread"});
  EXPECT_EQ(t.signal, SIGSEGV) << t.stderr_text;
  EXPECT_TRUE(contains(t.stderr_text, "(crasher-thread): signal 11")) << t.stderr_text;
  const Outcome a = run_preloaded({CRASHER, "abort"});
  EXPECT_EQ(a.signal, SIGABRT) << a.stderr_text;
  EXPECT_TRUE(contains(a.stderr_text, "signal 6 (Aborted)")) << a.stderr_text;
}

TEST(Crashtrace, SymbolizeNamesTheFaultingFunction) {
  if (std::string(PYTHON).empty()) GTEST_SKIP() << "no Python interpreter was found at configure";
  if (std::system("command -v addr2line > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "addr2line (binutils) is not installed";
  const Outcome o = run_preloaded({CRASHER, "segv"});
  const std::string log = ::testing::TempDir() + "crashtrace_test.log";
  std::ofstream(log) << o.stderr_text;
  const std::string command = std::string(PYTHON) + " " + SYMBOLIZE + " " + log;
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string named;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) named.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << named;
  EXPECT_TRUE(contains(named, "efccl_crasher_fault at ")) << named;
  EXPECT_TRUE(contains(named, "crashtrace_crasher.c:")) << named;
}

}  // namespace
