// How a connection's slots carry a tile (docs/ef-format.md §5): the formats and their sizes,
// shared by the host code that lays slots out and the kernels that fill and read them.
#pragma once

#include <cstdint>

namespace efccl::device {

/// How a connection's slots carry a tile.
///  * Simple: the tile's bytes as they are; the sender release-stores `tail` once the whole
///    CTA has written the slot, the receiver acquires it before reading.
///  * LL: 8-byte lines of 4 data bytes and a 4-byte flag, each line one 8-byte store; the
///    receiver polls every line until its flag is the one of this slot use. No tail.
///  * LL128: 128-byte lines of 120 data bytes and an 8-byte flag, each line stored by 8 lanes
///    of one warp in one 16-byte-per-lane instruction; the receiver checks the flag lane of
///    each line it loaded with one such instruction. No tail. Relies on the GPU delivering a
///    warp's aligned 128-byte store to peer memory as a unit (NVLink, compute capability 9.0).
/// Both flagged formats cut a tile into 120-byte groups: group L is one LL128 line, or 30 LL
/// lines, and lane g (0..7) of the 8 lanes that handle it owns its bytes [16g, 16g + 16)
/// (lane 7: [112, 120)), so an op may pop one format and push the other.
enum WireFormat : uint32_t { kWireSimple = 0, kWireLL = 1, kWireLL128 = 2 };

inline constexpr uint32_t kGroupDataBytes = 120;  ///< data bytes per 120-byte group
inline constexpr uint32_t kLL128LineBytes = 128;  ///< LL128 wire bytes per group
inline constexpr uint32_t kLLGroupWireBytes = 2 * kGroupDataBytes;  ///< LL wire bytes per group
/// LL flags are 31-bit (position mod 2^31, plus 1, so never 0), so a line written by an earlier
/// use of the slot could carry the flag expected now once the position has moved 2^31 on. The
/// receiver zeroes a slot after reading it once every kLLClearPeriod positions of that slot,
/// which bounds the age of any line it reads to well under 2^31 positions.
inline constexpr uint64_t kLLClearPeriod = uint64_t{1} << 30;

}  // namespace efccl::device
