// Hooks through which tests and tools watch the runtime's decisions without parsing logs (the
// log lines themselves: efccl::set_log_sink in efccl/common/log.h).
// They are not part of the NCCL ABI (libefccl.so does not export them); link efccl_runtime.
#pragma once

#include <functional>
#include <string>

namespace efccl::runtime {

/// One program selection: which program ran (or was skipped) for one collective call.
struct SelectionRecord {
  std::string collective;  ///< "allreduce", ..., or "p2p"
  std::string program;     ///< the program's name
  std::string source;      ///< "builtin", "runtime", or the user file's path
  std::string reason;      ///< why it was chosen, or why it was skipped
  bool skipped = false;    ///< a user program that claimed the call but could not run it
  unsigned long long count = 0;
  int nranks = 0;
};

/// Called (under the communicator clique's lock) for every selection; empty: none.
void set_selection_observer(std::function<void(const SelectionRecord&)> observer);

}  // namespace efccl::runtime
