// A test oracle independent of the compiler: executes an ef::Program one chunk per op unit,
// with values that are multisets of input chunks, threadblocks interleaved in a seeded random
// order (so that a missing dependency shows up as a wrong value) and unbounded connections,
// and checks the collective's definition (docs/ef-format.md §6) in chunks.
#pragma once

#include <cstdint>
#include <string>

#include "efccl/ef/program.h"

namespace efccl::testing {

/// "" when every output chunk holds exactly what the collective (or the custom
/// postconditions) requires, else the first problem. `seed` 0: round-robin interleaving.
std::string symbolic_check(const ef::Program& program, bool inplace, uint64_t seed = 0);

}  // namespace efccl::testing
