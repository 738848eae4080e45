// Loading a program file of either format, chosen by content (not by extension).
#pragma once

#include <cstddef>
#include <string>

#include "efccl/ef/json_io.h"
#include "efccl/ef/msccl_xml.h"

namespace efccl::ef {

/// Result of loading a file: the program when parsing succeeded, plus every diagnostic.
struct LoadResult {
  std::optional<Program> program;
  Diagnostics diagnostics;
};

/// What loading a file may cost: the file's size, then the memory of its parsed form (the
/// loaders' budget, docs/ef-format.md §8 "Limits"). The same defaults apply in the `efccl`
/// command and in the application (EFCCL_ALGO_FILES, EFCCL_ALGO_DIR).
struct LoadLimits {
  std::size_t max_file_bytes = 256u << 20;
  std::size_t max_memory_bytes = 256u << 20;
};

/// Parses `text` as EF JSON when its first non-blank character is '{', as MSCCL XML when it
/// is '<', and reports an "unknown-format" diagnostic otherwise.
LoadResult load_program_text(std::string_view text, const std::string& file_name,
                             const LoadLimits& limits = {});

/// Reads and parses a file (size-checked before reading). Never throws: a file that cannot be
/// read or loaded within `limits` gives diagnostics naming the file and what was wrong.
LoadResult load_program_file(const std::string& path, const LoadLimits& limits = {});

}  // namespace efccl::ef
