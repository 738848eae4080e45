// The executor-owned memory of one rank for one call (pure C++, no CUDA): its scratch buffer,
// then each program buffer the API does not provide for the rank (e.g. the output of a non-root
// rank of reduce), each part 256-byte aligned. Every size is checked for overflow, as the host
// executor checks its buffers: chunk counts reach 2^40 and counts 2^64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "efccl/common/status.h"
#include "efccl/ef/program.h"

namespace efccl::device {

/// Alignment of each part of the executor-owned memory.
inline constexpr uint64_t kOwnedAlignment = 256;

/// One rank's executor-owned memory for calls of `chunk_elements` elements per chunk.
struct OwnedMemoryLayout {
  uint64_t input_elements = 0;            ///< the program's input buffer (chunks x chunk elements)
  uint64_t output_elements = 0;           ///< the program's output buffer
  uint64_t scratch_bytes = 0;             ///< aligned; the scratch buffer starts at offset 0
  std::optional<uint64_t> input_offset;   ///< set when the program's input lives here
  std::optional<uint64_t> output_offset;  ///< set when the program's output lives here
  uint64_t bytes = 0;                     ///< the whole, aligned
};

/// The layout for rank `rank` of a call with NCCL `count` (`chunk_elements` per chunk,
/// `element_size` bytes per element). Fails, naming the rank and the buffer, when a program
/// buffer's or an API buffer's byte size does not fit in 64 bits.
StatusOr<OwnedMemoryLayout> owned_memory_layout(const ef::Program& program, int rank,
                                                uint64_t chunk_elements, uint64_t count,
                                                std::size_t element_size);

/// Bytes of `instances` uses of `stride` bytes each (a batch that runs an executor several
/// times gives each use its own share), or an error when that overflows.
StatusOr<uint64_t> owned_bytes_for_uses(uint64_t instances, uint64_t stride);

}  // namespace efccl::device
