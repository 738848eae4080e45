#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <set>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/fd.h"
#include "efccl/net/socket.h"
#include "environment.h"
#include "mps_daemon.h"
#include "rendezvous_server.h"

namespace efccl::mprun {
namespace {

using Clock = std::chrono::steady_clock;
using net::Fd;

constexpr size_t kMaxPendingLine = 64 * 1024;  // an unterminated line is flushed at this size
constexpr auto kKillWait = std::chrono::seconds(10);  // after SIGKILL, before giving up
constexpr auto kDrainWait = std::chrono::seconds(1);  // output still open after the last exit

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signal_count = 0;

void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone; nothing better to do with it
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void say(const std::string& line) { write_all(STDERR_FILENO, "efccl-mprun: " + line + "\n"); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           signal_name(WTERMSIG(status)) + ")" + (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with wait status " + std::to_string(status);
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/// A rank's output stream as whole lines, each prefixed "[rank] ".
class LineForwarder {
 public:
  LineForwarder(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_(out_fd) {}

  void feed(const char* data, size_t size) {
    pending_.append(data, size);
    std::string lines;
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1)
      lines += prefix_ + pending_.substr(start, nl + 1 - start);
    pending_.erase(0, start);
    if (pending_.size() >= kMaxPendingLine) {  // no newline in sight: pass it on in pieces
      lines += prefix_ + pending_ + "\n";
      pending_.clear();
    }
    if (!lines.empty()) write_all(out_, lines);
  }

  /// End of stream: an unterminated last line is still a line.
  void finish() {
    if (!pending_.empty()) write_all(out_, prefix_ + pending_ + "\n");
    pending_.clear();
  }

 private:
  std::string prefix_;
  int out_;
  std::string pending_;
};

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool stopped_by_launcher = false;  ///< signalled by us before it ended
  Fd out, err;                       ///< read ends of its stdout and stderr
  std::optional<LineForwarder> out_lines, err_lines;
};

std::string random_job_key() {
  std::random_device device;
  std::uniform_int_distribution<unsigned long long> dist;
  char text[40];
  std::snprintf(text, sizeof(text), "%016llx%016llx", dist(device), dist(device));
  return text;
}

Status make_pipe(Fd* read_end, Fd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return Status::error(std::string("pipe: ") + std::strerror(errno));
  read_end->reset();
  *read_end = Fd(fds[0]);
  *write_end = Fd::untracked(fds[1]);  // the child dup2()s it after fork: not to be released
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return Status::ok();
}

/// Forks rank `r` running `command` with `env`; its stdout and stderr go to new pipes.
Status spawn(Rank& r, const std::vector<std::string>& command,
             const std::vector<std::string>& env) {
  Fd out_write, err_write;
  if (Status s = make_pipe(&r.out, &out_write); !s) return s;
  if (Status s = make_pipe(&r.err, &err_write); !s) return s;
  std::vector<char*> argv, envp;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The child: its own process group (so stopping it reaches its children too), stdin from
    // /dev/null, stdout and stderr into the pipes, default signal dispositions.
    ::setpgid(0, 0);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_write.get(), STDOUT_FILENO);
    ::dup2(err_write.get(), STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    const std::string why =
        "efccl-mprun: cannot execute '" + command[0] + "': " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, why);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first
  r.pid = pid;
  r.running = true;
  return Status::ok();
}

/// Signals the process group of `r` (its children too), or the process alone when the group
/// is gone.
void signal_rank(const Rank& r, int sig) {
  if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
}

std::string running_list(const std::vector<Rank>& ranks) {
  std::string list;
  for (const Rank& r : ranks)
    if (r.running) list += (list.empty() ? "" : ", ") + std::to_string(r.index);
  return list;
}

}  // namespace

int run_job(const LaunchOptions& o) {
  const auto start = Clock::now();
  const int n = o.nranks;

  // Signals: the first stops the job, a second one kills it at once.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  // Where rank 0 publishes an ncclUniqueId.
  std::filesystem::path temp_dir;
  std::string id_file = o.id_file;
  if (id_file.empty() || o.mps) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/efccl-mprun.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      say("cannot create a temporary folder from " + pattern + ": " + std::strerror(errno));
      return kExitLaunchError;
    }
    temp_dir = pattern;
    if (id_file.empty()) id_file = (temp_dir / "unique_id").string();
  }
  if (!o.id_file.empty()) {
    std::error_code ec;
    std::filesystem::remove(id_file, ec);  // a stale id from an earlier job would mislead ranks
  }
  struct TempDirCleanup {
    std::filesystem::path dir;
    ~TempDirCleanup() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{temp_dir};
  // --mps: a private MPS control daemon, stopped before the folder it lives in is removed.
  std::optional<MpsDaemon> mps;
  if (o.mps) {
    auto started = MpsDaemon::start(temp_dir);
    if (!started) {
      say(started.status().message());
      return kExitLaunchError;
    }
    mps.emplace(std::move(*started));
  }

  const std::string job = random_job_key();
  auto server = RendezvousServer::start(n, job);
  if (!server) {
    say(server.status().message());
    return kExitLaunchError;
  }
  auto master_port = net::free_port(server->address());
  if (!master_port) {
    say("cannot find a free port for MASTER_PORT: " + master_port.status().message());
    return kExitLaunchError;
  }

  std::vector<Rank> ranks(static_cast<size_t>(n));
  bool stopping = false;
  bool kill_sent = false;
  int exit_code = 0;
  std::string failure;
  Clock::time_point term_deadline{}, kill_deadline{};
  std::optional<Clock::time_point> drain_deadline;

  auto stop = [&](const std::string& why, int code) {
    if (stopping) return;
    stopping = true;
    failure = why;
    exit_code = code != 0 ? code : 1;
    const std::string running = running_list(ranks);
    say(why + (running.empty() ? "" : "; stopping rank(s) " + running + " (SIGTERM)"));
    for (Rank& r : ranks) {
      if (!r.running) continue;
      r.stopped_by_launcher = true;
      signal_rank(r, SIGTERM);
    }
    term_deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.grace_s * 1000));
  };

  char machine[256] = {};
  gethostname(machine, sizeof(machine) - 1);
  for (Rank& r : ranks) {
    r.index = static_cast<int>(&r - ranks.data());
    const std::string rank = std::to_string(r.index), size = std::to_string(n);
    // --hosts K: the ranks of host h are its "local" ranks, as torchrun's on K nodes.
    int local_rank = r.index, local_size = n;
    if (o.hosts > 0) {
      const int h = host_of(r.index, n, o.hosts);
      int first = r.index, end = r.index + 1;
      while (first > 0 && host_of(first - 1, n, o.hosts) == h) --first;
      while (end < n && host_of(end, n, o.hosts) == h) ++end;
      local_rank = r.index - first;
      local_size = end - first;
    }
    std::vector<std::pair<std::string, std::string>> vars = {
        {kEnvRank, rank},
        {kEnvSize, size},
        {kEnvAddr, server->address().to_string()},
        {kEnvJob, job},
        {kEnvIdFile, id_file},
        {"RANK", rank},
        {"WORLD_SIZE", size},
        {"LOCAL_RANK", std::to_string(local_rank)},
        {"LOCAL_WORLD_SIZE", std::to_string(local_size)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(*master_port)}};
    if (o.hosts > 0) {
      const std::string h = std::to_string(host_of(r.index, n, o.hosts));
      vars.push_back({"NCCL_HOSTID", std::string(machine) + "/mprun-host" + h});
      vars.push_back({"EFCCL_MPRUN_HOST", h});
      vars.push_back({"EFCCL_MPRUN_HOSTS", std::to_string(o.hosts)});
      vars.push_back({"GROUP_RANK", h});
    }
    if (mps)
      for (auto& kv : mps->environment()) vars.push_back(std::move(kv));
    const auto env = environment_with(vars);
    r.out_lines.emplace("[" + rank + "] ", STDOUT_FILENO);
    r.err_lines.emplace("[" + rank + "] ", STDERR_FILENO);
    if (Status s = spawn(r, o.command, env); !s) {
      stop("cannot start rank " + rank + ": " + s.message(), kExitLaunchError);
      break;
    }
  }

  std::vector<pollfd> polled;
  std::vector<RendezvousServer::Event> events;
  auto report_events = [&] {
    for (const auto& e : events) {
      if (e.kind == RendezvousServer::Event::Kind::kAbort)
        stop("rank " + std::to_string(e.rank) + " called MPI_Abort with errorcode " +
                 std::to_string(e.errorcode),
             e.errorcode > 0 && e.errorcode < 256 ? e.errorcode : 1);
      else
        say(e.text);
    }
    events.clear();
  };
  // What the server's connections already hold, handled now: a rank that called MPI_Abort
  // wrote its abort line before exiting, so when its exit is seen the line has arrived, and the
  // job's failure is the abort, not the exit that followed it.
  auto drain_server = [&] {
    std::vector<pollfd> fds;
    for (int fd : server->fds()) fds.push_back({fd, POLLIN, 0});
    if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0)
      for (const pollfd& p : fds)
        if (p.revents != 0) server->handle(p.fd, &events);
    server->tick(&events);
    report_events();
  };
  int handled_signals = 0;
  for (;;) {
    const bool any_running = !running_list(ranks).empty();
    bool any_output = false;
    for (const Rank& r : ranks) any_output = any_output || r.out.valid() || r.err.valid();
    if (!any_running) {
      if (!drain_deadline) drain_deadline = Clock::now() + kDrainWait;
      // Output may stay open in a rank's own children; wait a little for it, not forever.
      if (!any_output || Clock::now() >= *drain_deadline) break;
    }

    polled.clear();
    for (const Rank& r : ranks) {
      if (r.out.valid()) polled.push_back({r.out.get(), POLLIN, 0});
      if (r.err.valid()) polled.push_back({r.err.get(), POLLIN, 0});
    }
    const size_t first_server_fd = polled.size();
    for (int fd : server->fds()) polled.push_back({fd, POLLIN, 0});
    const int ready = ::poll(polled.data(), polled.size(), 100);  // wakes for signals, children

    if (ready > 0) {
      for (size_t i = 0; i < polled.size(); ++i) {
        if (polled[i].revents == 0) continue;
        if (i >= first_server_fd) {
          server->handle(polled[i].fd, &events);
          continue;
        }
        for (Rank& r : ranks) {
          for (auto [fd, lines] :
               {std::pair{&r.out, &*r.out_lines}, std::pair{&r.err, &*r.err_lines}}) {
            if (!fd->valid() || fd->get() != polled[i].fd) continue;
            char buf[65536];
            const ssize_t got = ::read(fd->get(), buf, sizeof(buf));
            if (got > 0) {
              lines->feed(buf, static_cast<size_t>(got));
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
              lines->finish();
              fd->reset();
            }
          }
        }
      }
    }
    server->tick(&events);
    report_events();

    // Children that ended.
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (Rank& r : ranks) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.status = status;
        if (!succeeded(status) && !r.stopped_by_launcher) {
          drain_server();
          stop("rank " + std::to_string(r.index) + " (pid " + std::to_string(pid) + ") " +
                   describe_status(status),
               exit_code_of(status));
        }
      }
    }

    const auto now = Clock::now();
    if (g_signal_count > handled_signals) {
      handled_signals = g_signal_count;
      if (!stopping) {
        stop("received " + signal_name(g_signal), 128 + g_signal);
      } else if (!kill_sent) {
        term_deadline = now;  // asked twice: no more grace
      }
    }
    if (!stopping && o.timeout_s > 0 &&
        now - start >= std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000)))
      stop("timeout: " + seconds_text(o.timeout_s) + " s passed with rank(s) " +
               running_list(ranks) + " still running",
           kExitTimeout);
    if (stopping && !kill_sent && now >= term_deadline && any_running) {
      const std::string running = running_list(ranks);
      if (!running.empty()) {
        say("rank(s) " + running + " still running after " + seconds_text(o.grace_s) +
            " s of grace; sending SIGKILL");
        for (Rank& r : ranks)
          if (r.running) signal_rank(r, SIGKILL);
      }
      kill_sent = true;
      kill_deadline = now + kKillWait;
    }
    if (kill_sent && now >= kill_deadline && !running_list(ranks).empty()) {
      for (const Rank& r : ranks)
        if (r.running)
          say("rank " + std::to_string(r.index) + " (pid " + std::to_string(r.pid) +
              ") did not end after SIGKILL; giving up on it");
      break;
    }
  }

  server->finish(&events);
  for (const auto& e : events) say(e.text);
  if (mps)
    if (Status s = mps->stop(); !s) say(s.message());
  if (exit_code != 0) {
    say("job failed: " + failure);
    for (const Rank& r : ranks) {
      std::string what = r.pid < 0   ? "not started"
                         : r.running ? "still running (pid " + std::to_string(r.pid) + ")"
                                     : describe_status(r.status);
      if (r.stopped_by_launcher && !r.running && WIFSIGNALED(r.status))
        what += " (stopped by efccl-mprun)";
      say("  rank " + std::to_string(r.index) + ": " + what);
    }
  }
  return exit_code;
}

}  // namespace efccl::mprun
