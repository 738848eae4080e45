#include "environment_override.h"

#include <cstdlib>

namespace efccl::torch_backend {
namespace {

std::mutex& override_mutex() {
  static std::mutex m;
  return m;
}

const char* const kOverridden[] = {"EFCCL_ALGO_FILES", "EFCCL_TIMEOUT_MS", "EFCCL_INIT_TIMEOUT_MS"};

}  // namespace

void prepare_environment_overrides() {
  std::lock_guard<std::mutex> lock(override_mutex());
  for (const char* name : kOverridden)
    if (std::getenv(name) == nullptr) ::setenv(name, "", 0);
}

std::string EnvironmentOverride::original(const std::string& name) {
  // Under the lock: another thread's override is never seen half-way (they restore before
  // releasing it).
  std::lock_guard<std::mutex> lock(override_mutex());
  const char* v = std::getenv(name.c_str());
  return v != nullptr ? v : "";
}

EnvironmentOverride::EnvironmentOverride(
    const std::vector<std::pair<std::string, std::string>>& values)
    : lock_(override_mutex()) {
  for (const auto& [name, value] : values) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
}

EnvironmentOverride::~EnvironmentOverride() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second)
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    else
      ::unsetenv(it->first.c_str());
  }
}

}  // namespace efccl::torch_backend
