// Which operand reads see a rank's own, never-written input (docs/ef-format.md, "premulsum").
#pragma once

#include <string>
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
  /// The operand is mixed: it reads some pristine input chunks and some that are not (input
  /// chunks already written before it, or, through in-place aliasing, chunks outside the
  /// input). Per-operand scaling cannot express such a read; the src/dst flag above is false
  /// for it, so pre-multiplying operators must refuse the program rather than run it.
  bool src_mixed = false;
  bool dst_mixed = false;
};
/// Indexed [rank][tb][op]. Requires a valid program (validate() returned no diagnostics).
/// `inplace` selects the aliasing of input and output (NCCL's rules per collective).
using PremulMap = std::vector<std::vector<std::vector<PremulFlags>>>;
PremulMap analyze_premul(const Program& program, bool inplace);

/// The first op (rank, threadblock, op order) with a mixed operand in `map` (from
/// analyze_premul(program, inplace)), described for an error message: "rank 0 tb 1 op 0
/// (send): src reads input chunks 0..1 of which some are already written: premulsum/avg cannot
/// scale it; split the op". Empty when no operand is mixed.
std::string describe_mixed_operand(const Program& program, const PremulMap& map, bool inplace);

}  // namespace efccl::ef
