// Primitives over Simple connections: a slot holds the tile's bytes as they are.
//
// Direct transfers (ranks sharing a GPU in one launch; kernel_params.h, DirectBits): a pop may
// read the sender's memory instead of the slot, or find its value already in its dst; a push
// may write the receiver's memory instead of the slot, or nothing (the receiver pulls). The
// counters are waited for and posted exactly as with slots, so only where bytes go changes.
//
// Per unit: wait(): thread 0 waits (after the decoder's dependencies: a filled slot to pop, a
// free slot to push), a barrier releases the CTA; move(): all threads move the tile
// (reduce_copy: 16-byte vectors when every pointer allows, elements otherwise), a second
// barrier (on a network connection thread 0 records the unit's bytes before it, which the
// release of `tail` publishes with the tile); post(): thread 0 publishes `tail` to the receiver
// and `head` to the sender.
#pragma once

#include <cstdint>

#include "primitives.cuh"

namespace efccl::device {
namespace {

template <typename E, Reduction R>
class Primitives<E, R, ProtoSimple> {
 public:
  __device__ __forceinline__ Primitives(const WaitBound& bound, ThreadblockConnections& connections,
                                        const Scalar<E>& scalar)
      : bound_(bound), ends_(connections), scalar_(scalar) {}

  /// All threads: thread 0 waits for a filled slot to pop and a free slot to push (after the
  /// decoder's dependency wait, `deps_ready`); a barrier releases the CTA. False when the call
  /// must stop (posted).
  __device__ __forceinline__ bool wait(const Transfer& t, bool gated, bool deps_ready,
                                       const WaitSite& site) {
    bool ready = true;
    if (threadIdx.x == 0) {
      ready = deps_ready &&
              (!t.pops || ends_.recv->wait_filled_slot(bound_, ends_.recv_position, site)) &&
              (!t.pushes || ends_.send->wait_free_slot(bound_, ends_.send_position, site));
    }
    return !__syncthreads_or(!ready);
  }

  /// All threads, after wait(): moves the unit's `n` elements, then a barrier. Always true.
  __device__ __forceinline__ bool move(const Transfer& t, uint64_t n, const WaitSite& site) {
    UnitOperands u = t.operands;
    if (t.pops) {
      if (t.pop_mode == kDirectPull) {
        u.left = t.pulled;
      } else if (t.pop_mode == kDirectPushed) {  // the sender wrote the value into dst
        u.left = u.dst;
        u.dst = nullptr;
      } else {
        u.left = ends_.recv->slot(ends_.recv_position);
      }
    }
    if (t.pushes) {
      if (t.push_mode == kDirectPush)
        u.slot = t.push_to;
      else if (t.push_mode != kDirectPulled)  // pulled: the receiver reads it where it is
        u.slot = ends_.send->slot(ends_.send_position);
    }
    if (u.dst != nullptr || u.slot != nullptr) reduce_copy<E, R>(u, n, scalar_);
    if (threadIdx.x == 0 && t.pushes && ends_.send->network())
      ends_.send->record_size(ends_.send_position,
                              static_cast<uint32_t>(n * sizeof(typename E::Storage)));
    __syncthreads();
    return true;
  }

  /// After move() (thread 0 posts): `tail` to the receiver, `head` to the sender; every thread
  /// advances its positions.
  __device__ __forceinline__ void post(const Transfer& t) {
    if (threadIdx.x == 0) {
      if (t.pushes) ends_.send->post_filled_slot(ends_.send_position);
      if (t.pops) ends_.recv->post_free_slot(ends_.recv_position);
    }
    ends_.advance(t);
  }

  /// Thread 0, at the end of the launch.
  __device__ __forceinline__ void save_positions() const { ends_.save_positions(); }

 private:
  const WaitBound& bound_;
  ThreadblockConnections& ends_;
  const Scalar<E>& scalar_;
};

}  // namespace
}  // namespace efccl::device
