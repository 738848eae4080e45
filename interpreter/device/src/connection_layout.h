// Where the memory of every connection of a program lies (pure C++, no CUDA): per location (a
// GPU of this process, or of another process of a multi-process executor) one FIFO arena with,
// per connection received there, `tail`, the receiver's position and the slots, and one counter
// arena with, per connection sent from there, `head` and the sender's position. The layout
// depends only on the program, the locations and the slot geometry, so that every process of a
// multi-process executor derives the same offsets without exchanging them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/ef/program.h"
#include "wire_format.h"

namespace efccl::device {

/// Distance between counters written by different agents (avoids false sharing across links).
inline constexpr std::size_t kCounterStride = 128;

// One connection's memory in the receiver's FIFO arena: tail, position, slots.
inline constexpr std::size_t kTailOffset = 0;                       ///< written by the sender
inline constexpr std::size_t kRecvPositionOffset = kCounterStride;  ///< the receiver's pops
inline constexpr std::size_t kSlotsOffset = 2 * kCounterStride;
// And in the sender's counter arena: head, position.
inline constexpr std::size_t kHeadOffset = 0;                       ///< written by the receiver
inline constexpr std::size_t kSendPositionOffset = kCounterStride;  ///< the sender's pushes
inline constexpr std::size_t kSendEndBytes = 2 * kCounterStride;

/// A connection (sender, receiver, channel): its two threadblocks, its wire format, and where
/// its memory lies.
struct ConnectionPlan {
  int sender = 0, receiver = 0, channel = 0;
  int send_tb = -1, recv_tb = -1;
  WireFormat wire = kWireSimple;
  std::size_t recv_offset = 0;  ///< in the receiver location's FIFO arena
  std::size_t send_offset = 0;  ///< in the sender location's counter arena
};

/// Every connection of `program`, ordered by (sender, receiver, channel); an error names a
/// connection with only one side (validation rules those out).
StatusOr<std::vector<ConnectionPlan>> plan_connections(const ef::Program& program);

/// Wire bytes of a slot that carries `slot_bytes` data bytes in `wire` (a tile has at most
/// max(slot_bytes, 8) bytes: max(1, slot_bytes / size) elements of at most 8 bytes).
std::size_t slot_wire_bytes(WireFormat wire, std::size_t slot_bytes);

/// The slot stride of every connection of a program (the same for all, so that every process
/// derives the same layout): Simple's for Simple programs; for LL and LL128 programs large
/// enough for LL lines unless every connection is known to run LL128 (`connections`' wire
/// formats, single process only).
std::size_t connection_slot_stride(ef::Protocol protocol, std::size_t slot_bytes,
                                   const std::vector<ConnectionPlan>& connections,
                                   bool multiprocess);

/// The sizes of every location's arenas.
struct ConnectionLayout {
  std::size_t slot_stride = 0;                   ///< wire bytes per slot
  uint32_t nslots = 0;                           ///< slots per connection
  std::size_t connection_fifo_bytes = 0;         ///< one connection's part of a FIFO arena
  std::map<int64_t, std::size_t> fifo_bytes;     ///< per location
  std::map<int64_t, std::size_t> counter_bytes;  ///< per location
};

/// Lays out `connections` (fills their offsets, in their order) over the locations of their
/// ranks (`location[rank]`); every location of a rank gets an entry, possibly 0 bytes. Fails
/// when a size does not fit in 64 bits.
StatusOr<ConnectionLayout> lay_out_connections(std::vector<ConnectionPlan>& connections,
                                               const std::vector<int64_t>& location,
                                               std::size_t slot_stride, int nslots);

}  // namespace efccl::device
