// The bootstrap's wire format. Every message is a frame: a 40-byte header (magic, namespace,
// tag, payload length, type) and the payload. Native byte order: all ranks of a job are assumed
// to share it. The magic is the unique id's: a connection whose first 8 bytes differ is not
// part of the rendezvous and is refused.
//
//   rank -> root   kRootHello  version, nranks, rank, 0 (u32 each), listen address (28 bytes),
//                              info blob; the header's tag carries rank 0's token (NCCL_COMM_ID)
//   root -> rank   kRootCount  joined, nranks (u32 each): progress reports
//                  kRootError  text: the rendezvous failed, or this connection was refused
//                  kRootTable  nranks, 0 (u32), then per rank: address (28), info length (u32),
//                              info
//   rank -> rank   kPeerHello  nranks, from, to (u32 each): first frame of a connection
//                  kData       a message (namespace and tag in the header)
//                  kGoodbye    the sender closes its bootstrap; tag: data frames it sent here
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

/// Bumped when the frames change; ranks and roots of different versions refuse each other.
inline constexpr uint32_t kProtocolVersion = 1;

enum FrameType : uint32_t {
  kRootHello = 1,
  kRootCount,
  kRootError,
  kRootTable,
  kPeerHello,
  kData,
  kGoodbye,
};

/// Starts every frame; `length` payload bytes follow.
struct FrameHeader {
  uint64_t magic = 0;
  uint64_t space = 0;  ///< message namespace (a bootstrap and its subsets)
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t type = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(FrameHeader) == 40);

/// The fixed part of a kRootHello payload (the info blob follows).
inline constexpr std::size_t kRootHelloFixedBytes = 16 + sizeof(SocketAddress);
/// A kPeerHello payload.
inline constexpr std::size_t kPeerHelloBytes = 12;

/// Appends `value` in native byte order.
void put_u32(std::string& out, uint32_t value);
/// The u32 at byte `at` of `bytes` (the caller checked the size).
uint32_t get_u32(std::string_view bytes, std::size_t at);

/// A whole frame: header then payload.
std::string frame_bytes(uint64_t magic, uint32_t type, uint64_t space, uint64_t tag,
                        std::string_view payload);

/// Writes `header` then `payload` on a non-blocking socket, waiting (poll) until `deadline` or
/// `*abort` (may be null). `*written`: bytes handed to the kernel, to tell a frame cut short
/// (the stream is unusable) from one never started.
Status write_frame(int fd, const FrameHeader& header, std::string_view payload, Deadline deadline,
                   const std::atomic<bool>* abort, std::size_t* written);

}  // namespace efccl::net
