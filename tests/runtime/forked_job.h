// Runtime tests whose ranks are forked processes: every job forks its processes before anything
// touches CUDA (a forked child cannot use a CUDA context of its parent), process 0 creates the
// unique id and hands it to the others through pipes, and each child checks its results and
// reports through its exit status (0 pass, 77 not enough GPUs, anything else a failure whose
// reason the child printed). Included by one test source each (its names are file-local).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kSkip = 77;

/// A child's failure: printed with its rank, then the child exits 1.
#define CHILD_CHECK(cond, ...)                                      \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                            \
      std::fprintf(stderr, "\n");                                   \
      std::fflush(stderr);                                          \
      _exit(1);                                                     \
    }                                                               \
  } while (0)
#define CHILD_CUDA(x)                                                                      \
  do {                                                                                     \
    const cudaError_t e_ = (x);                                                            \
    CHILD_CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                          \
  } while (0)
#define CHILD_NCCL(x)                                                                      \
  do {                                                                                     \
    const ncclResult_t r_ = (x);                                                           \
    CHILD_CHECK(r_ == ncclSuccess, "%s (%s)", ncclGetErrorString(r_), ncclGetLastError(nullptr)); \
  } while (0)

int g_rank = -1;

struct Job {
  int nprocs = 2;
  /// Runs in each child: `proc` index, `id` shared by all. Returns the exit status.
  std::function<int(int proc, const ncclUniqueId& id)> body;
  std::vector<std::string> env;  ///< "NAME=value" set in the children
  int timeout_s = 120;
};

/// Forks the job's processes; returns their exit statuses (-signal if killed).
std::vector<int> run_job(const Job& job) {
  std::vector<int> fds(static_cast<std::size_t>(2 * job.nprocs));
  for (int p = 0; p < job.nprocs; ++p)
    if (pipe(&fds[static_cast<std::size_t>(2 * p)]) != 0) return {};
  std::vector<pid_t> pids;
  for (int p = 0; p < job.nprocs; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      g_rank = p;
      for (const std::string& e : job.env) putenv(strdup(e.c_str()));
      ncclUniqueId id;
      if (p == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) {
          std::fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(nullptr));
          _exit(1);
        }
        for (int q = 1; q < job.nprocs; ++q)
          if (write(fds[static_cast<std::size_t>(2 * q + 1)], &id, sizeof(id)) != sizeof(id)) _exit(1);
      } else if (read(fds[static_cast<std::size_t>(2 * p)], &id, sizeof(id)) != sizeof(id)) {
        _exit(1);  // rank 0 died before sending the id
      }
      const int status = job.body(p, id);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  for (int fd : fds) close(fd);
  std::vector<int> status(static_cast<std::size_t>(job.nprocs), -1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(job.timeout_s);
  int left = job.nprocs;
  while (left > 0) {
    for (int p = 0; p < job.nprocs; ++p) {
      if (status[static_cast<std::size_t>(p)] != -1000) continue;
      int ws = 0;
      if (waitpid(pids[static_cast<std::size_t>(p)], &ws, WNOHANG) == pids[static_cast<std::size_t>(p)]) {
        status[static_cast<std::size_t>(p)] = WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int p = 0; p < job.nprocs; ++p)
        if (status[static_cast<std::size_t>(p)] == -1000) {
          kill(pids[static_cast<std::size_t>(p)], SIGKILL);
          waitpid(pids[static_cast<std::size_t>(p)], nullptr, 0);
          status[static_cast<std::size_t>(p)] = -SIGKILL;
        }
      ADD_FAILURE() << "the job did not finish within " << job.timeout_s << " s (killed)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

/// GTEST_SKIP when a child found too few GPUs; otherwise every child must have passed.
#define EXPECT_JOB_PASSED(statuses)                                                   \
  do {                                                                                \
    const std::vector<int> s_ = (statuses);                                           \
    ASSERT_FALSE(s_.empty()) << "could not start the job";                            \
    bool skipped_ = false;                                                            \
    for (int v : s_) skipped_ = skipped_ || v == kSkip;                               \
    if (skipped_) GTEST_SKIP() << "needs more CUDA devices than are visible";          \
    for (std::size_t p_ = 0; p_ < s_.size(); ++p_)                                    \
      EXPECT_EQ(s_[p_], 0) << "process " << p_ << " failed (see its output above)";   \
  } while (0)

int gpus_in_child() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace
