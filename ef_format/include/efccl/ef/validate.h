// Static validation of a Program: complete, and safe on any input (docs/ef-format.md,
// "Validation rules"). Every diagnostic names the file, the location and the rule.
#pragma once

#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/ef/diagnostic.h"

namespace efccl::ef {

/// Connection slots assumed by the capacity check (NCCL_STEPS; the GPU interpreter uses the same).
inline constexpr int kDefaultConnectionSlots = 8;

/// The most chunks a valid program cuts a call into (nchunksperloop) and the most any rank's
/// buffer holds (input, output, scratch; op offsets and counts lie inside the buffers): 2^24,
/// which a direct alltoall over 4096 ranks needs and far above real programs (MSCCL files cut
/// a call into at most a few hundred chunks). The loaders accept larger numbers (up to 2^40 in
/// EF JSON) so that validation can name the limit.
inline constexpr int64_t kMaxChunks = int64_t{1} << 24;

/// The most external slot devices a valid program names (Program::slot_devices).
inline constexpr int32_t kMaxSlotDevices = 64;

struct ValidateOptions {
  int connection_slots = kDefaultConnectionSlots;
  std::size_t max_diagnostics = 100;  ///< stop collecting after this many
};

/// All rules; returns an empty list when the program is valid.
Diagnostics validate(const Program& program, const ValidateOptions& options = {});

/// The location string for (rank, tb, op, field) in the program's own source format:
/// a JSON pointer for JSON and memory, an XML element path with ids and line for MSCCL XML.
/// Pass -1 to stop at an outer level; `field` may be empty.
std::string location_of(const Program& program, int rank, int tb, int op,
                        std::string_view field = {});

}  // namespace efccl::ef
