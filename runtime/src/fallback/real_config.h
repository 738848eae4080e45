// The ncclConfig_t a communicator was created with, kept for the real NCCL communicator that
// EFCCL_FALLBACK=nccl creates beside it (fallback/nccl_fallback.h).
#pragma once

#include <nccl.h>

#include <optional>
#include <string>

namespace efccl::runtime {

/// A ncclConfig_t kept beyond the call that passed it: its fields as comm/comm_config.h read
/// them, strings owned.
struct RealConfig {
  ncclConfig_t fields = NCCL_CONFIG_INITIALIZER;
  std::optional<std::string> net_name, comm_name;
  /// A config of this header's version carrying the fields, its strings pointing here.
  ncclConfig_t get() const;
};

}  // namespace efccl::runtime
