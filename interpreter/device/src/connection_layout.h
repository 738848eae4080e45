// Where the memory of every connection of a program lies (pure C++, no CUDA): per location (a
// GPU of this process, or of another process of a multi-process executor) one FIFO arena with,
// per connection received there, `tail`, the receiver's position and the slots, and one counter
// arena with, per connection sent from there, `head` and the sender's position. A connection the
// program places elsewhere (ef::ConnectionPlacement: pinned host memory, or a slot device) has
// its FIFO entry (`tail`, `head`, slots) in a placed arena instead, and its receiver's position
// in the receiver location's counter arena. A network connection (its ranks on different hosts)
// has no FIFO entry in any arena: its slots and counters are the two ends' blocks of pinned host
// memory that the runtime joins through its proxies (docs/net.md); only the sender's push
// position and the receiver's pop position lie in their locations' counter arenas. The layout
// depends only on the program, the locations, the hosts and the slot geometry, so that every
// process of a multi-process executor derives the same offsets without exchanging them.
#pragma once

#include <compare>
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

// One connection's FIFO entry, in the receiver's FIFO arena or in a placed arena: tail, the
// receiver's position (placed connections: head), slots.
inline constexpr std::size_t kTailOffset = 0;                       ///< written by the sender
inline constexpr std::size_t kRecvPositionOffset = kCounterStride;  ///< the receiver's pops
inline constexpr std::size_t kPlacedHeadOffset = kCounterStride;    ///< placed: the receiver's pops
inline constexpr std::size_t kSlotsOffset = 2 * kCounterStride;
// In the sender's counter arena: head (not for placed connections), position.
inline constexpr std::size_t kHeadOffset = 0;                       ///< written by the receiver
inline constexpr std::size_t kSendPositionOffset = kCounterStride;  ///< the sender's pushes
inline constexpr std::size_t kSendEndBytes = 2 * kCounterStride;
// Placed and network connections, in the receiver's counter arena: the receiver's position.
inline constexpr std::size_t kRecvEndPositionOffset = 0;
inline constexpr std::size_t kRecvEndBytes = kCounterStride;

/// A placed arena: the FIFO entries of the placed connections from the ranks of location
/// `sender` to those of location `receiver` that share one slot memory, pinned host memory
/// (`slot_device` -1) or slot device `slot_device` (0 .. Program::slot_devices - 1). The
/// receiver location's process owns it; per sender location, so that a host arena shared
/// between processes is mapped by exactly one other process.
struct PlacedArenaKey {
  int64_t receiver = 0;
  int64_t sender = 0;
  int32_t slot_device = -1;  ///< -1: pinned host memory
  auto operator<=>(const PlacedArenaKey&) const = default;
};

/// A connection (sender, receiver, channel): its two threadblocks, its wire format, and where
/// its memory lies.
struct ConnectionPlan {
  int sender = 0, receiver = 0, channel = 0;
  int send_tb = -1, recv_tb = -1;
  WireFormat wire = kWireSimple;
  /// Where its FIFO entry lies (Program::placements): the receiver's GPU, pinned host memory,
  /// or slot device `slot_device`. Network connections: kReceiver (a placement does not apply).
  ef::SlotLocation placement = ef::SlotLocation::kReceiver;
  int slot_device = -1;  ///< kDevice only
  /// Its ranks run on different hosts (mark_network_connections): each end's slots and counters
  /// are a block the runtime provides (PeerProcesses::connect_network), not an arena's.
  bool network = false;
  /// The FIFO entry: in the receiver location's FIFO arena, or in placed_arena()'s (none for
  /// network connections).
  std::size_t recv_offset = 0;
  std::size_t send_offset = 0;      ///< the sender's end, in the sender location's counter arena
  /// Placed and network connections: the receiver's end, in its location's counter arena.
  std::size_t recv_end_offset = 0;

  bool placed() const { return placement != ef::SlotLocation::kReceiver; }
  /// The receiver keeps its pop position in its own counter arena (not in a FIFO entry).
  bool has_recv_end() const { return placed() || network; }
  /// The placed arena of a placed connection, given the ranks' locations.
  PlacedArenaKey placed_arena(const std::vector<int64_t>& location) const {
    return {location.at(receiver), location.at(sender),
            placement == ef::SlotLocation::kHost ? -1 : slot_device};
  }
};

/// Every connection of `program`, ordered by (sender, receiver, channel), with its placement;
/// an error names a connection with only one side, and a placement of a connection the program
/// does not have, listed twice, or on a slot device it does not name (validation rules those
/// out; the executor must not trust it to).
StatusOr<std::vector<ConnectionPlan>> plan_connections(const ef::Program& program);

/// Marks the connections whose sender and receiver run on different hosts (`hosts[rank]`; empty:
/// one host) as network connections, dropping any placement they have (their memory is each
/// host's own pinned memory). An error when `hosts` does not have one entry per rank, or when a
/// network connection's two ranks run in one process (`local`: per rank, run here; a process
/// lives on one host).
Status mark_network_connections(std::vector<ConnectionPlan>& connections,
                                const std::vector<uint64_t>& hosts, const std::vector<bool>& local);

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
  std::size_t slot_stride = 0;                         ///< wire bytes per slot
  uint32_t nslots = 0;                                 ///< slots per connection
  std::size_t connection_fifo_bytes = 0;               ///< one connection's FIFO entry
  std::map<int64_t, std::size_t> fifo_bytes;           ///< per location
  std::map<int64_t, std::size_t> counter_bytes;        ///< per location
  std::map<PlacedArenaKey, std::size_t> placed_bytes;  ///< per placed arena that has entries
};

/// Where a location's XprocBoard (kernel_params.h) lies in its counter arena, after the
/// `counter_bytes` of its connection ends; the arena is allocated that much larger.
inline std::size_t xproc_board_offset(std::size_t counter_bytes) {
  return (counter_bytes + 127) / 128 * 128;
}

/// Lays out `connections` (fills their offsets, in their order) over the locations of their
/// ranks (`location[rank]`) and their placed arenas; every location of a rank gets an entry,
/// possibly 0 bytes; placed arenas only where a connection is placed; network connections get
/// only their two ends' positions. Fails when a size does not fit in 64 bits.
StatusOr<ConnectionLayout> lay_out_connections(std::vector<ConnectionPlan>& connections,
                                               const std::vector<int64_t>& location,
                                               std::size_t slot_stride, int nslots);

}  // namespace efccl::device
