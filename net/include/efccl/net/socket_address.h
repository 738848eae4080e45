// IPv4 and IPv6 socket addresses in the form the bootstrap puts on the wire and into the unique
// id: 28 bytes (sockaddr_in6's size), native byte order, every byte beyond the address zero, so
// that two processes that parse the same text produce the same bytes.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "efccl/common/status.h"

namespace efccl::net {

/// An IPv4 or IPv6 address and port (or nothing: family AF_UNSPEC).
struct SocketAddress {
  union {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  };

  SocketAddress() { std::memset(static_cast<void*>(this), 0, sizeof(*this)); }
  /// A copy of `length` bytes of `address` (at most sizeof(SocketAddress)); the rest zero.
  static SocketAddress from(const sockaddr* address, socklen_t length);

  /// How "host:port" text is turned into an address.
  enum class Lookup {
    kResolve,      ///< host names too (getaddrinfo may ask DNS)
    kNumericOnly,  ///< numeric addresses only: never blocks (text from peers)
  };
  /// Parses "host:port", "ipv4:port" or "[ipv6]:port" (NCCL_COMM_ID's syntax; a bare IPv6
  /// address is split at its last colon). `family`: AF_INET, AF_INET6 or AF_UNSPEC (either).
  static StatusOr<SocketAddress> parse(std::string_view text, int family = AF_UNSPEC,
                                       Lookup lookup = Lookup::kResolve);

  int family() const { return sa.sa_family; }
  /// AF_INET or AF_INET6 (the only families the bootstrap accepts).
  bool valid() const { return family() == AF_INET || family() == AF_INET6; }
  /// The length bind(2) and connect(2) take.
  socklen_t length() const {
    return family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  uint16_t port() const;
  void set_port(uint16_t port);
  /// "10.0.0.1:4242", "[fd00::2]:4242" (with "%ifname" for a scoped IPv6 address).
  std::string to_string() const;
  /// The address without the port: "10.0.0.1", "fd00::2".
  std::string host_string() const;
  /// Same family, address and port.
  bool operator==(const SocketAddress& other) const;
};
static_assert(sizeof(SocketAddress) == 28, "the wire format and the unique id hold 28 bytes");
static_assert(std::is_trivially_copyable_v<SocketAddress>);

/// NCCL_SOCKET_FAMILY: AF_INET, AF_INET6 (also ipv4/ipv6); unset: AF_UNSPEC. Another value is
/// warned about once and means AF_UNSPEC.
int socket_family_from_env();

/// Resolves "host:port", "ipv4:port" or "[ipv6]:port" (NCCL_COMM_ID's syntax) and prints the
/// address back in canonical form, e.g. "localhost:80" -> "127.0.0.1:80".
StatusOr<std::string> resolve_socket_address(std::string_view text);

}  // namespace efccl::net
