#include "efccl/net/socket_address.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "efccl/common/log.h"

namespace efccl::net {

SocketAddress SocketAddress::from(const sockaddr* address, socklen_t length) {
  SocketAddress a;
  std::memcpy(static_cast<void*>(&a), address,
              std::min<std::size_t>(length, sizeof(SocketAddress)));
  return a;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET6) return ntohs(v6.sin6_port);
  if (family() == AF_INET) return ntohs(v4.sin_port);
  return 0;
}

void SocketAddress::set_port(uint16_t port) {
  if (family() == AF_INET6)
    v6.sin6_port = htons(port);
  else
    v4.sin_port = htons(port);
}

std::string SocketAddress::host_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof(buf));
    return buf;
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof(buf));
    std::string host = buf;
    // The scope as a number: getaddrinfo takes an interface name only for link-local
    // addresses, and what is written here must parse back (the mprun PEERS line).
    if (v6.sin6_scope_id != 0) host += "%" + std::to_string(v6.sin6_scope_id);
    return host;
  }
  return "<address of family " + std::to_string(family()) + ">";
}

std::string SocketAddress::to_string() const {
  if (family() == AF_INET) return host_string() + ":" + std::to_string(port());
  if (family() == AF_INET6) return "[" + host_string() + "]:" + std::to_string(port());
  return host_string();
}

bool SocketAddress::operator==(const SocketAddress& other) const {
  if (family() != other.family()) return false;
  if (family() == AF_INET)
    return v4.sin_port == other.v4.sin_port && v4.sin_addr.s_addr == other.v4.sin_addr.s_addr;
  if (family() == AF_INET6)
    return v6.sin6_port == other.v6.sin6_port && v6.sin6_scope_id == other.v6.sin6_scope_id &&
           std::memcmp(&v6.sin6_addr, &other.v6.sin6_addr, sizeof(v6.sin6_addr)) == 0;
  return true;
}

StatusOr<SocketAddress> SocketAddress::parse(std::string_view text, int family, Lookup lookup) {
  const auto quoted = [&] { return "'" + std::string(text) + "'"; };
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return Status::error(quoted() + ": '[' without ']'");
    host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (rest.size() < 2 || rest.front() != ':')
      return Status::error(quoted() + " has no ':port' after the address");
    port = std::string(rest.substr(1));
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
      return Status::error(quoted() + " is not host:port, ipv4:port or [ipv6]:port");
    host = std::string(text.substr(0, colon));
    port = std::string(text.substr(colon + 1));
  }
  unsigned long number = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || number > 65535) {
      number = 0;
      break;
    }
    number = number * 10 + static_cast<unsigned long>(c - '0');
  }
  if (number == 0 || number > 65535)
    return Status::error(quoted() + ": port '" + port + "' is not a number from 1 to 65535");
  if (host.find('\0') != std::string::npos)
    return Status::error(quoted() + ": the host contains a NUL byte");
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  if (lookup == Lookup::kNumericOnly) hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return Status::error(quoted() + ": " +
                         (lookup == Lookup::kNumericOnly
                              ? "'" + host + "' is not an IP address"
                              : "cannot resolve '" + host + "': " + gai_strerror(rc)));
  SocketAddress a;
  for (addrinfo* i = found; i != nullptr; i = i->ai_next) {
    if ((i->ai_family == AF_INET || i->ai_family == AF_INET6) &&
        i->ai_addrlen <= sizeof(SocketAddress)) {
      a = from(i->ai_addr, i->ai_addrlen);
      break;
    }
  }
  freeaddrinfo(found);
  if (!a.valid()) return Status::error(quoted() + ": '" + host + "' has no IP address");
  a.set_port(static_cast<uint16_t>(number));
  return a;
}

int socket_family_from_env() {
  const char* env = std::getenv("NCCL_SOCKET_FAMILY");
  if (env == nullptr || *env == '\0') return AF_UNSPEC;
  std::string v(env);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "AF_INET" || v == "IPV4") return AF_INET;
  if (v == "AF_INET6" || v == "IPV6") return AF_INET6;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    EFCCL_WARN(-1, std::string("NCCL_SOCKET_FAMILY=") + env +
                       " is neither AF_INET nor AF_INET6; using either family");
  });
  return AF_UNSPEC;
}

StatusOr<std::string> resolve_socket_address(std::string_view text) {
  auto a = SocketAddress::parse(text, socket_family_from_env());
  if (!a) return a.status();
  return a->to_string();
}

}  // namespace efccl::net
