// Which operand reads see a rank's own, never-written input (docs/ef-format.md, "premulsum").
#pragma once

#include <vector>

#include "efccl/ef/program.h"

namespace efccl::ef {

/// For each op: whether its src operand, and (for `reduce`) its dst operand, read a
/// pristine input chunk: one of the rank's input chunks that no op writes before it in
/// happens-before order (threadblock order, dependencies, send -> matching receive).
/// Pre-multiplying operators (premulsum, avg on floats) scale exactly these reads.
struct PremulFlags {
  bool src = false;
  bool dst = false;
};
/// Indexed [rank][tb][op]. Requires a valid program (validate() returned no diagnostics).
/// `inplace` selects the aliasing of input and output (NCCL's rules per collective).
using PremulMap = std::vector<std::vector<std::vector<PremulFlags>>>;
PremulMap analyze_premul(const Program& program, bool inplace);

}  // namespace efccl::ef
