// tests/support/mprun_env.h under efccl-mprun: every rank gets rank 0's ncclUniqueId through
// EFCCL_MPRUN_ID_FILE; a rank whose rank 0 never publishes gives up with a message.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "run_command.h"

namespace {

const std::string kMprun = EFCCL_MPRUN_PATH;
const std::string kCheck = MPRUN_ENV_CHECK_PATH;

TEST(MprunEnv, EveryRankGetsRankZerosUniqueId) {
  for (int n : {1, 3}) {
    const auto r = run_command(kMprun + " -n " + std::to_string(n) + " --timeout 120 -- " + kCheck);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(
        r.output.find("[0] mprun_env_check: " + std::to_string(n) + " ranks share one unique id"),
        std::string::npos)
        << r.output;
  }
}

TEST(MprunEnv, WaitingForAnUnpublishedIdGivesUp) {
  const std::string missing =
      (std::filesystem::temp_directory_path() / "mprun_env_test_no_such_id").string();
  std::filesystem::remove(missing);
  const auto r =
      run_command("EFCCL_MPRUN_SIZE=2 EFCCL_MPRUN_RANK=1 EFCCL_MPRUN_ID_FILE=" + missing + " " +
                  kCheck + " wait 300");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1: rank 0 did not publish a unique id in " + missing),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 10);
}

}  // namespace
