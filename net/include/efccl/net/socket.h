// TCP sockets. Every descriptor is close-on-exec and non-blocking, every write uses MSG_NOSIGNAL
// (no SIGPIPE), and every call that waits takes a Deadline (and, where a caller may need to
// stop it early, an abort flag) and fails with a Status saying what it waited for.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/fd.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

/// Disables Nagle's algorithm (small frames go out at once).
void set_nodelay(int fd);
/// The pending error of a socket (SO_ERROR; 0: none), e.g. the result of a non-blocking connect.
int socket_error(int fd);
/// strerror(error) as a string.
std::string errno_text(int error);

/// A listening socket on `address` (port 0: any free port); `*bound` receives the address it got.
StatusOr<Fd> listen_on(const SocketAddress& address, bool reuse_address, SocketAddress* bound,
                       int backlog = SOMAXCONN);

/// Starts a non-blocking connect to `to`; `*error` receives an errno value (0: in progress or
/// connected: poll for POLLOUT, then socket_error()).
Fd start_connect(const SocketAddress& to, int* error);

/// Connects to `to`, retrying while it refuses (nobody listens yet) until `deadline` or `*abort`.
StatusOr<Fd> connect_to(const SocketAddress& to, Deadline deadline,
                        const std::atomic<bool>* abort = nullptr);

/// The one accept loop: accepts the connections waiting on the non-blocking `listener` (at most
/// `max`), each non-blocking, close-on-exec and with TCP_NODELAY, and hands each to
/// `on_accepted` with the peer's address. Fails (with errno's text) when accept fails for
/// another reason than an empty queue, e.g. out of descriptors: the listener stays readable
/// then, so the caller should leave it alone for a moment instead of polling it again at once.
Status accept_pending(
    int listener, const std::function<void(Fd connection, const SocketAddress& from)>& on_accepted,
    std::size_t max = static_cast<std::size_t>(-1));

/// The local address of a socket (for a connected one: the interface that reaches the peer).
StatusOr<SocketAddress> local_address(int fd);
/// A port that was free a moment ago on `host`'s address (bound then released: may be taken
/// later), chosen below the kernel's ephemeral range (ip_local_port_range) where there is room,
/// so that no outgoing connection's local port takes it meanwhile.
StatusOr<uint16_t> free_port(const SocketAddress& host);
/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
uint16_t first_ephemeral_port();

/// Sends all `size` bytes; fails when the peer closed or `deadline` passed.
Status send_all(int fd, const void* data, std::size_t size, Deadline deadline);
/// Receives exactly `size` bytes; fails on end of stream or when `deadline` passed.
Status recv_all(int fd, void* data, std::size_t size, Deadline deadline);
/// Receives one '\n'-terminated line (returned without it) of at most `max_size` bytes, reading
/// nothing beyond the newline.
StatusOr<std::string> recv_line(int fd, std::size_t max_size, Deadline deadline);

}  // namespace efccl::net
