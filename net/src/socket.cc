#include "efccl/net/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

namespace efccl::net {
namespace {

constexpr int kAbortCheckMs = 10;  // abort flags are checked this often

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

/// Waits until `fd` is ready for `events`; fails on timeout (naming `what`) or a poll failure.
Status wait_ready(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, deadline.poll_ms());
    if (n > 0) return Status::ok();  // ready, or an error the next call reports
    if (n == 0) return Status::error(std::string("timed out ") + what);
    if (errno != EINTR) return Status::error("poll(): " + errno_text(errno));
  }
}

}  // namespace

std::string errno_text(int error) { return std::strerror(error); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int socket_error(int fd) {
  int e = 0;
  socklen_t len = sizeof(e);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) return errno;
  return e;
}

StatusOr<Fd> listen_on(const SocketAddress& address, bool reuse_address, SocketAddress* bound,
                       int backlog) {
  if (!address.valid())
    return Status::error("cannot listen on " + address.to_string() + ": not an IP address");
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::error("socket(): " + errno_text(errno));
  int one = 1;
  if (reuse_address) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), &address.sa, address.length()) != 0)
    return Status::error("cannot listen on " + address.to_string() + ": " + errno_text(errno));
  if (::listen(fd.get(), backlog) != 0)
    return Status::error("listen() on " + address.to_string() + ": " + errno_text(errno));
  if (bound != nullptr) {
    auto local = local_address(fd.get());
    if (!local) return local.status();
    *bound = *local;
  }
  return fd;
}

Fd start_connect(const SocketAddress& to, int* error) {
  Fd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    *error = errno;
    return fd;
  }
  *error = 0;
  if (::connect(fd.get(), &to.sa, to.length()) != 0 && errno != EINPROGRESS) {
    *error = errno;
    fd.reset();
  }
  return fd;
}

StatusOr<Fd> connect_to(const SocketAddress& to, Deadline deadline,
                        const std::atomic<bool>* abort) {
  const std::string what = "connecting to " + to.to_string();
  for (;;) {
    int error = 0;
    Fd fd = start_connect(to, &error);
    while (error == 0) {
      pollfd p{fd.get(), POLLOUT, 0};
      const int n = ::poll(&p, 1, deadline.poll_ms(kAbortCheckMs));
      if (n > 0) {
        error = socket_error(fd.get());
        if (error == 0) {
          set_nodelay(fd.get());
          return fd;
        }
        break;
      }
      if (n < 0 && errno != EINTR) return Status::error(what + ": poll(): " + errno_text(errno));
      if (aborted(abort)) return Status::error("aborted " + what);
      if (deadline.expired()) return Status::error("timed out " + what);
    }
    const bool retry = error == ECONNREFUSED || error == EAGAIN || error == ETIMEDOUT ||
                       error == ECONNRESET || error == EINTR;
    if (!retry || deadline.expired()) return Status::error(what + ": " + errno_text(error));
    if (aborted(abort)) return Status::error("aborted " + what);
    // Nobody listens yet: try again shortly (bounded by the deadline).
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(20, std::max(0, deadline.poll_ms(20)))));
  }
}

Status accept_pending(
    int listener, const std::function<void(Fd connection, const SocketAddress& from)>& on_accepted,
    std::size_t max) {
  for (std::size_t accepted = 0; accepted < max;) {
    SocketAddress from;
    socklen_t len = sizeof(from);
    const int fd = ::accept4(listener, &from.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return Status::error("accept(): " + errno_text(errno));
    }
    Fd connection(fd);
    set_nodelay(fd);
    ++accepted;
    on_accepted(std::move(connection), from);
  }
  return Status::ok();
}

StatusOr<SocketAddress> local_address(int fd) {
  SocketAddress a;
  socklen_t len = sizeof(a);
  if (::getsockname(fd, &a.sa, &len) != 0)
    return Status::error("getsockname(): " + errno_text(errno));
  return a;
}

uint16_t first_ephemeral_port() {
  constexpr uint16_t kLinuxDefault = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  long low = 0, high = 0;
  if (!(range >> low >> high) || low < 1 || low > 65535) return kLinuxDefault;
  return static_cast<uint16_t>(low);
}

StatusOr<uint16_t> free_port(const SocketAddress& host) {
  // Below the kernel's ephemeral range where there is room: the port bound here is released
  // before the job binds it again, and a port in that range may meanwhile become the local
  // port of any outgoing connection on the host (efccl-mprun's ranks connect to each other
  // while rank 0 starts torch's store on MASTER_PORT: EADDRINUSE).
  constexpr uint16_t kLowest = 10000;
  const uint16_t ephemeral = first_ephemeral_port();
  if (ephemeral > kLowest + 1) {
    std::random_device rd;
    std::uniform_int_distribution<int> pick(kLowest, ephemeral - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      SocketAddress at = host;
      at.set_port(static_cast<uint16_t>(pick(rd)));
      SocketAddress bound;
      if (auto fd = listen_on(at, true, &bound, 1)) return bound.port();
    }
  }
  SocketAddress any_port = host;
  any_port.set_port(0);
  SocketAddress bound;
  auto fd = listen_on(any_port, true, &bound, 1);
  if (!fd) return fd.status();
  return bound.port();
}

Status send_all(int fd, const void* data, std::size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Status s = wait_ready(fd, POLLOUT, deadline, "sending"); !s) return s;
      continue;
    }
    return Status::error("send(): " + errno_text(errno));
  }
  return Status::ok();
}

Status recv_all(int fd, void* data, std::size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return Status::error("the connection was closed by the other side");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::error("recv(): " + errno_text(errno));
    if (Status s = wait_ready(fd, POLLIN, deadline, "receiving"); !s) return s;
  }
  return Status::ok();
}

StatusOr<std::string> recv_line(int fd, std::size_t max_size, Deadline deadline) {
  std::string line;
  char buf[4096];
  for (;;) {
    // Peek, then consume only up to the newline: whatever follows is not ours to read.
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return Status::error("the connection was closed by the other side");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return Status::error("recv(): " + errno_text(errno));
      if (Status s = wait_ready(fd, POLLIN, deadline, "receiving a line"); !s) return s;
      continue;
    }
    const void* nl = std::memchr(buf, '\n', static_cast<std::size_t>(n));
    const std::size_t take = nl != nullptr
                                 ? static_cast<std::size_t>(static_cast<const char*>(nl) - buf) + 1
                                 : static_cast<std::size_t>(n);
    if (Status s = recv_all(fd, buf, take, deadline); !s) return s;
    line.append(buf, nl != nullptr ? take - 1 : take);
    if (line.size() > max_size)
      return Status::error("a line longer than " + std::to_string(max_size) + " bytes");
    if (nl != nullptr) return line;
  }
}

}  // namespace efccl::net
