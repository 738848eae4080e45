#include "proxy_wire.h"

#include <sys/random.h>

#include <cstring>
#include <random>

#include "efccl/net/frame.h"
#include "efccl/net/proxy_settings.h"

namespace efccl::net {
namespace {

uint64_t get_u64(std::string_view bytes, std::size_t at) {
  uint64_t v;
  std::memcpy(&v, bytes.data() + at, sizeof(v));
  return v;
}

void put_u64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

Token random_token() {
  Token t{};
  std::size_t got = 0;
  while (got < t.size()) {
    const ssize_t n = ::getrandom(t.data() + got, t.size() - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < t.size()) {  // no getrandom (old kernel): std::random_device reads /dev/urandom
    std::random_device rd;
    for (auto& b : t) b = static_cast<uint8_t>(rd());
  }
  return t;
}

bool same_token(const Token& a, const Token& b) {
  uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

std::string ConnectionHandle::encode() const {
  std::string out;
  put_u32(out, kHandleMagic);
  put_u32(out, kProxyWireVersion);
  out.append(reinterpret_cast<const char*>(&address), sizeof(address));
  put_u64(out, id);
  out.append(reinterpret_cast<const char*>(token.data()), token.size());
  put_u32(out, nsocks);
  put_u32(out, layout.nslots);
  put_u64(out, layout.slot_bytes);
  put_u32(out, layout.sized ? 1 : 0);
  put_u32(out, 0);
  return out;
}

StatusOr<ConnectionHandle> ConnectionHandle::decode(std::string_view bytes) {
  if (bytes.size() != kBytes || get_u32(bytes, 0) != kHandleMagic)
    return Status::error("a network connection handle of " + std::to_string(bytes.size()) +
                         " bytes that is not one (expected " + std::to_string(kBytes) + ")");
  if (const uint32_t v = get_u32(bytes, 4); v != kProxyWireVersion)
    return Status::error("the receiver speaks network transport version " + std::to_string(v) +
                         ", this process " + std::to_string(kProxyWireVersion));
  ConnectionHandle h;
  std::size_t at = 8;
  std::memcpy(static_cast<void*>(&h.address), bytes.data() + at, sizeof(h.address));
  at += sizeof(h.address);
  h.id = get_u64(bytes, at);
  at += 8;
  std::memcpy(h.token.data(), bytes.data() + at, h.token.size());
  at += h.token.size();
  h.nsocks = get_u32(bytes, at);
  h.layout.nslots = get_u32(bytes, at + 4);
  h.layout.slot_bytes = get_u64(bytes, at + 8);
  h.layout.sized = get_u32(bytes, at + 16) != 0;
  if (!h.address.valid()) return Status::error("the receiver's handle holds no IP address");
  if (h.nsocks < 1 || h.nsocks > static_cast<uint32_t>(ProxySettings::kMaxSockets))
    return Status::error("the receiver asks for " + std::to_string(h.nsocks) +
                         " sockets per connection (1 to " +
                         std::to_string(ProxySettings::kMaxSockets) + " allowed)");
  if (Status s = h.layout.check(); !s)
    return Status::error("the receiver's handle: " + s.message());
  return h;
}

void Hello::encode(char* out) const {
  std::string s;
  put_u32(s, kHelloMagic);
  put_u32(s, kProxyWireVersion);
  put_u64(s, id);
  s.append(reinterpret_cast<const char*>(token.data()), token.size());
  put_u32(s, index);
  put_u32(s, nsocks);
  std::memcpy(out, s.data(), kBytes);
}

Hello Hello::decode(const char* bytes) {
  const std::string_view b(bytes, kBytes);
  Hello h;
  h.id = get_u64(b, 8);
  std::memcpy(h.token.data(), bytes + 16, h.token.size());
  h.index = get_u32(b, 32);
  h.nsocks = get_u32(b, 36);
  return h;
}

std::string reply_text(ReplyCode code) {
  switch (code) {
    case ReplyCode::kAccepted:
      return "accepted";
    case ReplyCode::kBadVersion:
      return "another network transport version";
    case ReplyCode::kUnknownConnection:
      return "no such connection is expected (closed, or never made)";
    case ReplyCode::kBadToken:
      return "a wrong token";
    case ReplyCode::kBadSocket:
      return "a socket index out of range or already connected";
  }
  return "reply code " + std::to_string(static_cast<uint32_t>(code));
}

StripePlan StripePlan::of(uint64_t total, uint32_t nsocks) {
  StripePlan p;
  const uint64_t even = (total + nsocks - 1) / nsocks;
  p.stripe = even < kMinStripe ? kMinStripe : (even + 4095) / 4096 * 4096;
  p.count = total == 0 ? 1 : static_cast<uint32_t>((total + p.stripe - 1) / p.stripe);
  return p;
}

}  // namespace efccl::net
