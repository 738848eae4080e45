// The host's network interfaces, and the one the bootstrap uses, chosen as NCCL chooses it:
// NCCL_SOCKET_IFNAME ("eth,ib" prefixes, "^docker" excludes, "=eth0" exact names) and
// NCCL_SOCKET_FAMILY (AF_INET or AF_INET6).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

/// One address of an interface that is up.
struct Interface {
  std::string name;
  SocketAddress address;
  SocketAddress netmask;
  unsigned flags = 0;  ///< IFF_* (IFF_LOOPBACK, ...)

  bool link_local() const;
  /// Whether `other` is on this interface's subnet.
  bool on_subnet(const SocketAddress& other) const;
  /// "eth0 10.0.0.1" (for messages).
  std::string describe() const;
};

/// The addresses of interfaces that are up (of `family`, or both for AF_UNSPEC), IPv4 before
/// IPv6, link-local IPv6 last.
std::vector<Interface> list_interfaces(int family);

/// Whether interface `name` is selected by an NCCL_SOCKET_IFNAME value (`spec`): a comma list
/// of prefixes, "^" before the list excludes instead, "=" before it asks for exact names.
bool interface_matches(std::string_view spec, std::string_view name);

/// The interface whose address the ranks use: NCCL_SOCKET_IFNAME's (else NCCL's default order:
/// not loopback nor docker/virbr, then docker/virbr, then loopback), preferring one on the
/// subnet of `near` (the root) when given.
StatusOr<Interface> choose_interface(const SocketAddress* near);

}  // namespace efccl::net
