// The two ends of a connection (sender, receiver, channel) as the kernel sees them: small,
// trivially copyable handles in the style of MSCCL++'s *DeviceHandle types. The host lays the
// memory out and fills them (ConnectionArena); a CTA copies its ends into shared memory and
// calls their methods. Plain data for the host code (C++20, g++); methods in device code only.
//
// Ordering protocol (one CTA per threadblock; thread 0 synchronises, all threads move data):
//   producer: all threads write -> __syncthreads -> thread 0 release-stores a counter
//   consumer: thread 0 acquire-loads until ready -> __syncthreads -> all threads read
// A release by thread 0 after the barrier covers the whole CTA's writes (PTX memory model:
// bar.sync is morally strong and release is cumulative). Counters cross devices and processes:
// system scope, which covers every memory a connection's slots may live in: the receiver's GPU,
// pinned host memory, or a third GPU's (ef::SlotLocation; the handles do not know which). LL
// and LL128 connections (WireFormat) carry flags inside the data instead of
// `tail` (prims_flagged.cuh). Freeing a slot (`head`): all threads read -> __syncthreads ->
// thread 0 stores head, relaxed (see post_free_slot).
//
// Network connections (ranks on different hosts, docs/net.md "The proxy transport"): each end's
// slots and counters are a block of its own host's pinned memory, and the proxies in between
// move the slots over sockets. The sender fills its block's slots, records each slot's byte
// count in `sizes` (only those bytes travel) and release-stores `tail`; its proxy raises `head`
// once a slot's bytes have left. The receiver's proxy fills the receiver's block and
// release-stores its `tail`; the receiver frees slots through `head`. The proxies read no LL or
// LL128 flags, so on a network connection those formats use the counters too: the sender also
// publishes `tail`, and the receiver waits for it before it polls the lines (which are whole by
// then).
//
// Counters only grow, across calls and graph replays; every wait is bounded (WaitBound).
#pragma once

#include <cstdint>

#include "wait_bound.h"
#include "wire_format.h"

namespace efccl::device {

/// The sending end of a connection; lives on the sender's device. Slots and `tail` are in the
/// connection's slot memory (the receiver's GPU, or where the program placed them: pinned host
/// memory or a slot device), written here through peer access, CUDA IPC or a host mapping;
/// `head` is in the sender's memory (with the slots for placed connections) and written by the
/// receiver.
struct SendConnectionDeviceHandle {
  char* slots;           ///< slot memory: `nslots` slots of `slot_stride` bytes
  uint64_t* tail;        ///< slot memory: units pushed so far (Simple, and network connections)
  uint64_t* head;        ///< sender's (or slot) memory: units popped (written by the receiver)
  uint64_t* position;    ///< sender's memory: this side's push count, persisted between calls
  /// Network connections only (else null): per slot, the wire bytes of the unit in it, written
  /// before `tail` (the proxy sends that many).
  uint32_t* sizes;
  uint64_t slot_stride;  ///< wire bytes per slot
  uint32_t nslots;
  int32_t peer;  ///< receiving rank
  int32_t channel;
  uint32_t wire;  ///< WireFormat, the same at both ends

#if defined(__CUDACC__)
  /// The push count where the previous launch left it (stream order makes it visible).
  __device__ __forceinline__ uint64_t load_position() const { return *position; }
  /// Thread 0 at the end of a launch: the push count for the next one.
  __device__ __forceinline__ void save_position(uint64_t value) const { *position = value; }

  /// `site` as a wait for a free slot of this connection.
  __device__ __forceinline__ WaitSite waiting_for_slot(WaitSite site) const {
    site.wait = kWaitSlot;
    site.peer = peer;
    site.channel = channel;
    return site;
  }
  /// Thread 0: waits until the slot for push number `position` is free (the receiver has popped
  /// all but nslots - 1 of the units before it); false when the call must stop instead.
  __device__ __forceinline__ bool wait_free_slot(const WaitBound& bound, uint64_t position,
                                                 const WaitSite& site) const {
    return bound.spin_until(waiting_for_slot(site),
                            [&] { return position - load_acquire_system(head) < nslots; });
  }
  /// The slot that push number `position` fills (in the slot memory).
  __device__ __forceinline__ char* slot(uint64_t position) const {
    return slots + (position % nslots) * slot_stride;
  }
  /// Thread 0, after the CTA's barrier (Simple, and network connections): the slot of push
  /// `position` is filled.
  __device__ __forceinline__ void post_filled_slot(uint64_t position) const {
    store_release_system(tail, position + 1);
  }
  /// A network connection: carries the counters for its proxy in every wire format.
  __device__ __forceinline__ bool network() const { return sizes != nullptr; }
  /// Thread 0, between the wait for the slot and post_filled_slot (network connections): the
  /// slot of push `position` holds `bytes` wire bytes. The release of `tail` orders it.
  __device__ __forceinline__ void record_size(uint64_t position, uint32_t bytes) const {
    sizes[position % nslots] = bytes;
  }
#endif
};

/// The receiving end of a connection; lives on the receiver's device.
struct RecvConnectionDeviceHandle {
  char* slots;           ///< slot memory (read; LL slots are also zeroed here)
  uint64_t* tail;        ///< slot memory: units pushed (Simple only)
  uint64_t* head;        ///< sender's (or slot) memory: units popped so far (written here)
  uint64_t* position;    ///< this device's memory: this side's pop count, persisted
  uint64_t slot_stride;  ///< wire bytes per slot
  uint32_t nslots;
  int32_t peer;  ///< sending rank
  int32_t channel;
  uint32_t wire;  ///< WireFormat
  /// Nonzero: a network connection, whose proxy publishes `tail` in every wire format (the
  /// flagged formats wait for it too).
  uint32_t network;
  uint32_t reserved;

#if defined(__CUDACC__)
  /// The pop count where the previous launch left it.
  __device__ __forceinline__ uint64_t load_position() const { return *position; }
  /// Thread 0 at the end of a launch: the pop count for the next one.
  __device__ __forceinline__ void save_position(uint64_t value) const { *position = value; }

  /// `site` as a wait for data on this connection.
  __device__ __forceinline__ WaitSite waiting_for_data(WaitSite site) const {
    site.wait = kWaitData;
    site.peer = peer;
    site.channel = channel;
    return site;
  }
  /// Thread 0 (Simple, and network connections): waits until pop number `position` has been
  /// pushed; false when the call must stop instead.
  __device__ __forceinline__ bool wait_filled_slot(const WaitBound& bound, uint64_t position,
                                                   const WaitSite& site) const {
    return bound.spin_until(waiting_for_data(site),
                            [&] { return load_acquire_system(tail) > position; });
  }
  /// The slot that pop number `position` reads.
  __device__ __forceinline__ const char* slot(uint64_t position) const {
    return slots + (position % nslots) * slot_stride;
  }
  /// Thread 0, after the CTA's barrier: the slot of pop `position` has been read and may be
  /// reused. Relaxed, as NCCL frees its slots: every thread's reads of the slot returned their
  /// values before the barrier (each value was stored or reduced), so no later write of the
  /// sender can reach them. A release here would make thread 0 wait for its own earlier stores
  /// to peer memory (a round trip over the link) before the next op.
  /// `wrote_slot`: the CTA also wrote the slot (LL's periodic zeroing); those writes must land
  /// before the sender's next ones, so the store is a release then.
  __device__ __forceinline__ void post_free_slot(uint64_t position, bool wrote_slot = false) const {
    if (wrote_slot)
      store_release_system(head, position + 1);
    else
      store_relaxed_system(head, position + 1);
  }

  /// LL: whether the slot of pop `position` must be zeroed once read. Each slot once every
  /// kLLClearPeriod positions, at the last `nslots` positions before a multiple of it (slots
  /// start zeroed, so a young connection never pays for it).
  __device__ __forceinline__ bool clear_due(uint64_t position) const {
    return position % kLLClearPeriod >= kLLClearPeriod - nslots;
  }
  /// All threads: zeroes the slot of pop `position`. Every warp must be done reading it (a
  /// line zeroed before its warp polled it would never arrive), and it is freed only after.
  __device__ __forceinline__ void clear_slot(uint64_t position) const {
    auto* at = reinterpret_cast<uint4*>(slots + (position % nslots) * slot_stride);
    for (uint64_t i = threadIdx.x; i < slot_stride / sizeof(uint4); i += blockDim.x)
      __stcg(at + i, make_uint4(0, 0, 0, 0));
  }
#endif
};

}  // namespace efccl::device
