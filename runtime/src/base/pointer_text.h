// How the logs and messages print a handle or buffer address (NCCL's "comm 0x..." lines).
#pragma once

#include <cstdio>
#include <string>

namespace efccl::runtime {

/// `p` as "%p" prints it, e.g. "0x7f3a1c000b70".
inline std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace efccl::runtime
