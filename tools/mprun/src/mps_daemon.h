// efccl-mprun --mps: a private MPS control daemon for the job (docs/runtime.md, "Several
// processes on one GPU"). Ranks of different processes on one GPU time-slice without MPS;
// with it their kernels run side by side. The daemon's pipe and log folders live in the job's
// temporary folder, so it serves this job's ranks only, and it is told to quit at the end.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::mprun {

class MpsDaemon {
 public:
  /// Starts `nvidia-cuda-mps-control -d` (found in PATH) with its pipe and log folders under
  /// `folder`, and waits (at most `timeout_s`) until its control pipe exists.
  static StatusOr<MpsDaemon> start(const std::filesystem::path& folder, double timeout_s = 10);
  MpsDaemon(MpsDaemon&& other) noexcept { *this = std::move(other); }
  MpsDaemon& operator=(MpsDaemon&& other) noexcept {
    std::swap(pipe_dir_, other.pipe_dir_);
    std::swap(log_dir_, other.log_dir_);
    return *this;
  }
  ~MpsDaemon() { (void)stop(); }

  /// The variables every rank needs to reach this daemon.
  std::vector<std::pair<std::string, std::string>> environment() const;
  /// Tells the daemon to quit (`quit` on its control) and waits, at most `timeout_s`, until its
  /// control pipe is gone. Idempotent.
  Status stop(double timeout_s = 10);

 private:
  MpsDaemon() = default;
  std::filesystem::path pipe_dir_, log_dir_;
};

}  // namespace efccl::mprun
