#include "mps_daemon.h"

#include "environment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

namespace efccl::mprun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kControl = "nvidia-cuda-mps-control";

/// Runs `kControl args` with the daemon's variables set and `input` on its stdin; its output
/// goes to `log`. Waits at most `timeout_s`, then kills it. Its exit status, or an error.
StatusOr<int> run_control(const std::vector<std::string>& args,
                          const std::vector<std::pair<std::string, std::string>>& vars,
                          const std::string& input, const std::filesystem::path& log,
                          double timeout_s) {
  const std::vector<std::string> env = environment_with(vars);
  std::vector<char*> argv{const_cast<char*>(kControl)}, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::error(std::string("pipe: ") + std::strerror(errno));
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(in[0]);
    ::close(in[1]);
    if (out >= 0) ::close(out);
    return Status::error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    ::signal(SIGPIPE, SIG_DFL);
    ::execvpe(kControl, argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  if (out >= 0) ::close(out);
  if (!input.empty()) (void)!::write(in[1], input.data(), input.size());
  ::close(in[1]);
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
    if (done < 0 && errno != EINTR) return Status::error(std::string("waitpid: ") + std::strerror(errno));
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Status::error(std::string(kControl) + " did not finish within " +
                           std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool wait_for(const std::function<bool()>& done, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> MpsDaemon::environment() const {
  return {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir_.string()},
          {"CUDA_MPS_LOG_DIRECTORY", log_dir_.string()}};
}

StatusOr<MpsDaemon> MpsDaemon::start(const std::filesystem::path& folder, double timeout_s) {
  MpsDaemon d;
  std::error_code ec;
  const auto pipe_dir = folder / "mps-pipe";
  const auto log_dir = folder / "mps-log";
  std::filesystem::create_directories(pipe_dir, ec);
  if (!ec) std::filesystem::create_directories(log_dir, ec);
  if (ec) return Status::error("cannot create the MPS folders under " + folder.string() + ": " +
                               ec.message());
  d.pipe_dir_ = pipe_dir;
  d.log_dir_ = log_dir;
  auto rc = run_control({"-d"}, d.environment(), "", log_dir / "launcher.log", timeout_s);
  if (!rc) {
    d.pipe_dir_.clear();
    return Status::error("starting the MPS control daemon: " + rc.status().message());
  }
  if (*rc == 127) {
    d.pipe_dir_.clear();
    return Status::error(std::string("cannot start the MPS control daemon: ") + kControl +
                         " is not in PATH (it comes with the NVIDIA driver)");
  }
  if (*rc != 0) {
    d.pipe_dir_.clear();
    return Status::error(std::string(kControl) + " -d exited with status " + std::to_string(*rc) +
                         " (its output: " + (log_dir / "launcher.log").string() + ")");
  }
  const auto control = pipe_dir / "control";
  if (!wait_for([&] { return std::filesystem::exists(control); }, timeout_s)) {
    (void)d.stop(1);
    d.pipe_dir_.clear();
    return Status::error("the MPS control daemon did not create " + control.string() + " within " +
                         std::to_string(static_cast<int>(timeout_s)) + " s (its log: " +
                         log_dir.string() + ")");
  }
  return d;
}

Status MpsDaemon::stop(double timeout_s) {
  if (pipe_dir_.empty()) return Status::ok();
  const auto pipe_dir = pipe_dir_;
  pipe_dir_.clear();
  auto rc = run_control({}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir.string()},
                             {"CUDA_MPS_LOG_DIRECTORY", log_dir_.string()}},
                        "quit\n", log_dir_ / "launcher.log", timeout_s);
  if (!rc) return Status::error("stopping the MPS control daemon: " + rc.status().message());
  const auto control = pipe_dir / "control";
  if (!wait_for([&] { return !std::filesystem::exists(control); }, timeout_s))
    return Status::error("the MPS control daemon (" + pipe_dir.string() +
                         ") was told to quit but its control pipe is still there after " +
                         std::to_string(static_cast<int>(timeout_s)) + " s");
  return Status::ok();
}

}  // namespace efccl::mprun
