// The one logger: NCCL's line shape (`host:pid:tid [dev] EFCCL INFO ...`), levels from
// EFCCL_DEBUG (or NCCL_DEBUG), subsystem filter from EFCCL_DEBUG_SUBSYS (or NCCL_DEBUG_SUBSYS),
// output to stdout or EFCCL_DEBUG_FILE / NCCL_DEBUG_FILE (with %h and %p expanded).
#pragma once

#include <cstdarg>
#include <cstdint>
#include <string>

namespace efccl::runtime {

enum class LogLevel : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kTrace = 4 };

/// Bit flags, as NCCL_DEBUG_SUBSYS names them.
enum LogSubsys : uint32_t {
  kLogInit = 1u << 0,
  kLogColl = 1u << 1,
  kLogP2p = 1u << 2,
  kLogNet = 1u << 3,
  kLogGraph = 1u << 4,
  kLogTuning = 1u << 5,
  kLogBalance = 1u << 6,
  kLogAlloc = 1u << 7,
  kLogEnv = 1u << 8,
  kLogAll = ~0u,
};

/// True when a message of this level and subsystem would be written (cheap; check before
/// building an expensive message).
bool log_enabled(LogLevel level, uint32_t subsys);

/// Writes one line when enabled. `device` < 0: the calling thread's current CUDA device.
void log_line(LogLevel level, uint32_t subsys, int device, const std::string& message);

/// Reads the logging environment variables again (ncclResetDebugInit).
void reload_log_config();

}  // namespace efccl::runtime

#define EFCCL_LOG(level, subsys, device, message)                                  \
  do {                                                                             \
    if (::efccl::runtime::log_enabled((level), (subsys)))                          \
      ::efccl::runtime::log_line((level), (subsys), (device), (message));          \
  } while (0)
#define EFCCL_INFO(subsys, device, message) \
  EFCCL_LOG(::efccl::runtime::LogLevel::kInfo, (subsys), (device), (message))
#define EFCCL_WARN(device, message) \
  EFCCL_LOG(::efccl::runtime::LogLevel::kWarn, ::efccl::runtime::kLogAll, (device), (message))
