// MSCCL XML algorithm files: import into a Program and export back.
#pragma once

#include <string>
#include <string_view>

#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/ef/diagnostic.h"

namespace efccl::ef {

/// Limits that keep hostile input cheap.
struct XmlLimits {
  std::size_t max_bytes = 256u << 20;      ///< whole document
  int max_depth = 16;                      ///< element nesting (MSCCL needs 4)
  std::size_t max_attribute_bytes = 4096;  ///< one attribute value
  std::size_t max_elements = 50u << 20;    ///< element count
  /// Memory budget of the parsed document: every element and attribute is charged its
  /// estimated size while parsing (docs/ef-format.md §8, "Limits"); parsing stops beyond it.
  std::size_t max_memory_bytes = 256u << 20;
};

/// Imports MSCCL/RCCL XML (see docs/ef-format.md, "MSCCL XML import"), msccl-tools' output
/// included: an absent `outofplace` is the negation of `inplace`, and in an in-place-only
/// program a buffer that the in-place aliasing places inside the other one (allgather's input,
/// reducescatter's output, ...) may be declared with 0 chunks. Diagnostics name the element
/// path with ids and the line, e.g. "algo/gpu[id=3]/tb[id=5]/step[s=2] (line 88)".
struct XmlLoadResult {
  std::optional<Program> program;
  Diagnostics diagnostics;
};
XmlLoadResult load_msccl_xml(std::string_view text, const std::string& file_name = "<memory>",
                             const XmlLimits& limits = {});

/// MSCCL XML that MSCCL's loader and ours accept. Programs MSCCL cannot express (several
/// dependencies on one op, custom collectives, connection placement) are lowered: extra deps
/// become nops; custom collectives and programs with placements or slot devices are refused
/// with a Status.
StatusOr<std::string> save_msccl_xml(const Program& program);

}  // namespace efccl::ef
