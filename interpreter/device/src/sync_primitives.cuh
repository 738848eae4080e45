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
// Every spin has a deadline (%globaltimer, per wait without progress) and polls the host-mapped
// stop signals; on expiry or abort the CTA posts its device's ErrorRecord (first one wins) and
// raises StopSignals::failed so that CTAs on every device bail out.
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
__device__ inline void post_error(const KernelParams& p, ErrorKind kind, const WaitSite& site,
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

/// Spins (thread 0 only) until `ready()`; false when the call must stop instead: a timeout
/// (posted here), an abort (posted here), or another CTA's failure.
template <typename Ready>
__device__ __forceinline__ bool spin_until(const KernelParams& p, const WaitSite& site,
                                           Ready ready) {
  if (ready()) return true;
  const uint64_t start = global_timer_ns();
  // Host-mapped signals cost a PCIe round trip: poll them (and the clock) every 256 spins,
  // which is well under a millisecond between checks.
  constexpr uint32_t kPollInterval = 256;
  for (uint32_t spins = 1;; ++spins) {
    if (ready()) return true;
    if (spins % kPollInterval != 0) continue;
    const uint64_t now = global_timer_ns();
    const uint64_t word = cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(
                              *reinterpret_cast<uint64_t*>(p.signals))
                              .load(cuda::memory_order_relaxed);
    StopSignals s;
    memcpy(&s, &word, sizeof(s));
    if (s.abort != 0) {
      post_error(p, kErrorAborted, site, now, now - start);
      return false;
    }
    if (s.failed != 0) return false;
    if (now - start > p.timeout_ns) {
      post_error(p, kErrorTimeout, site, now, now - start);
      return false;
    }
  }
}

/// Pushing side of a connection, as thread 0 drives it. `position` is the push count, kept in
/// a register by every thread during the launch and persisted at its end.
__device__ __forceinline__ bool wait_free_slot(const KernelParams& p, const SendConnection& c,
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
__device__ __forceinline__ bool wait_filled_slot(const KernelParams& p, const RecvConnection& c,
                                                 uint64_t position, WaitSite site) {
  site.wait = kWaitData;
  site.peer = c.peer;
  site.channel = c.channel;
  return spin_until(p, site, [&] { return load_acquire_system(c.tail) > position; });
}
__device__ __forceinline__ const char* slot_of(const RecvConnection& c, uint64_t position) {
  return c.slots + (position % c.nslots) * c.slot_stride;
}
/// After the CTA's barrier: the slot at `position` has been read and may be reused.
__device__ __forceinline__ void post_free_slot(const RecvConnection& c, uint64_t position) {
  store_release_system(c.head, position + 1);
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
