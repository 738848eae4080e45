// STUB (being written by the validation helper): replaced wholesale.
#include "efccl/ef/validate.h"
namespace efccl::ef {
Diagnostics validate(const Program&, const ValidateOptions&) { return {}; }
std::string location_of(const Program&, int, int, int, std::string_view) { return ""; }
}  // namespace efccl::ef
