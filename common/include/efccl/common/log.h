// The one logger: NCCL's line shape (`host:pid:tid [dev] EFCCL INFO ...`), levels from
// EFCCL_DEBUG (or NCCL_DEBUG), subsystem filter from EFCCL_DEBUG_SUBSYS (or NCCL_DEBUG_SUBSYS),
// output to stdout or EFCCL_DEBUG_FILE / NCCL_DEBUG_FILE (with %h and %p expanded).
//
// As NCCL's: silent unless asked. With neither variable set nothing is written; VERSION writes
// the version line, WARN adds warnings (never filtered by subsystem), INFO adds the subsystems
// of the filter (default INIT,ENV), TRACE everything.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <functional>
#include <string>

namespace efccl {

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

/// Writes one line when enabled. `device` < 0: the calling thread's current CUDA device as the
/// installed device query reports it (none installed, or none current: -1).
void log_line(LogLevel level, uint32_t subsys, int device, const std::string& message);

/// Reads the logging environment variables again (ncclResetDebugInit).
void reload_log_config();

/// How the logger learns the calling thread's CUDA device for lines that do not name one.
/// This layer has no CUDA; the runtime installs cudaGetDevice behind it when it loads.
void set_log_device_query(int (*query)());

/// Receives every log line in addition to the log file, whatever the level (tests and tools
/// watch the library's decisions through it); empty: none.
void set_log_sink(std::function<void(const std::string& line)> sink);

}  // namespace efccl

#define EFCCL_LOG(level, subsys, device, message)                \
  do {                                                           \
    if (::efccl::log_enabled((level), (subsys)))                 \
      ::efccl::log_line((level), (subsys), (device), (message)); \
  } while (0)
#define EFCCL_INFO(subsys, device, message) \
  EFCCL_LOG(::efccl::LogLevel::kInfo, (subsys), (device), (message))
#define EFCCL_WARN(device, message) \
  EFCCL_LOG(::efccl::LogLevel::kWarn, ::efccl::kLogAll, (device), (message))
