// How the proxy transport uses the network, read from the environment as NCCL's socket
// transport reads it: NCCL_SOCKET_NTHREADS (proxy threads, 1..16) and NCCL_NSOCKS_PERTHREAD
// (sockets per thread and connection; threads x sockets at most 64). Unset (or -2), both are
// chosen from the interface's NIC as NCCL does (AWS ENA: 2 threads x 8 sockets; Google gVNIC:
// 4 x 1; otherwise 1 x 1). The interface comes from NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY
// (interfaces.h).
#pragma once

#include <chrono>
#include <string>

#include "efccl/common/status.h"
#include "efccl/net/interfaces.h"

namespace efccl::net {

struct ProxySettings {
  static constexpr int kMaxThreads = 16;
  static constexpr int kMaxSockets = 64;

  /// Where the proxy listens (any port) and from where it connects.
  Interface interface;
  int nthreads = 1;           ///< proxy threads
  int nsocks_per_thread = 1;  ///< a connection has nthreads * nsocks_per_thread sockets
  /// A peer that neither acknowledges sent bytes nor answers keepalive probes for this long is
  /// dead (TCP_USER_TIMEOUT and keepalive): a host that vanished without closing its sockets.
  std::chrono::milliseconds peer_timeout{60000};

  int sockets_per_connection() const { return nthreads * nsocks_per_thread; }

  /// The interface (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY) and the counts (NCCL_SOCKET_NTHREADS,
  /// NCCL_NSOCKS_PERTHREAD; a value out of bounds is clamped with a warning, an unreadable one
  /// warned about and the default used).
  static StatusOr<ProxySettings> from_environment();
  /// The counts for `interface` from the environment, as above.
  static ProxySettings for_interface(const Interface& interface);
  /// "2 threads x 8 sockets on eth0 10.0.0.1" (for logs).
  std::string describe() const;
};

}  // namespace efccl::net
