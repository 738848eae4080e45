// What bounds every wait of the interpreter's CTAs: a deadline per wait without progress, the
// host's abort, and the failure of any other CTA; and where a CTA that gives up says why.
// Plain data shared by the host code (C++20, g++) and the kernels; the methods exist only in
// device code.
//
// Every spin has a deadline (%globaltimer) and polls the host-mapped stop signals; on expiry or
// abort the CTA posts its device's ErrorRecord (first one wins) and raises StopSignals::failed
// so that CTAs on every device bail out. Flag polls run in every warp; there only lane 0 reads
// the clock and the signals, every kWarpPollInterval spins.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cstring>

#include "scoped_atomics.cuh"
#endif

namespace efccl::device {

/// Per-device state that survives launches. Zero-initialised once; never reset between calls.
/// The launch count that forms the high half of every dependency flag is kept per CTA
/// (CallParams::epochs): every CTA of a launch runs to its end once, so all of them hold the
/// same value at the start of a launch, and each advances its own without an atomic or fence.
struct LaunchState {
  uint32_t error_claim;  ///< 0 until a CTA of this device claims its ErrorRecord
  uint32_t reserved;
};

/// What a CTA was waiting for when it gave up (ErrorRecord::wait).
enum WaitKind : uint32_t {
  kWaitNone = 0,
  kWaitData = 1,        ///< a filled slot (peer = sender)
  kWaitSlot = 2,        ///< a free slot (peer = receiver)
  kWaitDependency = 3,  ///< another op's flag (tb, op)
  kWaitProcessStart = 4,  ///< another process's launch on the GPU to start (peer = its slot)
  kWaitProcessEnd = 5,    ///< another process's launch on the GPU to end (peer = its slot)
};

/// Why a CTA stopped.
enum ErrorKind : uint32_t {
  kErrorNone = 0,
  kErrorTimeout = 1,
  kErrorAborted = 2,
  kErrorSkipped = 3,  ///< not run: an earlier call of the same fused launch failed on its CTA
};

/// The first failure on one device, in host-mapped memory so the host can read it while the
/// kernel still runs. Written once per device: the CTA that wins LaunchState::error_claim fills
/// the fields, fences, then sets `posted`.
struct ErrorRecord {
  uint32_t posted;  ///< 1 once the fields below are complete
  uint32_t kind;    ///< ErrorKind
  uint32_t wait;    ///< WaitKind
  int32_t rank;
  int32_t tb;
  int32_t op;       ///< index in the threadblock's op list
  int32_t peer;     ///< data/slot: the other rank; dependency: the threadblock waited for
  int32_t channel;  ///< data/slot: the channel; dependency: the op waited for
  uint64_t iteration;
  uint64_t timestamp_ns;  ///< %globaltimer when the CTA gave up (orders records across devices)
  uint64_t waited_ns;
};

/// Host-mapped stop signals read by every spin. Read together as one 64-bit word.
struct alignas(8) StopSignals {
  uint32_t abort;   ///< set by the host (DeviceExecutor::abort)
  uint32_t failed;  ///< set by any CTA that posted an error, so CTAs on all devices bail out
};

/// Where a CTA is blocked: filled into the ErrorRecord when it gives up.
struct WaitSite {
  int32_t rank;
  int32_t tb;
  int32_t op;
  uint64_t iteration;
  uint32_t wait;    ///< WaitKind
  int32_t peer;     ///< data/slot: other rank; dependency: threadblock
  int32_t channel;  ///< data/slot: channel; dependency: op
};

/// Spins of a warp polling flags between two checks of the clock and the stop signals. Every
/// waiting warp checks (not only one thread per CTA), so the interval is longer than
/// WaitBound::spin_until's; at a few hundred nanoseconds a spin (a load from this GPU's L2) a
/// check still comes well within the millisecond that abort() promises
/// (AbortStopsABlockedCallPromptly).
inline constexpr uint32_t kWarpPollInterval = 1024;

#if defined(__CUDACC__)
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

/// One launch's bound on its waits (a kernel argument): this device's error record and launch
/// state, the host-mapped stop signals shared by every device, and the deadline.
struct WaitBound {
  LaunchState* state;
  ErrorRecord* error;    ///< host-mapped, this device's record
  StopSignals* signals;  ///< host-mapped, shared by all devices
  uint64_t timeout_ns;   ///< per wait without progress; > 0

#if defined(__CUDACC__)
  /// Posts this device's first error (later ones are dropped) and tells every CTA to stop.
  __device__ inline void post_error(ErrorKind kind, const WaitSite& site, uint64_t now,
                                    uint64_t waited) const {
    if (atomicCAS(&state->error_claim, 0u, 1u) == 0u) {
      ErrorRecord* e = error;
      e->kind = kind;
      e->wait = site.wait;
      e->rank = site.rank;
      e->tb = site.tb;
      e->op = site.op;
      e->peer = site.peer;
      e->channel = site.channel;
      e->iteration = site.iteration;
      e->timestamp_ns = now;
      e->waited_ns = waited;
      store_release_system(&e->posted, 1u);  // host reads the fields after seeing `posted`
    }
    store_relaxed_system(&signals->failed, 1u);
  }

  /// One check of a waiting thread: true when it must stop (abort or timeout, posted here, or
  /// another CTA's failure). `start` is when the wait began.
  __device__ inline bool must_stop(const WaitSite& site, uint64_t start) const {
    const uint64_t now = global_timer_ns();
    const uint64_t word = load_relaxed_system(reinterpret_cast<uint64_t*>(signals));
    StopSignals s;
    memcpy(&s, &word, sizeof(s));
    if (s.abort != 0) {
      post_error(kErrorAborted, site, now, now - start);
      return true;
    }
    if (s.failed != 0) return true;
    if (now - start > timeout_ns) {
      post_error(kErrorTimeout, site, now, now - start);
      return true;
    }
    return false;
  }

  /// Spins (thread 0 only) until `ready()`; false when the call must stop instead: a timeout
  /// (posted here), an abort (posted here), or another CTA's failure.
  template <typename Ready>
  __device__ __forceinline__ bool spin_until(const WaitSite& site, Ready ready) const {
    if (ready()) return true;
    const uint64_t start = global_timer_ns();
    // Host-mapped signals cost a PCIe round trip: poll them (and the clock) every 256 spins,
    // which is well under a millisecond between checks.
    constexpr uint32_t kPollInterval = 256;
    for (uint32_t spins = 1;; ++spins) {
      if (ready()) return true;
      if (spins % kPollInterval != 0) continue;
      if (must_stop(site, start)) return false;
    }
  }

  /// Called by all 32 lanes of a warp after `spins` (warp-uniform) polls: lane 0 checks the
  /// deadline and the stop signals every kWarpPollInterval spins and tells the warp. `start` is
  /// lane 0's clock at the first check (0 before it).
  __device__ __forceinline__ bool warp_must_stop(const WaitSite& site, uint32_t spins,
                                                 uint64_t& start) const {
    if (spins % kWarpPollInterval != 0) return false;
    int stop = 0;
    if ((threadIdx.x & 31) == 0) {
      if (start == 0) start = global_timer_ns();
      stop = must_stop(site, start) ? 1 : 0;
    }
    return __shfl_sync(0xffffffffu, stop, 0) != 0;
  }
#endif
};

}  // namespace efccl::device
