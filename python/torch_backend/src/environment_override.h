// efccl reads its per-communicator settings from the environment when a communicator is
// created (EFCCL_ALGO_FILES: the programs its registry loads; EFCCL_TIMEOUT_MS: its clique's
// kernel and call deadline; EFCCL_INIT_TIMEOUT_MS: the rendezvous deadline). A process group
// gives its communicator its own values by setting them around the creation, under one
// process-wide lock, and restoring them afterwards.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace efccl::torch_backend {

/// Defines the variables the overrides touch (empty when unset: efccl reads an empty value as
/// unset), so that later overrides replace values in place instead of growing the environment
/// while other threads may read it. Call once, early (at module import).
void prepare_environment_overrides();

/// Sets each (name, value) for its lifetime and restores the previous values on destruction;
/// holds the process-wide override lock meanwhile.
class EnvironmentOverride {
 public:
  explicit EnvironmentOverride(const std::vector<std::pair<std::string, std::string>>& values);
  ~EnvironmentOverride();
  EnvironmentOverride(const EnvironmentOverride&) = delete;
  EnvironmentOverride& operator=(const EnvironmentOverride&) = delete;

  /// The value `name` has outside any override ("" when unset); not from inside one.
  static std::string original(const std::string& name);

 private:
  std::unique_lock<std::mutex> lock_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace efccl::torch_backend
