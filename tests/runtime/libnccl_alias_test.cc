// build/lib/libnccl.so.2: a program linked against the real NCCL (DT_NEEDED libnccl.so.2)
// runs on efccl when LD_LIBRARY_PATH names build/lib.
//
// This file is two programs. Built with EFCCL_ALIAS_PROBE it is the probe, linked against the
// real libnccl.so and without an rpath: it prints which file its ncclGetVersion came from, the
// version, and the message ncclGetLastError gives after a bad call (efccl's names the
// function). Otherwise it is the test, which runs the probe with each library.
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>

#ifdef EFCCL_ALIAS_PROBE

#include <climits>
#include <cstdlib>

int main() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || info.dli_fname == nullptr) {
    std::printf("dladdr failed\n");
    return 1;
  }
  char resolved[PATH_MAX];
  if (realpath(info.dli_fname, resolved) == nullptr) return 1;
  int version = 0;
  const ncclResult_t ok = ncclGetVersion(&version);
  const ncclResult_t bad = ncclGetVersion(nullptr);
  std::printf("library=%s\nloaded-as=%s\nversion=%d result=%d\nnull-result=%d last-error=%s\n",
              resolved, info.dli_fname, version, static_cast<int>(ok), static_cast<int>(bad),
              ncclGetLastError(nullptr));
  return 0;
}

#else

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../tools/run_command.h"

namespace {

const std::filesystem::path kEfccl = EFCCL_SHARED_LIBRARY;
const std::string kProbe = ALIAS_PROBE_PATH;

TEST(LibncclAlias, AliasesNameTheEfcclLibrary) {
  const auto dir = kEfccl.parent_path();
  for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
    ASSERT_TRUE(std::filesystem::exists(dir / name)) << dir / name;
    EXPECT_EQ(std::filesystem::canonical(dir / name), std::filesystem::canonical(kEfccl)) << name;
  }
}

TEST(LibncclAlias, ProgramLinkedAgainstNcclRunsOnEfccl) {
  const std::string dir = kEfccl.parent_path().string();
  const auto r = run_command("LD_LIBRARY_PATH=" + shell_quote(dir) + " " + shell_quote(kProbe));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("library=" + std::filesystem::canonical(kEfccl).string() + "\n"),
            std::string::npos)
      << "ncclGetVersion must come from libefccl.so:\n"
      << r.output;
  EXPECT_NE(r.output.find("loaded-as=" + dir + "/libnccl.so.2\n"), std::string::npos)
      << "found under NCCL's name:\n"
      << r.output;
  EXPECT_NE(r.output.find("version=22809 result=0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("last-error=ncclGetVersion: version is NULL"), std::string::npos)
      << "efccl's error message:\n"
      << r.output;
}

TEST(LibncclAlias, LddResolvesLibncclToBuildLib) {
  const std::string dir = kEfccl.parent_path().string();
  const auto r = run_command("LD_LIBRARY_PATH=" + shell_quote(dir) + " ldd " + shell_quote(kProbe));
  if (r.exit_code == 127) GTEST_SKIP() << "ldd is not installed";
  EXPECT_NE(r.output.find("libnccl.so.2 => " + dir + "/libnccl.so.2"), std::string::npos)
      << r.output;
}

TEST(LibncclAlias, TheProbeTellsTheRealNcclApart) {
  const auto real = std::filesystem::path(REAL_NCCL_LIBRARY);
  const auto r = run_command("LD_LIBRARY_PATH=" + shell_quote(real.parent_path().string()) + " " +
                             shell_quote(kProbe));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("library=" + std::filesystem::canonical(real).string() + "\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("last-error=ncclGetVersion: version is NULL"), std::string::npos)
      << r.output;
}

}  // namespace

#endif
