#include "efccl/ef/diagnostic.h"

namespace efccl {

std::string Diagnostic::to_string() const {
  std::string out = file.empty() ? std::string("<memory>") : file;
  out += ": ";
  out += location.empty() ? std::string("(file)") : location;
  out += ": ";
  out += message;
  if (!rule.empty()) out += " [" + rule + "]";
  return out;
}

}  // namespace efccl
