#include "efccl/common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace efccl {
namespace {

struct LoggerConfig {
  LogLevel level = LogLevel::kNone;      // NCCL prints nothing unless NCCL_DEBUG asks
  uint32_t subsys = kLogInit | kLogEnv;  // NCCL's default subsystem set
  FILE* file = stdout;
  std::string host;
};

const char* env_first(const char* a, const char* b) {
  const char* v = std::getenv(a);
  return v != nullptr ? v : std::getenv(b);
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

uint32_t subsys_bit(const std::string& name) {
  static constexpr std::pair<std::string_view, uint32_t> kNames[] = {
      {"INIT", kLogInit},   {"COLL", kLogColl},     {"P2P", kLogP2p},         {"NET", kLogNet},
      {"GRAPH", kLogGraph}, {"TUNING", kLogTuning}, {"BALANCE", kLogBalance}, {"ALLOC", kLogAlloc},
      {"ENV", kLogEnv},     {"ALL", kLogAll}};
  for (const auto& [n, bit] : kNames)
    if (name == n) return bit;
  return 0;  // unknown subsystems are ignored, as NCCL does
}

/// "INIT,COLL" or "^P2P,NET" (everything but), case-insensitive.
uint32_t parse_subsys(std::string_view spec) {
  bool invert = !spec.empty() && spec.front() == '^';
  if (invert) spec.remove_prefix(1);
  uint32_t mask = 0;
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    mask |= subsys_bit(upper(spec.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return invert ? ~mask : mask;
}

std::string expand_file_name(std::string_view pattern, const std::string& host) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'h') {
        out += host;
        ++i;
        continue;
      }
      if (pattern[i + 1] == 'p') {
        out += std::to_string(getpid());
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

LoggerConfig read_config() {
  return [] {
    LoggerConfig c;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    c.host = host;
    if (const char* d = env_first("EFCCL_DEBUG", "NCCL_DEBUG")) {
      const std::string v = upper(d);
      if (v == "VERSION")
        c.level = LogLevel::kVersion;
      else if (v == "WARN")
        c.level = LogLevel::kWarn;
      else if (v == "INFO")
        c.level = LogLevel::kInfo;
      else if (v == "TRACE")
        c.level = LogLevel::kTrace;
      else if (v == "NONE")
        c.level = LogLevel::kNone;
    }
    if (const char* s = env_first("EFCCL_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS"))
      c.subsys = parse_subsys(s);
    if (const char* f = env_first("EFCCL_DEBUG_FILE", "NCCL_DEBUG_FILE")) {
      if (FILE* file = std::fopen(expand_file_name(f, c.host).c_str(), "w")) c.file = file;
    }
    return c;
  }();
}

/// Replaced by reload_log_config(); old configurations are kept (a line may be using one).
std::atomic<const LoggerConfig*> g_config{nullptr};

const LoggerConfig& config() {
  const LoggerConfig* c = g_config.load(std::memory_order_acquire);
  if (c != nullptr) return *c;
  auto* fresh = new LoggerConfig(read_config());
  if (!g_config.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return *c;
  }
  return *fresh;
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
std::function<void(const std::string&)>& sink() {
  static std::function<void(const std::string&)> s;
  return s;
}
std::atomic<bool> g_sink_installed{false};  // lets log_enabled() skip the mutex
std::atomic<int (*)()> g_device_query{nullptr};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kVersion:
      return "VERSION";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kTrace:
      return "TRACE";
    default:
      return "";
  }
}

}  // namespace

bool log_enabled(LogLevel level, uint32_t subsys) {
  if (g_sink_installed.load(std::memory_order_relaxed)) return true;  // tests see every line
  const LoggerConfig& c = config();
  if (static_cast<int>(level) > static_cast<int>(c.level)) return false;
  // Warnings are never filtered by subsystem (NCCL's rule).
  return level <= LogLevel::kWarn || (subsys & c.subsys) != 0;
}

void log_line(LogLevel level, uint32_t subsys, int device, const std::string& message) {
  const LoggerConfig& c = config();
  if (device < 0) {
    int (*query)() = g_device_query.load(std::memory_order_acquire);
    device = query != nullptr ? query() : -1;
  }
  const std::string line = c.host + ":" + std::to_string(getpid()) + ":" +
                           std::to_string(static_cast<long>(syscall(SYS_gettid))) + " [" +
                           std::to_string(device) + "] EFCCL " + level_name(level) + " " + message;
  const bool wanted = static_cast<int>(level) <= static_cast<int>(c.level) &&
                      (level <= LogLevel::kWarn || (subsys & c.subsys) != 0);
  if (wanted) {
    std::fprintf(c.file, "%s\n", line.c_str());
    std::fflush(c.file);
  }
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink()) sink()(line);
}

void reload_log_config() {
  g_config.store(new LoggerConfig(read_config()), std::memory_order_release);
}

void set_log_device_query(int (*query)()) {
  g_device_query.store(query, std::memory_order_release);
}

void set_log_sink(std::function<void(const std::string& line)> s) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink() = std::move(s);
  g_sink_installed.store(static_cast<bool>(sink()), std::memory_order_relaxed);
}

}  // namespace efccl
