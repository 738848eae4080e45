// The index check both host engines (the executor and the timing model) run before walking a
// program, so that an invalid program cannot make them index out of bounds.
#pragma once

#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::host {

/// Checks the indices a walk of the program follows (peers, operands, buffer ranges, dependency
/// targets). ef::validate checks the full rule set; what is not checked here (matching,
/// deadlock freedom) shows up at run time.
Status check_indices(const ef::Program& p);

}  // namespace efccl::host
