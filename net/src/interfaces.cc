#include "efccl/net/interfaces.h"

#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace efccl::net {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

bool Interface::link_local() const {
  return address.family() == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&address.v6.sin6_addr);
}

bool Interface::on_subnet(const SocketAddress& other) const {
  if (address.family() != other.family()) return false;
  if (other.family() == AF_INET) {
    const uint32_t m = netmask.v4.sin_addr.s_addr;
    return (address.v4.sin_addr.s_addr & m) == (other.v4.sin_addr.s_addr & m);
  }
  const auto* x = address.v6.sin6_addr.s6_addr;
  const auto* y = other.v6.sin6_addr.s6_addr;
  const auto* m = netmask.v6.sin6_addr.s6_addr;
  for (int b = 0; b < 16; ++b)
    if ((x[b] & m[b]) != (y[b] & m[b])) return false;
  return true;
}

std::string Interface::describe() const { return name + " " + address.host_string(); }

std::vector<Interface> list_interfaces(int family) {
  std::vector<Interface> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const int f = i->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    if (family != AF_UNSPEC && f != family) continue;
    const socklen_t len = f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    Interface it;
    it.name = i->ifa_name;
    it.flags = i->ifa_flags;
    it.address = SocketAddress::from(i->ifa_addr, len);
    if (i->ifa_netmask != nullptr) it.netmask = SocketAddress::from(i->ifa_netmask, len);
    out.push_back(std::move(it));
  }
  freeifaddrs(all);
  std::stable_sort(out.begin(), out.end(), [](const Interface& a, const Interface& b) {
    const auto key = [](const Interface& x) {
      return std::make_pair(x.address.family() == AF_INET6, x.link_local());
    };
    return key(a) < key(b);
  });
  return out;
}

bool interface_matches(std::string_view spec, std::string_view name) {
  bool exclude = false, exact = false;
  if (!spec.empty() && spec.front() == '^') {
    exclude = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    exact = true;
    spec.remove_prefix(1);
  }
  bool listed = false;
  while (!spec.empty() && !listed) {
    const std::size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    if (const std::size_t colon = item.find(':'); colon != std::string_view::npos)
      item = item.substr(0, colon);  // "eth0:port" (NCCL's list syntax): the name only
    if (!item.empty()) listed = exact ? name == item : starts_with(name, item);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return listed != exclude;
}

StatusOr<Interface> choose_interface(const SocketAddress* near) {
  const int family = socket_family_from_env();
  std::vector<Interface> all = list_interfaces(family);
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  const bool has_spec = spec != nullptr && *spec != '\0';
  std::vector<Interface> candidates;
  for (const Interface& i : all)
    if (!has_spec || interface_matches(spec, i.name)) candidates.push_back(i);
  if (candidates.empty()) {
    std::string seen;
    for (const Interface& i : all) seen += (seen.empty() ? "" : ", ") + i.describe();
    const std::string fam = family == AF_INET ? " IPv4" : family == AF_INET6 ? " IPv6" : "";
    if (has_spec)
      return Status::error(std::string("NCCL_SOCKET_IFNAME=") + spec +
                           " selects no network interface that is up with an" + fam +
                           " address (up: " + (seen.empty() ? "none" : seen) + ")");
    return Status::error("no network interface is up with an" + fam + " address");
  }
  if (near != nullptr)
    for (const Interface& i : candidates)
      if (i.on_subnet(*near)) return i;
  if (has_spec) return candidates.front();
  const auto virtual_bridge = [](const Interface& i) {
    return starts_with(i.name, "docker") || starts_with(i.name, "virbr");
  };
  for (const Interface& i : candidates)
    if ((i.flags & IFF_LOOPBACK) == 0 && !virtual_bridge(i)) return i;
  for (const Interface& i : candidates)
    if ((i.flags & IFF_LOOPBACK) == 0) return i;
  return candidates.front();
}

}  // namespace efccl::net
