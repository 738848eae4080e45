// Loading a program file of either format, chosen by content (not by extension).
#pragma once

#include <string>

#include "efccl/ef/json_io.h"
#include "efccl/ef/msccl_xml.h"

namespace efccl::ef {

/// Result of loading a file: the program when parsing succeeded, plus every diagnostic.
struct LoadResult {
  std::optional<Program> program;
  Diagnostics diagnostics;
};

/// Parses `text` as EF JSON when its first non-blank character is '{', as MSCCL XML when it
/// is '<', and reports an "unknown-format" diagnostic otherwise.
LoadResult load_program_text(std::string_view text, const std::string& file_name);

/// Reads and parses a file (size-checked before reading).
LoadResult load_program_file(const std::string& path);

}  // namespace efccl::ef
