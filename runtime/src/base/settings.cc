#include "base/settings.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

/// A decimal integer in [`min`, `max`] from `name`, else `fallback` (unset silently, bad
/// values with a warning saying what the variable takes).
uint64_t integer_setting(const char* name, uint64_t fallback, uint64_t min, uint64_t max,
                         const char* unit) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(v, &end, 10);
  if (end != nullptr && *end == '\0' && v[0] >= '0' && v[0] <= '9' && parsed >= min &&
      parsed <= max)
    return parsed;
  EFCCL_WARN(-1, std::string(name) + "=" + v + " is not a number of " + unit + " in " +
                     std::to_string(min) + ".." + std::to_string(max) + "; using " +
                     std::to_string(fallback));
  return fallback;
}

/// A decimal integer in [1, `max`] from `name`, else `fallback`.
uint64_t positive_integer(const char* name, uint64_t fallback, uint64_t max, const char* unit) {
  return integer_setting(name, fallback, 1, max, unit);
}

/// 0 or 1 from `name`, else `fallback` (unset silently, anything else with a warning).
bool switch_setting(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  EFCCL_WARN(-1, std::string(name) + "=" + v + " is neither 0 nor 1; using " +
                     (fallback ? "1" : "0"));
  return fallback;
}

}  // namespace

std::chrono::nanoseconds call_timeout() {
  constexpr uint64_t kDefaultMs = 600000;
  return std::chrono::milliseconds(
      positive_integer("EFCCL_TIMEOUT_MS", kDefaultMs, (uint64_t{1} << 40) - 1, "milliseconds"));
}

std::chrono::milliseconds init_timeout() {
  constexpr uint64_t kDefaultMs = 120000;
  return std::chrono::milliseconds(positive_integer("EFCCL_INIT_TIMEOUT_MS", kDefaultMs,
                                                    (uint64_t{1} << 40) - 1, "milliseconds"));
}

std::size_t executor_cache_capacity() {
  constexpr uint64_t kDefault = 256;
  return static_cast<std::size_t>(
      positive_integer("EFCCL_EXECUTOR_CACHE", kDefault, uint64_t{1} << 20, "executors"));
}

bool group_fusion_enabled() { return switch_setting("EFCCL_GROUP_FUSION", true); }

bool resident_enabled() { return switch_setting("EFCCL_RESIDENT", false); }

bool direct_enabled() { return switch_setting("EFCCL_DIRECT", true); }

bool direct_between_processes_enabled() {
  return direct_enabled() && switch_setting("EFCCL_DIRECT_PROCESSES", false);
}

int serve_processes_setting() {
  const char* v = std::getenv("EFCCL_SERVE_PROCESSES");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return -1;
  if (std::strcmp(v, "1") == 0) return 1;
  if (std::strcmp(v, "0") == 0) return 0;
  EFCCL_WARN(-1, std::string("EFCCL_SERVE_PROCESSES=") + v + " is not 0, 1 or auto; using auto");
  return -1;
}

std::size_t serve_min_bytes(bool under_mps_auto) {
  // Under MPS, four processes' calls were as fast served from 16 KiB and faster from 64 KiB
  // for every collective measured, while their small calls are no faster served
  // (docs/performance.md, "Served under MPS").
  constexpr uint64_t kUnderMps = uint64_t{64} << 10;
  return static_cast<std::size_t>(integer_setting(
      "EFCCL_SERVE_MIN_BYTES", under_mps_auto ? kUnderMps : 0, 0, uint64_t{1} << 40, "bytes"));
}

uint32_t resident_ctas() {
  constexpr uint64_t kDefault = 16;
  return static_cast<uint32_t>(positive_integer("EFCCL_RESIDENT_CTAS", kDefault, 128, "CTAs"));
}

bool balance_enabled() {
  const char* v = std::getenv("EFCCL_BALANCE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  EFCCL_WARN(-1, "EFCCL_BALANCE=" + std::string(v) + " is neither 0 nor 1; using 1");
  return true;
}

int balance_host_memory() {
  const char* v = std::getenv("EFCCL_BALANCE_HOST_MEMORY");
  if (v == nullptr || *v == '\0') return -1;
  if (std::strcmp(v, "1") == 0) return 1;
  if (std::strcmp(v, "0") == 0) return 0;
  EFCCL_WARN(-1, "EFCCL_BALANCE_HOST_MEMORY=" + std::string(v) +
                     " is neither 0 nor 1; using the default (0 on the machine graph, 1 on "
                     "EFCCL_BALANCE_TOPOLOGY)");
  return -1;
}

std::string balance_topology() {
  const char* v = std::getenv("EFCCL_BALANCE_TOPOLOGY");
  return v == nullptr ? "" : v;
}

std::string balance_stats_file() {
  const char* v = std::getenv("EFCCL_BALANCE_STATS");
  return v == nullptr ? "" : v;
}

std::string balance_force() {
  const char* v = std::getenv("EFCCL_BALANCE_FORCE");
  if (v == nullptr || *v == '\0') return "";
  if (std::strcmp(v, "spread") == 0) return v;
  EFCCL_WARN(-1, "EFCCL_BALANCE_FORCE=" + std::string(v) + " is not 'spread'; ignored");
  return "";
}

}  // namespace efccl::runtime
