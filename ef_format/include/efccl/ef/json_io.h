// EF JSON (format version 1): load and save. The schema is docs/ef-format.schema.json.
#pragma once

#include <string>
#include <string_view>

#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/ef/diagnostic.h"

namespace efccl::ef {

/// Limits that keep hostile input cheap: checked before and during parsing.
struct JsonLimits {
  std::size_t max_bytes = 256u << 20;  ///< whole document
  int max_depth = 64;                  ///< nesting of arrays/objects
  /// Memory budget of the parsed document: every value is charged its estimated size while
  /// parsing (docs/ef-format.md §8, "Limits"), and parsing stops once the total exceeds this.
  std::size_t max_memory_bytes = 256u << 20;
};

/// Parses EF JSON text. On failure returns no program and at least one Diagnostic whose
/// location is a JSON pointer ("/ranks/3/threadblocks/0/ops/7/src") or "byte N" for syntax
/// errors. Structural checks only (types, required fields, known names, integer ranges);
/// semantic rules are validate()'s job.
struct JsonLoadResult {
  std::optional<Program> program;
  Diagnostics diagnostics;
};
JsonLoadResult load_json(std::string_view text, const std::string& file_name = "<memory>",
                         const JsonLimits& limits = {});

/// Deterministic, canonical EF JSON (stable key order, 2-space indent, trailing newline).
/// save -> load -> save is byte-identical.
std::string save_json(const Program& program);

}  // namespace efccl::ef
