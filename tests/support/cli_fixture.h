// The `efccl` command run as a user runs it (the tests of tests/cli): a fresh folder per test,
// the command's exit code, stdout and stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

struct CliOutcome {
  int exit_code = -1;  ///< -1 when the process did not exit normally (a crash)
  std::string out, err;
};

inline std::string read_text_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CliFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("efccl_" + std::string(info->test_suite_name()) + "_" + std::to_string(getpid()) +
            "_" + info->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Runs `efccl ARGS` with `env` ("NAME=value ..." or "") in front; stdin is /dev/null.
  CliOutcome run_cli(const std::string& args, const std::string& env = "") {
    const auto out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd = env + (env.empty() ? "" : " ") + std::string(EFCCL_CLI_PATH) + " " +
                            args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
    const int status = std::system(cmd.c_str());
    CliOutcome o;
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    o.out = read_text_file(out);
    o.err = read_text_file(err);
    return o;
  }

  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  std::filesystem::path dir_;
};
