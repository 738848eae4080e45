// The resident interpreter (docs/device-executor.md, "The resident interpreter"): opt-in, one
// long-lived interpreter grid per device and process that runs the calls streams post to it
// with memory operations, instead of a kernel launch per call. DeviceExecutor::run and
// run_batch use it for every eager (not captured) call whose CTAs fit the grid, and launch as
// before otherwise; results are identical either way.
//
//   device::ResidentConfig config;
//   config.enabled = true;                  // EFCCL_RESIDENT=1 in the runtime
//   device::set_resident_config(config);
//   device::retain_resident(0);             // while a communicator uses GPU 0
//   ... executor->run(args) ...             // posted, not launched
//   device::release_resident(0);            // the last release stops the grid (within 1 s)
#pragma once

#include <chrono>
#include <cstdint>

#include "efccl/common/status.h"

namespace efccl::device {

/// Process-wide settings; grids started after a change use the new ones.
struct ResidentConfig {
  bool enabled = false;
  /// CTAs of each device's grid (EFCCL_RESIDENT_CTAS, 1..128): calls needing more CTAs on a
  /// device (the threadblocks of its ranks, or of a fused group) are launched instead. Each CTA
  /// holds 256 threads and up to 128 registers per thread (half an H100 SM's register file)
  /// for as long as the grid runs.
  uint32_t ctas = 16;
  /// A grid with nothing posted and nothing running for this long leaves the GPU (so that
  /// cudaDeviceSynchronize and cudaFree, which wait for every kernel, return); the next post
  /// launches it again.
  std::chrono::microseconds idle = std::chrono::milliseconds(2);
};

void set_resident_config(const ResidentConfig& config);
ResidentConfig resident_config();

/// A communicator uses `device`'s grid from now on (counted). Nothing starts until a call is
/// posted.
void retain_resident(int device);
/// The matching release: the last one stops the device's grid and waits up to one second for
/// it to leave the GPU (then frees its memory). An error when it did not leave in time (a run
/// still waiting for a peer whose executor was not aborted); the grid then leaves once that
/// run ends.
Status release_resident(int device);

/// Makes `device`'s grid leave the GPU now and waits for it (at most one second), when every
/// call posted to it has run; an error (and nothing stopped) while some have not. The next post
/// launches it again, with the CTA count configured then.
Status quiesce_resident(int device);

/// Tests and logs.
struct ResidentStats {
  uint64_t posts = 0;          ///< descriptors posted (each replaces one interpreter launch)
  uint64_t new_contents = 0;   ///< posts that wrote a slot's content (the rest reused one)
  uint64_t no_slot = 0;        ///< posts refused for want of a free slot (launched instead)
  uint64_t grid_launches = 0;  ///< launches of a grid (first post, and after idle periods)
};
ResidentStats resident_stats();
/// Whether `device`'s grid is launched and not told to stop.
bool resident_running(int device);
/// The CTAs a descriptor may use on `device`: 0 when resident execution is off or unavailable.
uint32_t resident_capacity(int device);
/// Whether this process can run resident grids at all: only when CUDA loads kernels eagerly
/// (CUDA_MODULE_LOADING=EAGER, set before CUDA starts). Under lazy loading, the CUDA default,
/// loading a kernel may wait for every kernel of the device, and a running grid can make that
/// wait forever; resident execution is then off (a warning says so once) and calls are
/// launched.
bool resident_loading_allows();

}  // namespace efccl::device
