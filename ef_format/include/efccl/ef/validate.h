// Static validation of a Program: complete, and safe on any input (docs/ef-format.md,
// "Validation rules"). Every diagnostic names the file, the location and the rule.
#pragma once

#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/ef/diagnostic.h"

namespace efccl::ef {

/// Connection slots assumed by the capacity check (NCCL_STEPS; the GPU interpreter uses the same).
inline constexpr int kDefaultConnectionSlots = 8;

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
