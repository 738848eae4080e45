#include "efccl/mprun/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

namespace efccl::mprun {
namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string timeout_text(const char* what) { return std::string("timed out ") + what; }

StatusOr<sockaddr_in> to_sockaddr(const std::string& host, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    return Status::error("'" + host + "' is not an IPv4 address (expected a dotted quad)");
  return sa;
}

/// Waits until `fd` is ready for `events`; false (with *why) on timeout or poll failure.
Status wait_ready(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, deadline.poll_ms());
    if (n > 0) return Status::ok();  // readable, writable, or an error the next call reports
    if (n == 0) return Status::error(timeout_text(what));
    if (errno != EINTR) return Status::error(errno_text("poll"));
  }
}

}  // namespace

Deadline Deadline::after(std::chrono::milliseconds duration) {
  Deadline d;
  d.never_ = false;
  d.at_ = std::chrono::steady_clock::now() + duration;
  return d;
}

bool Deadline::expired() const { return !never_ && std::chrono::steady_clock::now() >= at_; }

int Deadline::poll_ms(int cap_ms) const {
  if (never_) return cap_ms >= (1 << 30) ? -1 : cap_ms;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(at_ - std::chrono::steady_clock::now())
          .count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left + 1, cap_ms));
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string Address::to_string() const { return host + ":" + std::to_string(port); }

StatusOr<Address> Address::parse(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos)
    return Status::error("address '" + std::string(text) + "' is not host:port");
  Address a;
  a.host = std::string(text.substr(0, colon));
  const std::string_view port = text.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535)
    return Status::error("address '" + std::string(text) + "': port must be 1..65535");
  a.port = static_cast<uint16_t>(value);
  if (auto sa = to_sockaddr(a.host, a.port); !sa)
    return Status::error("address '" + std::string(text) + "': " + sa.status().message());
  return a;
}

StatusOr<Fd> listen_tcp(const std::string& host, uint16_t port, int backlog, Address* bound) {
  auto sa = to_sockaddr(host, port);
  if (!sa) return sa.status();
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::error(errno_text("socket"));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(*sa)) != 0)
    return Status::error(errno_text(("bind " + host + ":" + std::to_string(port)).c_str()));
  if (::listen(fd.get(), backlog) != 0) return Status::error(errno_text("listen"));
  if (bound != nullptr) {
    auto local = local_address(fd.get());
    if (!local) return local.status();
    *bound = *local;
  }
  return fd;
}

StatusOr<Fd> accept_tcp(int listen_fd, Deadline deadline) {
  for (;;) {
    if (Status s = wait_ready(listen_fd, POLLIN, deadline, "waiting for a connection"); !s)
      return s;
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) {
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      return Status::error(errno_text("accept"));
  }
}

StatusOr<Fd> connect_tcp(const Address& to, Deadline deadline) {
  auto sa = to_sockaddr(to.host, to.port);
  if (!sa) return sa.status();
  const std::string what = "connect " + to.to_string();
  for (;;) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return Status::error(errno_text("socket"));
    int err = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(*sa)) != 0) {
      if (errno != EINPROGRESS) {
        err = errno;
      } else {
        const std::string waiting = "connecting to " + to.to_string();
        if (Status s = wait_ready(fd.get(), POLLOUT, deadline, waiting.c_str()); !s) return s;
        socklen_t len = sizeof(err);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) {
      const int flags = ::fcntl(fd.get(), F_GETFL);
      ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    if ((err != ECONNREFUSED && err != EAGAIN && err != ETIMEDOUT) || deadline.expired())
      return Status::error(what + ": " + std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // not listening yet: retry
  }
}

StatusOr<Address> local_address(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return Status::error(errno_text("getsockname"));
  char host[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
  return Address{host, ntohs(sa.sin_port)};
}

StatusOr<uint16_t> free_port(const std::string& host) {
  Address bound;
  auto fd = listen_tcp(host, 0, 1, &bound);
  if (!fd) return fd.status();
  return bound.port;
}

Status send_all(int fd, const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Status s = wait_ready(fd, POLLOUT, deadline, "sending"); !s) return s;
      continue;
    }
    return Status::error(errno_text("send"));
  }
  return Status::ok();
}

Status recv_all(int fd, void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    if (Status s = wait_ready(fd, POLLIN, deadline, "receiving"); !s) return s;
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status::error("the connection was closed by the other side");
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    return Status::error(errno_text("recv"));
  }
  return Status::ok();
}

StatusOr<std::string> recv_line(int fd, size_t max_size, Deadline deadline) {
  std::string line;
  char buf[4096];
  for (;;) {
    if (Status s = wait_ready(fd, POLLIN, deadline, "receiving a line"); !s) return s;
    // Peek, then consume only up to the newline: whatever follows is not ours to read.
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return Status::error("the connection was closed by the other side");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Status::error(errno_text("recv"));
    }
    const void* nl = std::memchr(buf, '\n', static_cast<size_t>(n));
    const size_t take = nl != nullptr ? static_cast<const char*>(nl) - buf + 1 : n;
    if (Status s = recv_all(fd, buf, take, deadline); !s) return s;
    line.append(buf, nl != nullptr ? take - 1 : take);
    if (line.size() > max_size)
      return Status::error("line longer than " + std::to_string(max_size) + " bytes");
    if (nl != nullptr) return line;
  }
}

}  // namespace efccl::mprun
