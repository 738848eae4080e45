// The interpreter's synchronisation on the GPU: connection FIFOs (free slot / filled slot),
// dependency flags, and the bounded spin behind every wait.
//
// Ordering protocol (one CTA per threadblock; thread 0 synchronises, all threads move data):
//   producer: all threads write -> __syncthreads -> thread 0 release-stores a counter/flag
//   consumer: thread 0 acquire-loads until ready -> __syncthreads -> all threads read
// A release by thread 0 after the barrier covers the whole CTA's writes (PTX memory model:
// bar.sync is morally strong and release is cumulative). Counters that cross devices use system
// scope, dependency flags (same rank, same device) device scope.
//
// LL and LL128 connections (WireFormat) replace the tail counter by flags inside the data:
//   producer: every thread stores its lines (data and flag in one store), nothing else
//   consumer: every thread polls its own lines until their flags are this slot use's
// Freeing a slot (head): all threads read -> __syncthreads -> thread 0 stores head (relaxed:
// the reads have returned, see post_free_slot).
//
// Every spin has a deadline (%globaltimer, per wait without progress) and polls the host-mapped
// stop signals; on expiry or abort the CTA posts its device's ErrorRecord (first one wins) and
// raises StopSignals::failed so that CTAs on every device bail out. Flag polls run in every
// warp; there only lane 0 reads the clock and the signals, every kWarpPollInterval spins.
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "kernel_params.h"

namespace efccl::device {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <typename T>
__device__ __forceinline__ T load_acquire_system(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}
template <typename T>
__device__ __forceinline__ void store_release_system(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}
template <typename T>
__device__ __forceinline__ void store_relaxed_system(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_relaxed);
}
template <typename T>
__device__ __forceinline__ T load_acquire_device(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).load(cuda::memory_order_acquire);
}
template <typename T>
__device__ __forceinline__ void store_release_device(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_device>(*p).store(v, cuda::memory_order_release);
}

/// Where a CTA is blocked: filled into the ErrorRecord when it gives up.
struct WaitSite {
  int32_t rank;
  int32_t tb;
  int32_t op;
  uint64_t iteration;
  uint32_t wait;  ///< WaitKind
  int32_t peer;   ///< data/slot: other rank; dependency: threadblock
  int32_t channel;///< data/slot: channel; dependency: op
};

/// Posts this device's first error (later ones are dropped) and tells every CTA to stop.
__device__ inline void post_error(const CallParams& p, ErrorKind kind, const WaitSite& site,
                                  uint64_t now, uint64_t waited) {
  if (atomicCAS(&p.state->error_claim, 0u, 1u) == 0u) {
    ErrorRecord* e = p.error;
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
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(p.signals->failed)
      .store(1u, cuda::memory_order_relaxed);
}

/// One check of a waiting thread: true when it must stop (abort or timeout, posted here, or
/// another CTA's failure). `start` is when the wait began.
__device__ inline bool must_stop(const CallParams& p, const WaitSite& site, uint64_t start) {
  const uint64_t now = global_timer_ns();
  const uint64_t word =
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*reinterpret_cast<uint64_t*>(p.signals))
          .load(cuda::memory_order_relaxed);
  StopSignals s;
  memcpy(&s, &word, sizeof(s));
  if (s.abort != 0) {
    post_error(p, kErrorAborted, site, now, now - start);
    return true;
  }
  if (s.failed != 0) return true;
  if (now - start > p.timeout_ns) {
    post_error(p, kErrorTimeout, site, now, now - start);
    return true;
  }
  return false;
}

/// Spins (thread 0 only) until `ready()`; false when the call must stop instead: a timeout
/// (posted here), an abort (posted here), or another CTA's failure.
template <typename Ready>
__device__ __forceinline__ bool spin_until(const CallParams& p, const WaitSite& site,
                                           Ready ready) {
  if (ready()) return true;
  const uint64_t start = global_timer_ns();
  // Host-mapped signals cost a PCIe round trip: poll them (and the clock) every 256 spins,
  // which is well under a millisecond between checks.
  constexpr uint32_t kPollInterval = 256;
  for (uint32_t spins = 1;; ++spins) {
    if (ready()) return true;
    if (spins % kPollInterval != 0) continue;
    if (must_stop(p, site, start)) return false;
  }
}

/// Spins of a warp polling flags between two checks of the clock and the stop signals. Every
/// waiting warp checks (not only one thread per CTA), so the interval is longer than
/// spin_until's; at a few hundred nanoseconds a spin (a load from this GPU's L2) a check still
/// comes well within the millisecond that abort() promises (AbortStopsABlockedCallPromptly).
inline constexpr uint32_t kWarpPollInterval = 1024;

/// Called by all 32 lanes of a warp after `spins` (warp-uniform) polls: lane 0 checks the
/// deadline and the stop signals every kWarpPollInterval spins and tells the warp. `start` is
/// lane 0's clock at the first check (0 before it).
__device__ __forceinline__ bool warp_must_stop(const CallParams& p, const WaitSite& site,
                                               uint32_t spins, uint64_t& start) {
  if (spins % kWarpPollInterval != 0) return false;
  int stop = 0;
  if ((threadIdx.x & 31) == 0) {
    if (start == 0) start = global_timer_ns();
    stop = must_stop(p, site, start) ? 1 : 0;
  }
  return __shfl_sync(0xffffffffu, stop, 0) != 0;
}

// ---- LL and LL128 lines ----

/// The flag of every LL line of the slot use at connection position `position`: never 0 (the
/// value of a zeroed slot), and distinct from the flag of any line written less than 2^31
/// positions earlier (kLLClearPeriod keeps every line younger than that).
__device__ __forceinline__ uint32_t ll_flag(uint64_t position) {
  return static_cast<uint32_t>(position & 0x7fffffffu) + 1;
}
/// The flag of LL128 lines: 64 bits never wrap, so only 0 (a zeroed slot) must be avoided.
__device__ __forceinline__ uint64_t ll128_flag(uint64_t position) { return position + 1; }

/// 16 bytes of wire: two 8-byte words, each read or written as one access (an LL line is one
/// word; LL128 relies on the whole warp-wide instruction, see WireFormat). System scope and
/// relaxed: the flag inside the data orders them, and the loads must not hit a stale L1.
__device__ __forceinline__ ulonglong2 load_wire(const char* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v.x), "=l"(v.y)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void store_wire(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

/// Pushing side of a connection, as thread 0 drives it. `position` is the push count, kept in
/// a register by every thread during the launch and persisted at its end.
__device__ __forceinline__ bool wait_free_slot(const CallParams& p, const SendConnection& c,
                                               uint64_t position, WaitSite site) {
  site.wait = kWaitSlot;
  site.peer = c.peer;
  site.channel = c.channel;
  return spin_until(p, site, [&] { return position - load_acquire_system(c.head) < c.nslots; });
}
__device__ __forceinline__ char* slot_of(const SendConnection& c, uint64_t position) {
  return c.slots + (position % c.nslots) * c.slot_stride;
}
/// After the CTA's barrier: the slot at `position` is filled.
__device__ __forceinline__ void post_filled_slot(const SendConnection& c, uint64_t position) {
  store_release_system(c.tail, position + 1);
}

/// Popping side of a connection.
__device__ __forceinline__ bool wait_filled_slot(const CallParams& p, const RecvConnection& c,
                                                 uint64_t position, WaitSite site) {
  site.wait = kWaitData;
  site.peer = c.peer;
  site.channel = c.channel;
  return spin_until(p, site, [&] { return load_acquire_system(c.tail) > position; });
}
__device__ __forceinline__ const char* slot_of(const RecvConnection& c, uint64_t position) {
  return c.slots + (position % c.nslots) * c.slot_stride;
}
/// After the CTA's barrier: the slot at `position` has been read and may be reused. Relaxed,
/// as NCCL frees its slots: every thread's reads of the slot returned their values before the
/// barrier (each value was stored or reduced), so no later write of the sender can reach them.
/// A release here would make thread 0 wait for its own earlier stores to peer memory (a
/// round trip over the link) before the next op.
/// `wrote_slot`: the CTA also wrote the slot (LL's periodic zeroing); those writes must land
/// before the sender's next ones, so the store is a release then.
__device__ __forceinline__ void post_free_slot(const RecvConnection& c, uint64_t position,
                                               bool wrote_slot = false) {
  if (wrote_slot)
    store_release_system(c.head, position + 1);
  else
    store_relaxed_system(c.head, position + 1);
}

/// A dependency flag's value once op `i` has completed iteration `j` in launch `epoch`. Flags
/// only grow within a launch and each launch starts above every value of the previous ones,
/// so nothing is reset between calls; the comparison is modular, so the 32-bit epoch may wrap.
__device__ __forceinline__ uint64_t flag_value(uint64_t epoch, uint64_t iteration) {
  return (epoch << 32) | (iteration + 1);
}
__device__ __forceinline__ bool flag_reached(uint64_t flag, uint64_t target) {
  return static_cast<int64_t>(flag - target) >= 0;
}

}  // namespace efccl::device
