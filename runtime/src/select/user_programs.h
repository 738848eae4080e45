// The user's algorithm files (EFCCL_ALGO_DIR, EFCCL_ALGO_FILES) and whether the built-in library
// may run what they do not cover (EFCCL_BUILTINS).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::runtime {

/// Loads and validates the program files named by EFCCL_ALGO_DIR (every .json and .xml in it,
/// sorted) and EFCCL_ALGO_FILES (a ',' or ':' list). A file that cannot be read, parsed or
/// validated is logged (WARN, with every diagnostic) and skipped; nothing throws.
std::vector<std::pair<ef::Program, std::string>> load_user_programs();

/// EFCCL_BUILTINS: unset, "1" or "on" -> true; "0" or "off" -> false; else a warning and true.
bool builtins_from_environment();

}  // namespace efccl::runtime
