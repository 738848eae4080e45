// efccl-mprun: the environment of each rank, prefixed output, and stopping the job when a rank
// fails, when the timeout passes or when the launcher is interrupted, without hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "run_command.h"

namespace {

const std::string kMprun = EFCCL_MPRUN_PATH;

/// efccl-mprun with `args`, the ranks running `script` in /bin/sh.
CommandResult mprun(const std::string& args, const std::string& script) {
  return run_command(kMprun + " " + args + " -- sh -c " + shell_quote(script));
}

bool process_gone(pid_t pid) {
  // A killed process may stay a zombie for a moment until its parent (or init) reaps it.
  for (int i = 0; i < 100; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "mprun_test.XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

TEST(Mprun, SetsTheEnvironmentOfEveryRank) {
  const auto r = mprun("-n 3 --timeout 30",
                       "echo \"env $EFCCL_MPRUN_RANK $EFCCL_MPRUN_SIZE $RANK $WORLD_SIZE "
                       "$LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $EFCCL_MPRUN_ADDR "
                       "$EFCCL_MPRUN_ID_FILE\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex line(
      R"(\[(\d)\] env (\d) 3 (\d) 3 (\d) 3 127\.0\.0\.1 (\d+) 127\.0\.0\.1:(\d+) (\S+)\n)");
  std::set<int> ranks;
  std::set<std::string> master_ports, id_files;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    EXPECT_EQ(m[1], m[2]);  // the prefix is the rank
    EXPECT_EQ(m[2], m[3]);  // RANK
    EXPECT_EQ(m[2], m[4]);  // LOCAL_RANK
    ranks.insert(std::stoi(m[1]));
    master_ports.insert(m[5]);
    id_files.insert(m[7]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2})) << r.output;
  EXPECT_EQ(master_ports.size(), 1u) << "every rank gets the same MASTER_PORT";
  ASSERT_EQ(id_files.size(), 1u) << "every rank gets the same EFCCL_MPRUN_ID_FILE";
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(*id_files.begin()).parent_path()))
      << "the temporary folder of the id file is removed at the end";
}

TEST(Mprun, IdFileIsInAFreshFolderOrWhereAsked) {
  auto r =
      mprun("-n 2 --timeout 30",
            "d=$(dirname \"$EFCCL_MPRUN_ID_FILE\"); [ -d \"$d\" ] && [ -z \"$(ls -A \"$d\")\" ] "
            "&& echo fresh-and-empty");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] fresh-and-empty"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[1] fresh-and-empty"), std::string::npos) << r.output;

  TempDir dir;
  const std::string file = (dir.path() / "id").string();
  std::ofstream(file) << "stale";
  r = mprun("-n 2 --timeout 30 --id-file " + file,
            "[ \"$EFCCL_MPRUN_ID_FILE\" = " + shell_quote(file) +
                " ] && [ ! -e \"$EFCCL_MPRUN_ID_FILE\" ] && echo asked");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] asked"), std::string::npos)
      << "stale file removed first: " << r.output;
}

TEST(Mprun, PrefixesEveryLineWithItsRank) {
  const auto r =
      mprun("-n 2 --timeout 30", "printf 'one\\ntwo\\n'; echo to-stderr >&2; printf unterminated");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* rank : {"[0] ", "[1] "})
    for (const char* text : {"one\n", "two\n", "to-stderr\n", "unterminated\n"})
      EXPECT_NE(r.output.find(std::string(rank) + text), std::string::npos)
          << rank << text << " missing in:\n"
          << r.output;
}

TEST(Mprun, FailingRankStopsTheOthersPromptly) {
  TempDir dir;
  // Every rank leaves a child of its own behind; rank 1 fails after a moment.
  const auto r = mprun("-n 3 --timeout 60",
                       "sleep 60 & echo $$ $! > " + dir.path().string() +
                           "/pids.$RANK; if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; wait");
  EXPECT_EQ(r.exit_code, 3) << "the failed rank's status: " << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 1 \(pid \d+\) exited with status 3)")))
      << r.output;
  for (int rank : {0, 2}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + ": was killed by signal 15 (SIGTERM)"),
              std::string::npos)
        << r.output;
    std::ifstream in(dir.path() / ("pids." + std::to_string(rank)));
    pid_t shell = 0, child = 0;
    ASSERT_TRUE(in >> shell >> child) << "rank " << rank << " did not start";
    EXPECT_TRUE(process_gone(shell)) << "rank " << rank << " survived";
    EXPECT_TRUE(process_gone(child)) << "the child of rank " << rank << " survived";
  }
}

TEST(Mprun, KilledRankIsNamedWithItsSignal) {
  const auto r = mprun("-n 2 --timeout 60", "if [ $RANK = 0 ]; then kill -SEGV $$; fi; sleep 60");
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.output;
  EXPECT_LT(r.seconds, 10);
  EXPECT_NE(r.output.find("rank 0"), std::string::npos);
  EXPECT_NE(r.output.find("killed by signal 11 (SIGSEGV)"), std::string::npos) << r.output;
}

TEST(Mprun, RankIgnoringSigtermGetsSigkillAfterTheGrace) {
  const auto r = mprun("-n 2 --timeout 60 --grace 1",
                       "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 1; fi; sleep 60");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_GE(r.seconds, 1.4);
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("sending SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: was killed by signal 9 (SIGKILL)"), std::string::npos)
      << r.output;
}

TEST(Mprun, TimeoutStopsTheJob) {
  const auto r = mprun("-n 2 --timeout 1", "if [ $RANK = 0 ]; then exit 0; fi; sleep 60");
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 8) << r.output;
  EXPECT_NE(r.output.find("timeout: 1 s passed with rank(s) 1 still running"), std::string::npos)
      << r.output;
}

TEST(Mprun, ExitsZeroOnlyWhenEveryRankDoes) {
  EXPECT_EQ(mprun("-n 4 --timeout 30", "exit 0").exit_code, 0);
  const auto r = mprun("-n 4 --timeout 30", "[ $RANK = 3 ] && exit 5; exit 0");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("rank 3"), std::string::npos) << r.output;
}

TEST(Mprun, HostsGivesTheRanksHostIdentitiesInBlocks) {
  const auto r = mprun("-n 5 --hosts 2 --timeout 30",
                       "echo \"host $RANK $EFCCL_MPRUN_HOST $EFCCL_MPRUN_HOSTS $GROUP_RANK "
                       "$LOCAL_RANK $LOCAL_WORLD_SIZE $NCCL_HOSTID\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex line(R"(\[\d\] host (\d) (\d) 2 (\d) (\d) (\d) (\S+)\n)");
  std::map<int, std::vector<std::string>> seen;  // rank -> host, group, local, local size, id
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it)
    seen[std::stoi((*it)[1])] = {(*it)[2], (*it)[3], (*it)[4], (*it)[5], (*it)[6]};
  ASSERT_EQ(seen.size(), 5u) << r.output;
  // rank * 2 / 5: ranks 0-2 on host 0, ranks 3-4 on host 1.
  const std::vector<std::vector<std::string>> expected = {{"0", "0", "0", "3"},
                                                          {"0", "0", "1", "3"},
                                                          {"0", "0", "2", "3"},
                                                          {"1", "1", "0", "2"},
                                                          {"1", "1", "1", "2"}};
  for (int rank = 0; rank < 5; ++rank)
    EXPECT_EQ(std::vector<std::string>(seen[rank].begin(), seen[rank].begin() + 4),
              expected[static_cast<std::size_t>(rank)])
        << "rank " << rank;
  EXPECT_EQ(seen[0][4], seen[2][4]);
  EXPECT_EQ(seen[3][4], seen[4][4]);
  EXPECT_NE(seen[0][4], seen[3][4]);
  // Without --hosts the ranks keep the machine's identity.
  const auto plain = mprun("-n 2 --timeout 30", "echo \"id=${NCCL_HOSTID-unset}\"");
  EXPECT_NE(plain.output.find("[0] id=unset"), std::string::npos) << plain.output;
}

TEST(Mprun, MissingProgramFails) {
  const auto r = run_command(kMprun + " -n 2 --timeout 30 -- /nonexistent/program");
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot execute '/nonexistent/program'"), std::string::npos) << r.output;
}

TEST(Mprun, UsageErrors) {
  for (const char* args : {"", "-n 0 -- true", "-n 2", "-n 2 --bogus -- true", "-n x -- true",
                           "-n 2 --timeout -1 -- true", "-n 2 --hosts 0 -- true",
                           "-n 2 --hosts 3 -- true", "-n 2 --hosts x -- true"}) {
    const auto r = run_command(kMprun + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("usage: efccl-mprun"), std::string::npos) << args;
  }
  // The program's own options are not the launcher's, with or without "--".
  const auto r = run_command(kMprun + " -n 1 echo -n hi");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "[0] hi\n");
}

TEST(Mprun, InterruptedLauncherStopsTheRanks) {
  const auto r =
      run_command("sh -c " + shell_quote(kMprun + " -n 2 -- sleep 60 & p=$!; sleep 0.5; "
                                                  "kill -TERM $p; wait $p; echo launcher=$?"));
  EXPECT_NE(r.output.find("launcher=143"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("received SIGTERM"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

}  // namespace

namespace {

/// A stand-in for the driver's nvidia-cuda-mps-control in `dir` (this machine has no driver):
/// `-d` creates the control pipe's file, `quit` on stdin removes it; every call is logged.
void write_fake_mps_control(const std::filesystem::path& dir, const std::filesystem::path& log) {
  const auto path = dir / "nvidia-cuda-mps-control";
  std::ofstream(path) << "#!/bin/sh\n"
                         "echo \"call $* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY\" >> "
                      << log.string()
                      << "\n"
                         "if [ \"$1\" = -d ]; then touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0; fi\n"
                         "read cmd\n"
                         "echo \"command $cmd\" >> "
                      << log.string()
                      << "\n"
                         "[ \"$cmd\" = quit ] && rm -f \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n"
                         "exit 0\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

}  // namespace

TEST(Mprun, MpsStartsAPrivateDaemonForTheJobAndStopsIt) {
  TempDir dir;
  const auto log = dir.path() / "calls.log";
  write_fake_mps_control(dir.path(), log);
  const auto r = run_command("PATH=" + dir.path().string() + ":$PATH " + kMprun +
                             " -n 2 --timeout 30 --mps -- sh -c " +
                             shell_quote("echo \"pipe $CUDA_MPS_PIPE_DIRECTORY\"; "
                                         "[ -e \"$CUDA_MPS_PIPE_DIRECTORY/control\" ] && echo up"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex pipe_line(R"(\[(\d)\] pipe (\S+)\n)");
  std::set<std::string> pipes;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), pipe_line);
       it != std::sregex_iterator(); ++it)
    pipes.insert((*it)[2]);
  ASSERT_EQ(pipes.size(), 1u) << "both ranks reach the same daemon: " << r.output;
  EXPECT_NE(r.output.find("[0] up"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[1] up"), std::string::npos) << r.output;
  std::ifstream in(log);
  std::stringstream calls;
  calls << in.rdbuf();
  EXPECT_NE(calls.str().find("call -d pipe=" + *pipes.begin()), std::string::npos) << calls.str();
  EXPECT_NE(calls.str().find("command quit"), std::string::npos) << calls.str();
  EXPECT_FALSE(std::filesystem::exists(*pipes.begin())) << "the job's folder is removed";
}

TEST(Mprun, MpsWithoutTheDaemonProgramSaysSoAndStartsNothing) {
  TempDir empty;
  const auto r =
      run_command("PATH=" + empty.path().string() + " " + kMprun +
                  " -n 2 --timeout 30 --mps -- /bin/sh -c " + shell_quote("echo started"));
  EXPECT_EQ(r.exit_code, 125) << r.output;
  EXPECT_NE(r.output.find("nvidia-cuda-mps-control is not in PATH"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
}
