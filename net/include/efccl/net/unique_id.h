// The unique id: the 128 bytes the ranks of a communicator share to meet (ncclUniqueId's size and
// role; net does not include nccl.h, the runtime converts). An efccl id holds a magic, a format
// tag, flags and the address of the rendezvous root:
//   bytes 0-7 magic, 8-11 format "EFB1", 12-15 flags, 16-43 root address, the rest zero.
// The magic is random, and secret to those the id was given to, unless NCCL_COMM_ID is set:
// then, as NCCL does, every process makes the same id (a fixed magic and that address) without
// talking to the others, and rank 0 starts the root there when it joins.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "efccl/common/status.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

inline constexpr std::size_t kUniqueIdBytes = 128;

/// The bytes ranks share to meet.
struct UniqueId {
  char internal[kUniqueIdBytes] = {};
};

/// What an efccl unique id holds.
struct UniqueIdFields {
  static constexpr uint32_t kFormat = 0x31424645;  ///< "EFB1"
  static constexpr uint32_t kRootByRank0 = 1;  ///< flag: rank 0's Bootstrap::start runs the root
  /// The magic of every NCCL_COMM_ID id (such ids are made independently by every process).
  static constexpr uint64_t kCommIdMagic = 0x4449'5f4d'4d4f'4345ull;

  uint64_t magic = 0;
  uint32_t format = 0;
  uint32_t flags = 0;
  SocketAddress root;

  static UniqueIdFields decode(const UniqueId& id);
  UniqueId encode() const;
  /// Made by efccl's create_unique_id: the format tag and an IP root address.
  bool valid() const { return format == kFormat && root.valid(); }
  bool root_by_rank0() const { return (flags & kRootByRank0) != 0; }
};

/// Fills a unique id. Without NCCL_COMM_ID: a random magic and the address of a rendezvous root
/// started here, on the interface NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY select (default: the
/// first non-loopback interface that is up, else loopback). Roots that wait for their ranks share
/// one thread of this process; one whose ranks have not all joined `root_lifetime` (plus 2 s, so
/// that the ranks' own timeouts report first) after its creation and after its latest join ends
/// (EFCCL_INIT_TIMEOUT_MS: the runtime passes its init timeout). With NCCL_COMM_ID: that address
/// and a fixed magic, the same bytes in every process; no root is started here (rank 0's
/// Bootstrap::start starts it).
Status create_unique_id(UniqueId* out, std::chrono::milliseconds root_lifetime);

/// The root address an id points at, e.g. "10.0.0.1:4242" or "[fd00::2]:4242" (for messages).
std::string describe_unique_id(const UniqueId& id);

}  // namespace efccl::net
