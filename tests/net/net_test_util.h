// Helpers of the net tests: environment and log scopes, raw sockets that play strangers, the
// bootstrap's frames as a stranger would write them, child processes (this test binary run
// again with a role in its environment), and counts of this process's threads and descriptors.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "efccl/common/log.h"
#include "efccl/net/unique_id.h"
#include "scoped_env.h"

extern char** environ;

namespace net_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

inline Clock::time_point in(Clock::duration d) { return Clock::now() + d; }

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using ::ScopedEnv;  // scoped_env.h

/// Collects log lines (every level) while alive.
class LogCapture {
 public:
  LogCapture() {
    efccl::set_log_sink([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    });
  }
  ~LogCapture() { efccl::set_log_sink(nullptr); }
  int count(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& l : lines_) n += contains(l, part) ? 1 : 0;
    return n;
  }
  std::vector<std::string> matching(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& l : lines_)
      if (contains(l, part)) out.push_back(l);
    return out;
  }
  /// Waits (up to `limit`) until at least `n` lines contain `part`.
  bool await(const std::string& part, int n, Clock::duration limit = seconds(5)) {
    const auto deadline = in(limit);
    while (count(part) < n && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
    return count(part) >= n;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

/// A blocking TCP connection to "ip:port" / "[ipv6]:port" (-1 on failure).
inline int connect_to(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  const std::string port = address.substr(address.rfind(':') + 1);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    close(fd);
    freeaddrinfo(found);
    return -1;
  }
  freeaddrinfo(found);
  return fd;
}

/// A frame as the bootstrap's wire format lays it out (magic, space, tag, length, type, 0).
inline std::string frame(uint64_t magic, uint32_t type, const std::string& payload,
                         uint64_t tag = 0) {
  std::string out(40, '\0');
  const uint64_t zero = 0, length = payload.size();
  const uint32_t reserved = 0;
  std::memcpy(out.data(), &magic, 8);
  std::memcpy(out.data() + 8, &zero, 8);
  std::memcpy(out.data() + 16, &tag, 8);
  std::memcpy(out.data() + 24, &length, 8);
  std::memcpy(out.data() + 32, &type, 4);
  std::memcpy(out.data() + 36, &reserved, 4);
  return out + payload;
}

/// A rank's hello to a root: version 1, `nranks`, `rank`, an IPv4 listen address.
inline std::string root_hello(uint32_t nranks, uint32_t rank, uint16_t port = 1) {
  std::string p(16 + 28, '\0');
  const uint32_t version = 1;
  std::memcpy(p.data(), &version, 4);
  std::memcpy(p.data() + 4, &nranks, 4);
  std::memcpy(p.data() + 8, &rank, 4);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::memcpy(p.data() + 16, &a, sizeof(a));
  return p;
}

inline uint64_t magic_of(const efccl::net::UniqueId& id) {
  uint64_t m;
  std::memcpy(&m, id.internal, 8);
  return m;
}

/// Writes all of `bytes` (false if the peer is gone).
inline bool write_all(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

/// Everything `fd` receives until the peer closes it (EOF or reset) or `limit` passes;
/// `*closed` says which.
inline std::string read_until_closed(int fd, Clock::duration limit, bool* closed) {
  const auto deadline = Clock::now() + limit;
  std::string got;
  char buf[4096];
  *closed = false;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      got.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      *closed = true;
      break;
    }
  }
  return got;
}

/// True once the other end closed `fd` (EOF or reset) within `limit`.
inline bool closed_by_peer(int fd, Clock::duration limit) {
  bool closed = false;
  read_until_closed(fd, limit, &closed);
  return closed;
}

/// A TCP port on 127.0.0.1 that was free a moment ago, chosen below the kernel's ephemeral
/// range (/proc/sys/net/ipv4/ip_local_port_range), so that no socket bound to port 0 in the
/// meantime (a bootstrap's own listener, another test's connection) can be given the same one:
/// a port from that range once made a test that listens on it later fail with "Address already
/// in use" (CI, 2026-11-28). Random within [low - 12000, low), checked free by binding.
inline int free_port() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  const int top = std::max(low, 2048);
  const int bottom = std::max(1024, top - 12000);
  static std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = bottom + static_cast<int>(rng() % static_cast<unsigned>(top - bottom));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return port;
  }
  // No free port found that way: the kernel's choice, as before.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

/// Entries in a /proc/self folder: "task" (threads) or "fd" (descriptors).
inline int count_entries(const char* folder) {
  DIR* d = opendir(folder);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}
inline int thread_count() { return count_entries("/proc/self/task"); }

/// Starts this test binary again with `vars` ("NAME=value") added to its environment; the
/// binary's static initializer sees its role there and never reaches main().
inline pid_t spawn_self(const std::vector<std::string>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.insert(env.end(), vars.begin(), vars.end());
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char arg0[] = "net_test_child";
  char* argv[] = {arg0, nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return pid;
}

/// The child's exit code, or -1 (killed) / -2 (still running after `limit`: killed now).
inline int wait_child(pid_t pid, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -3;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

/// Kills and reaps children the test did not wait for (a failed assertion left them running).
class ChildGuard {
 public:
  explicit ChildGuard(std::vector<pid_t>* pids) : pids_(pids) {}
  ~ChildGuard() {
    for (pid_t pid : *pids_) {
      int status;
      if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
  }

 private:
  std::vector<pid_t>* pids_;
};

/// The hex digits of an id (to pass it through the environment).
inline std::string to_hex(const efccl::net::UniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

inline efccl::net::UniqueId from_hex(const std::string& s) {
  efccl::net::UniqueId id;
  for (std::size_t i = 0; i < sizeof(id.internal) && 2 * i + 1 < s.size(); ++i)
    id.internal[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return id;
}

}  // namespace net_test
