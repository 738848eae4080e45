// One problem found in a program file: what `efccl validate` prints and what the loaders and
// validation return, naming the file, the location inside it and the rule that was broken.
#pragma once

#include <string>
#include <vector>

namespace efccl {

/// One problem found in a program file: `FILE: LOCATION: message (rule)`.
struct Diagnostic {
  std::string file;      ///< path as given by the user, or "<memory>"
  std::string location;  ///< JSON pointer, or XML element path with ids and line
  std::string rule;      ///< short stable rule name, e.g. "connection-mismatch"
  std::string message;   ///< what was expected and what was found

  /// The one-line form printed by `efccl validate`.
  std::string to_string() const;
};

using Diagnostics = std::vector<Diagnostic>;

}  // namespace efccl
