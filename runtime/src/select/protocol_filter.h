// NCCL_PROTO: which wire protocols programs may use ("Simple,LL128", "^LL"; all when unset).
#pragma once

#include <string>

#include "efccl/ef/program.h"

namespace efccl::runtime {

/// The protocols NCCL_PROTO allows.
struct ProtocolFilter {
  bool allowed[3] = {true, true, true};  ///< indexed by ef::Protocol
  std::string spec;                      ///< the variable's value, for messages
  /// Reads NCCL_PROTO; unknown names are warned about (naming them) and left out.
  static ProtocolFilter from_environment();
  bool allows(ef::Protocol p) const { return allowed[static_cast<int>(p)]; }
};

}  // namespace efccl::runtime
