// What efccl takes from the ncclConfig_t of ncclCommInitRankConfig, ncclCommSplit and
// ncclCommShrink, read as NCCL 2.28 reads it.
#pragma once

#include <nccl.h>

#include <string>

#include "base/api_status.h"
#include "fallback/real_config.h"

namespace efccl::runtime {

/// What efccl takes from a ncclConfig_t.
struct CommConfig {
  bool blocking = true;
  std::string hints;  ///< performance hints that were set (and are ignored), for the log
  RealConfig real;
};

/// Reads `config` as NCCL 2.28 does: `size` bytes at most (the rest default), fields newer than
/// `version` default; magic and version must be NCCL_CONFIG_INITIALIZER's, values that nccl.h
/// or NCCL rejects give ncclInvalidArgument. Null: the defaults.
ApiStatus parse_config(const ncclConfig_t* config, CommConfig* out);

}  // namespace efccl::runtime
