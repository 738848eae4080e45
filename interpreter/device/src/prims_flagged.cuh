// Primitives over LL and LL128 connections (WireFormat): data travels with flags, so a sender
// waits for a free slot and stores its lines (no tail to publish, so no fence), and a receiver
// does not wait for a tail and a barrier: each warp polls the lines it is about to use, so a
// unit's first bytes are used as soon as they land. The barrier after a unit stays (the slot is
// freed through head, and ops of one threadblock hand data to each other through memory). Units
// without a connection (copy, reduce) move exactly as over Simple (reduce_copy).
#pragma once

#include <cstdint>

#include "primitives.cuh"

namespace efccl::device {
namespace {

// ---- The lines ----

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

// ---- One unit ----

/// A flagged unit's connection ends: where it pops and pushes (slots in each connection's slot
/// memory), in which format, and the flags of those slot uses.
struct Wire {
  const char* in = nullptr;  ///< null when the op does not pop (then UnitOperands::left is memory)
  char* out = nullptr;       ///< null when the op does not push
  uint32_t in_format = kWireLL;
  uint32_t out_format = kWireLL;
  uint64_t in_position = 0;
  uint64_t out_position = 0;
};

/// One lane's share of a 120-byte group: at most 16 bytes, elements never straddling lanes
/// (every share starts at a multiple of 8 bytes of the tile).
template <typename S>
union Part {
  uint64_t word[2];
  S element[16 / sizeof(S)];
};

/// Reads `nbytes` (a multiple of the element size, at most 16) of user memory at `from`:
/// 8-byte words where the address allows, elements otherwise (user buffers need only be
/// element-aligned).
template <typename S>
__device__ __forceinline__ void load_part(Part<S>& part, const char* from, uint32_t nbytes) {
  uint32_t done = 0;
  if ((reinterpret_cast<uintptr_t>(from) & 7) == 0) {
    const auto* words = reinterpret_cast<const unsigned long long*>(from);
    if (nbytes >= 8) part.word[0] = __ldcg(words);
    if (nbytes >= 16) part.word[1] = __ldcg(words + 1);
    done = nbytes & ~7u;
  }
  const S* elements = reinterpret_cast<const S*>(from);
#pragma unroll
  for (uint32_t i = 0; i < 16 / sizeof(S); ++i)
    if (i * sizeof(S) >= done && i * sizeof(S) < nbytes) part.element[i] = elements[i];
}

template <typename S>
__device__ __forceinline__ void store_part(const Part<S>& part, char* to, uint32_t nbytes) {
  uint32_t done = 0;
  if ((reinterpret_cast<uintptr_t>(to) & 7) == 0) {
    auto* words = reinterpret_cast<unsigned long long*>(to);
    if (nbytes >= 8) __stcg(words, static_cast<unsigned long long>(part.word[0]));
    if (nbytes >= 16) __stcg(words + 1, static_cast<unsigned long long>(part.word[1]));
    done = nbytes & ~7u;
  }
  S* elements = reinterpret_cast<S*>(to);
#pragma unroll
  for (uint32_t i = 0; i < 16 / sizeof(S); ++i)
    if (i * sizeof(S) >= done && i * sizeof(S) < nbytes) elements[i] = part.element[i];
}

__device__ __forceinline__ uint64_t ll_data(uint64_t line) { return line & 0xffffffffu; }
__device__ __forceinline__ uint32_t ll_line_flag(uint64_t line) {
  return static_cast<uint32_t>(line >> 32);
}

/// Moves (and reduces) the `n` elements (`groups` 120-byte groups) of one unit of a flagged
/// program with all threads of the CTA; false when a poll had to stop (timeout, abort: posted),
/// in which case the caller stops the CTA.
///
/// Lanes 8r .. 8r+7 of a warp handle one 120-byte group (see WireFormat), and each lane
/// kUnroll groups of a stride of 4, so that every lane has kUnroll user loads, or slot polls,
/// in flight before it waits. Loops and polls are warp-uniform: the LL128 flag vote and the
/// stop checks need all 32 lanes.
template <typename E, Reduction R, UnitKind K, int kUnroll>
__device__ __forceinline__ bool process_flagged_as(const UnitOperands& u, const Wire& w, uint64_t n,
                                                   uint64_t groups, const Scalar<E>& scalar,
                                                   const WaitBound& bound, const WaitSite& site) {
  using S = typename E::Storage;
  constexpr uint32_t kFullMask = 0xffffffffu;
  const uint64_t bytes = n * sizeof(S);
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t share = lane & 7;  ///< which 16 bytes of the group
  const uint32_t capacity = share == 7 ? 8 : 16;
  const uint64_t warp_stride = static_cast<uint64_t>(blockDim.x >> 5) * 4 * kUnroll;
  const uint32_t in_ll = ll_flag(w.in_position);
  const uint64_t in_ll128 = ll128_flag(w.in_position);
  const uint64_t out_ll = static_cast<uint64_t>(ll_flag(w.out_position)) << 32;
  const uint64_t out_ll128 = ll128_flag(w.out_position);

  for (uint64_t warp_base = (threadIdx.x >> 5) * 4 * kUnroll; warp_base < groups;
       warp_base += warp_stride) {
    const uint64_t base = warp_base + (lane >> 3);  ///< this lane's first group; then +4, +8..
    uint32_t nbytes[kUnroll];  ///< of the share inside the tile (the last group may be short)
    Part<S> left[kUnroll], right[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint64_t offset = (base + 4 * k) * kGroupDataBytes + 16 * share;
      nbytes[k] =
          offset < bytes ? static_cast<uint32_t>(min(uint64_t{capacity}, bytes - offset)) : 0;
      left[k].word[0] = left[k].word[1] = 0;
      right[k].word[0] = right[k].word[1] = 0;
      // User operands first: their latency overlaps the wait for the slot.
      if (w.in == nullptr) load_part(left[k], u.left + offset, nbytes[k]);
      if (u.right != nullptr) load_part(right[k], u.right + offset, nbytes[k]);
    }

    if (w.in != nullptr) {
      const bool ll128 = w.in_format == kWireLL128;
      // Loads this lane's wire of group base + 4k into left[k]; true when its flags are this
      // slot use's (LL128: only lane 7 holds the group's flag; see the vote below).
      const auto fetch = [&](int k) {
        const uint64_t group = base + 4 * k;
        if (ll128) {
          const ulonglong2 v = load_wire(w.in + group * kLL128LineBytes + 16 * share);
          left[k].word[0] = v.x;
          left[k].word[1] = v.y;  // lane 7: the flag, beyond its 8 bytes
          return share != 7 || v.y == in_ll128;
        }
        const char* at = w.in + 2 * (group * kGroupDataBytes + 16 * share);
        const ulonglong2 a = load_wire(at);
        const ulonglong2 b = share != 7 ? load_wire(at + 16) : a;
        left[k].word[0] = ll_data(a.x) | ll_data(a.y) << 32;
        left[k].word[1] = ll_data(b.x) | ll_data(b.y) << 32;
        return ll_line_flag(a.x) == in_ll && ll_line_flag(a.y) == in_ll &&
               ll_line_flag(b.x) == in_ll && ll_line_flag(b.y) == in_ll;
      };
      uint32_t pending = 0;  ///< groups (bit k) whose lines this lane still waits for
#pragma unroll
      for (int k = 0; k < kUnroll; ++k)
        if (base + 4 * k < groups && !fetch(k)) pending |= 1u << k;
      uint64_t start = 0;
      for (uint32_t spins = 1;; ++spins) {
        if (ll128) {
          // A group has arrived when its flag lane says so; its 8 lanes then use the data they
          // loaded in the same instruction, or reload together.
#pragma unroll
          for (int k = 0; k < kUnroll; ++k) {
            const bool late = __shfl_sync(kFullMask, (pending >> k) & 1, lane | 7) != 0;
            pending = (pending & ~(1u << k)) | (late ? 1u << k : 0);
          }
        }
        if (!__any_sync(kFullMask, pending != 0)) break;
        if (bound.warp_must_stop(site, spins, start)) return false;
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
          if (((pending >> k) & 1) && fetch(k)) pending &= ~(1u << k);
      }
    }

#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if constexpr (K != UnitKind::kCopy) {
#pragma unroll
        for (uint32_t e = 0; e < 16 / sizeof(S); ++e)
          left[k].element[e] = combine<E, R, K>(u, scalar, left[k].element[e], right[k].element[e]);
      }
      const uint64_t group = base + 4 * k;
      const uint64_t offset = group * kGroupDataBytes + 16 * share;
      if (u.dst != nullptr) store_part(left[k], u.dst + offset, nbytes[k]);
      if (w.out != nullptr && group < groups) {
        if (w.out_format == kWireLL128) {
          store_wire(w.out + group * kLL128LineBytes + 16 * share, left[k].word[0],
                     share == 7 ? out_ll128 : left[k].word[1]);
        } else {
          char* at = w.out + 2 * offset;
          store_wire(at, out_ll | ll_data(left[k].word[0]), out_ll | (left[k].word[0] >> 32));
          if (share != 7)
            store_wire(at + 16, out_ll | ll_data(left[k].word[1]),
                       out_ll | (left[k].word[1] >> 32));
        }
      }
    }
  }
  return true;
}

template <typename E, Reduction R>
__device__ __forceinline__ bool process_flagged(const UnitOperands& u, const Wire& w, uint64_t n,
                                                const Scalar<E>& scalar, const WaitBound& bound,
                                                const WaitSite& site) {
  using S = typename E::Storage;
  const uint64_t groups = (n * sizeof(S) + kGroupDataBytes - 1) / kGroupDataBytes;
  // Small tiles (the latency-bound case LL exists for) need one group per lane at most: one
  // variant with run-time operand checks and one flag vote per poll, instead of kUnroll
  // votes and loads of which all but one would be for groups beyond the tile.
  if (groups <= 4 * static_cast<uint64_t>(blockDim.x >> 5))
    return process_flagged_as<E, R, UnitKind::kGeneral, 1>(u, w, n, groups, scalar, bound, site);
  constexpr int kUnroll = 4;
  if (u.scale_left || u.scale_right)
    return process_flagged_as<E, R, UnitKind::kGeneral, kUnroll>(u, w, n, groups, scalar, bound,
                                                                 site);
  if (u.right != nullptr)
    return process_flagged_as<E, R, UnitKind::kReduce, kUnroll>(u, w, n, groups, scalar, bound,
                                                                site);
  return process_flagged_as<E, R, UnitKind::kCopy, kUnroll>(u, w, n, groups, scalar, bound, site);
}

// ---- The primitives ----

template <typename E, Reduction R>
class Primitives<E, R, ProtoFlagged> {
 public:
  __device__ __forceinline__ Primitives(const WaitBound& bound, ThreadblockConnections& connections,
                                        const Scalar<E>& scalar)
      : bound_(bound), ends_(connections), scalar_(scalar) {}

  /// All threads: a receiver waits inside the unit, line by line (move()), so only a unit
  /// that pushes (thread 0 waits for a free slot), pops a network connection (thread 0 waits
  /// for the proxy's `tail`: the proxy writes lines in no particular order) or whose op waited
  /// for dependencies (`gated`: `deps_ready` is thread 0's result) needs a barrier here;
  /// otherwise the previous unit's last barrier suffices. False when the call must stop
  /// (posted).
  __device__ __forceinline__ bool wait(const Transfer& t, bool gated, bool deps_ready,
                                       const WaitSite& site) {
    const bool counted_pop = t.pops && ends_.recv->network != 0;
    if (!gated && !t.pushes && !counted_pop) return true;
    bool ready = true;
    if (threadIdx.x == 0)
      ready = deps_ready &&
              (!counted_pop || ends_.recv->wait_filled_slot(bound_, ends_.recv_position, site)) &&
              (!t.pushes || ends_.send->wait_free_slot(bound_, ends_.send_position, site));
    return !__syncthreads_or(!ready);
  }

  /// All threads, after wait(): moves the unit's `n` elements (polling the popped lines, storing
  /// the pushed ones), then a barrier, and zeroes an LL slot when due. False when a poll had to
  /// stop (posted).
  __device__ __forceinline__ bool move(const Transfer& t, uint64_t n, const WaitSite& site) {
    bool ok = true;
    if (t.pops || t.pushes) {
      Wire wire;
      if (t.pops) {
        wire.in = ends_.recv->slot(ends_.recv_position);
        wire.in_format = ends_.recv->wire;
        wire.in_position = ends_.recv_position;
      }
      if (t.pushes) {
        wire.out = ends_.send->slot(ends_.send_position);
        wire.out_format = ends_.send->wire;
        wire.out_position = ends_.send_position;
      }
      if (threadIdx.x == 0 && t.pushes && ends_.send->network()) {
        // The wire bytes of the unit's groups (every group is stored whole), recorded before the
        // lines (the slot is this side's until tail moves), so that `n` need not outlive them.
        const uint64_t groups =
            (n * sizeof(typename E::Storage) + kGroupDataBytes - 1) / kGroupDataBytes;
        const uint32_t line = ends_.send->wire == kWireLL128 ? kLL128LineBytes : kLLGroupWireBytes;
        ends_.send->record_size(ends_.send_position, static_cast<uint32_t>(groups * line));
      }
      const WaitSite data_site = t.pops ? ends_.recv->waiting_for_data(site) : site;
      ok = process_flagged<E, R>(t.operands, wire, n, scalar_, bound_, data_site);
    } else {
      reduce_copy<E, R>(t.operands, n, scalar_);
    }
    if (__syncthreads_or(!ok)) return false;
    // Only now has every warp read the slot: zero it (rarely) before freeing it.
    cleared_ = t.pops && ends_.recv->wire == kWireLL && ends_.recv->clear_due(ends_.recv_position);
    if (cleared_) {
      ends_.recv->clear_slot(ends_.recv_position);
      __syncthreads();
    }
    return true;
  }

  /// After move(): thread 0 frees the popped slot (nothing to post for a push: the lines carry
  /// their flags, except to a network connection's proxy, which reads `tail`); every thread
  /// advances its positions.
  __device__ __forceinline__ void post(const Transfer& t) {
    if (threadIdx.x == 0) {
      if (t.pushes && ends_.send->network()) ends_.send->post_filled_slot(ends_.send_position);
      if (t.pops) ends_.recv->post_free_slot(ends_.recv_position, cleared_);
    }
    ends_.advance(t);
  }

  /// Thread 0, at the end of the launch.
  __device__ __forceinline__ void save_positions() const { ends_.save_positions(); }

 private:
  const WaitBound& bound_;
  ThreadblockConnections& ends_;
  const Scalar<E>& scalar_;
  bool cleared_ = false;  ///< move() zeroed the popped slot: post() frees it with a release
};

}  // namespace
}  // namespace efccl::device
