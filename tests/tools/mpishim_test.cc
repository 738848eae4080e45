// The MPI shim under efccl-mprun: every function's results on 3 ranks (mpishim_check.cc), a
// job of one rank without the launcher, and the failures that must end the job with a message
// instead of a hang: mismatched collectives, a late peer, MPI_Abort, a vanished peer.
#include <gtest/gtest.h>

#include <string>

#include "run_command.h"

namespace {

const std::string kMprun = EFCCL_MPRUN_PATH;
const std::string kCheck = MPISHIM_CHECK_PATH;

CommandResult check_under_mprun(int nranks, const std::string& mode, const std::string& env = "") {
  return run_command(env + " " + kMprun + " -n " + std::to_string(nranks) + " --timeout 60 -- " +
                     kCheck + " " + mode);
}

TEST(MpiShim, EveryFunctionOnThreeRanks) {
  const auto r = check_under_mprun(3, "all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] mpishim_check: all "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
}

TEST(MpiShim, EveryFunctionOnFourRanks) {  // two ranks per color in the split
  const auto r = check_under_mprun(4, "all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
}

TEST(MpiShim, OneRankWithAndWithoutTheLauncher) {
  auto r = check_under_mprun(1, "all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all "), std::string::npos) << r.output;
  r = run_command("env -u EFCCL_MPRUN_SIZE -u EFCCL_MPRUN_RANK " + kCheck + " all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on each of 1 ranks"), std::string::npos) << r.output;
}

TEST(MpiShim, StrangersAtTheLauncherNeitherStopTheJobNorReachTheTerminal) {
  // 200 idle connections (more than the launcher keeps) and a HELLO full of control characters,
  // there before any rank registers.
  const auto r = check_under_mprun(3, "bother");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << "raw escape bytes reached the output";
  EXPECT_EQ(r.output.find('\x07'), std::string::npos) << "raw bell bytes reached the output";
  EXPECT_NE(r.output.find("\\x1b[2J"), std::string::npos)
      << "the bytes are shown escaped: " << r.output;
  // Refusals are reported at most once a second, with a count.
  std::size_t lines = 0;
  for (std::size_t at = 0;
       (at = r.output.find("rendezvous server: refused", at)) != std::string::npos; ++at)
    ++lines;
  EXPECT_GE(lines, 1u) << r.output;
  EXPECT_LE(static_cast<double>(lines), r.seconds + 2) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiShim, MismatchedCollectivesFailTheJob) {
  const auto r = check_under_mprun(3, "mismatch");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("collective mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MPI_Barrier"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MPI_Allreduce"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20);
}

TEST(MpiShim, LatePeerTimesOut) {
  const auto r = check_under_mprun(3, "late", "EFCCL_MPISHIM_TIMEOUT=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("timed out"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("efccl mpishim: rank "), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiShim, AbortStopsTheJobWithItsErrorcode) {
  const auto r = check_under_mprun(3, "abort");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("rank 1 called MPI_Abort with errorcode 7"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiShim, VanishedPeerIsAnErrorNotAHang) {
  const auto r = check_under_mprun(3, "vanish");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("closed"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(MpiShim, BadEnvironmentIsReported) {
  auto r = run_command("EFCCL_MPRUN_SIZE=2 EFCCL_MPRUN_RANK=0 " + kCheck + " all");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("EFCCL_MPRUN_ADDR"), std::string::npos) << r.output;
  r = run_command("EFCCL_MPISHIM_TIMEOUT=soon " + kCheck + " all");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("EFCCL_MPISHIM_TIMEOUT"), std::string::npos) << r.output;
}

}  // namespace
