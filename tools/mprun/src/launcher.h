// efccl-mprun's job: start N ranks of one command, forward their output line by line with a
// "[rank] " prefix, serve their rendezvous, and stop them all when one fails, when the time
// limit passes or when the launcher is interrupted.
#pragma once

#include <string>
#include <vector>

namespace efccl::mprun {

struct LaunchOptions {
  int nranks = 0;
  double timeout_s = 0;  ///< whole-job limit; 0: none
  double grace_s = 5;    ///< SIGTERM to SIGKILL
  std::string id_file;   ///< EFCCL_MPRUN_ID_FILE; empty: a file in a fresh temporary folder
  bool mps = false;      ///< a private MPS control daemon for the job (mps_daemon.h)
  /// Host identities the ranks get (NCCL_HOSTID), in contiguous blocks; 0: the machine's own.
  int hosts = 0;
  std::vector<std::string> command;
};

/// Exit statuses of the launcher besides a failed rank's own (its exit status, or 128 + the
/// signal that killed it).
inline constexpr int kExitTimeout = 124;      ///< the --timeout passed
inline constexpr int kExitLaunchError = 125;  ///< the launcher itself could not run the job

/// The host of `rank` of `nranks` spread over `hosts` (contiguous blocks whose sizes differ by
/// one at most: rank * hosts / nranks).
inline int host_of(int rank, int nranks, int hosts) {
  return static_cast<int>(static_cast<long long>(rank) * hosts / nranks);
}

/// Runs the job to its end; the launcher's exit status (0 when every rank exited 0).
int run_job(const LaunchOptions& options);

}  // namespace efccl::mprun
