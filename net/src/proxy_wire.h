// The proxy transport's wire format (docs/net.md, "The proxy transport"). Native byte order, as
// the bootstrap's: the ranks of a job share it.
//
//   handle   receiver -> sender, through the bootstrap: "EFNH", version, the receiver's proxy
//            address (28 bytes), connection id, token (16 bytes), sockets, the slot layout
//   hello    sender -> receiver, the first 40 bytes of every socket: "EFNT", version,
//            connection id, token, socket index, sockets
//   reply    receiver -> sender, 8 bytes: "EFNA", code (kAccepted or why not)
//   stripes  then 24-byte headers: kData (sender -> receiver: `length` bytes of slot `seq` at
//            `offset`, the slot holding `total`) and, both ways, kGoodbye (this socket's last
//            bytes). The receiver's consumption needs no message: its proxy reads a stripe only
//            into a freed slot, so TCP's flow control holds the sender back.
//
// A slot of `total` bytes travels in stripes of at least kMinStripe bytes, stripe i over socket
// i, so that one slot keeps several sockets busy while small slots use socket 0 only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "efccl/common/status.h"
#include "efccl/net/slot_region.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

inline constexpr uint32_t kProxyWireVersion = 1;
inline constexpr uint32_t kHandleMagic = 0x484e4645;  // "EFNH"
inline constexpr uint32_t kHelloMagic = 0x544e4645;   // "EFNT"
inline constexpr uint32_t kReplyMagic = 0x414e4645;   // "EFNA"
inline constexpr uint64_t kMinStripe = 64 * 1024;

using Token = std::array<uint8_t, 16>;

/// 16 random bytes (the kernel's generator).
Token random_token();
/// Compares in constant time.
bool same_token(const Token& a, const Token& b);

/// What the sender needs to reach a receiving end.
struct ConnectionHandle {
  static constexpr std::size_t kBytes = 84;
  SocketAddress address;
  uint64_t id = 0;
  Token token{};
  uint32_t nsocks = 1;
  SlotLayout layout;

  std::string encode() const;
  /// Checks the size, magic, version, the socket count (1..64) and the layout.
  static StatusOr<ConnectionHandle> decode(std::string_view bytes);
};

/// The first bytes of every socket of a connection.
struct Hello {
  static constexpr std::size_t kBytes = 40;
  uint64_t id = 0;
  Token token{};
  uint32_t index = 0;
  uint32_t nsocks = 0;

  void encode(char* out) const;
  /// The magic and version are checked by the caller (first 8 bytes); this reads the rest.
  static Hello decode(const char* bytes);
};

enum class ReplyCode : uint32_t {
  kAccepted = 0,
  kBadVersion = 1,
  kUnknownConnection = 2,
  kBadToken = 3,
  kBadSocket = 4,
};
inline constexpr std::size_t kReplyBytes = 8;
std::string reply_text(ReplyCode code);

enum class StripeType : uint32_t { kData = 1, kGoodbye = 3 };

struct StripeHeader {
  uint32_t type = 0;
  uint32_t length = 0;  ///< kData: payload bytes that follow
  uint64_t seq = 0;     ///< kData: the slot's number
  uint32_t total = 0;   ///< kData: bytes of the whole slot
  uint32_t offset = 0;  ///< kData: where this stripe starts in the slot
};
static_assert(sizeof(StripeHeader) == 24);

/// How a slot of `total` bytes is cut among `nsocks` sockets.
struct StripePlan {
  uint64_t stripe = 0;  ///< bytes per stripe (the last may be shorter)
  uint32_t count = 1;   ///< stripes (socket i < count carries stripe i); 1 for an empty slot

  static StripePlan of(uint64_t total, uint32_t nsocks);
  uint64_t offset(uint32_t i) const { return stripe * i; }
  uint64_t length(uint32_t i, uint64_t total) const {
    const uint64_t at = offset(i);
    return at >= total ? 0 : (total - at < stripe ? total - at : stripe);
  }
};

}  // namespace efccl::net
