// TCP sockets with a deadline on every wait, shared by efccl-mprun (its rendezvous server) and
// the MPI shim (its rendezvous client and peer connections). Every call that can block takes a
// Deadline and fails with a Status saying what it waited for instead of hanging.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "efccl/common/status.h"

namespace efccl::mprun {

/// A point in time after which a wait gives up (steady clock); never() waits forever.
class Deadline {
 public:
  static Deadline after(std::chrono::milliseconds duration);
  static Deadline never() { return Deadline(); }

  bool is_never() const { return never_; }
  bool expired() const;
  /// poll(2)'s timeout argument: -1 for never, else the milliseconds left, at most `cap_ms`.
  int poll_ms(int cap_ms = 1 << 30) const;

 private:
  bool never_ = true;
  std::chrono::steady_clock::time_point at_{};
};

/// An owned file descriptor, closed when it goes.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

/// An IPv4 host (dotted quad) and a port.
struct Address {
  std::string host;
  uint16_t port = 0;

  std::string to_string() const;  ///< "host:port"
  /// Parses "host:port" (host a dotted-quad IPv4 address, port 1..65535).
  static StatusOr<Address> parse(std::string_view text);
};

/// A listening TCP socket bound to `host` (port 0: any free port); `*bound` receives the address.
StatusOr<Fd> listen_tcp(const std::string& host, uint16_t port, int backlog, Address* bound);
/// Accepts one connection, waiting until `deadline`.
StatusOr<Fd> accept_tcp(int listen_fd, Deadline deadline);
/// Connects to `to`, retrying refused connections until `deadline`.
StatusOr<Fd> connect_tcp(const Address& to, Deadline deadline);
/// The local address of a connected socket (the interface that reaches the peer).
StatusOr<Address> local_address(int fd);
/// A port that was free a moment ago on `host` (bound then released: may be taken later).
StatusOr<uint16_t> free_port(const std::string& host);

/// Sends all `size` bytes; fails when the peer closed or `deadline` passed.
Status send_all(int fd, const void* data, size_t size, Deadline deadline);
/// Receives exactly `size` bytes; fails on end of stream or when `deadline` passed.
Status recv_all(int fd, void* data, size_t size, Deadline deadline);
/// Receives one '\n'-terminated line (returned without it) of at most `max_size` bytes, reading
/// nothing beyond the newline.
StatusOr<std::string> recv_line(int fd, size_t max_size, Deadline deadline);

}  // namespace efccl::mprun
