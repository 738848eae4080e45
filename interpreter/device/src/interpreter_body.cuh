// The GPU interpreter of EF programs (docs/ef-format.md §4-5), shared by its two kernels
// (interpreter_kernel.cu: one call, one CTA per threadblock of every rank on this device;
// fused_kernel.cu: several calls of a group in one launch). A CTA running a threadblock walks
// iterations j = 0 .. iterations-1 and, in each, its op list; an op with count c processes
// tile j of its chunks k .. k+c-1, one unit at a time.
//
// Per unit, thread 0 waits (dependencies on the op's first unit, a filled slot for ops that
// pop, a free slot for ops that push), a barrier releases the CTA, all threads move the tile
// (16-byte vectors when every pointer allows, elements otherwise), a second barrier, and
// thread 0 publishes (tail to the receiver, head to the sender). After an op's last unit of an
// iteration thread 0 publishes the op's dependency flag when another op waits for it.
//
// LL and LL128 programs run the `kFlagged` instantiation: the same walk, but data travels with
// flags (WireFormat in kernel_params.h). A sender waits for a free slot and stores its lines:
// no tail to publish, so no fence. A receiver does not wait for a tail and a barrier:
// each warp polls the lines it is about to use, so a unit's first bytes are used as soon as
// they land. The barrier after a unit stays (the slot is freed through head, and ops of one
// threadblock hand data to each other through memory). Ops without a connection (copy,
// reduce) run exactly as in Simple programs.
//
// Registers: up to the 128 that __launch_bounds__ allows (ptxas: some Simple instantiations
// spill up to 32 bytes, the flagged ones 22-74); the CTA size is chosen per (type, operator,
// protocol) by the executor so that the whole grid is co-resident.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "interpreter_kernel.h"
#include "reduction.cuh"
#include "sync_primitives.cuh"

namespace efccl::device {
namespace {

/// The operands of one unit (one tile of one chunk). Null pointers are absent operands.
struct Unit {
  const char* left = nullptr;  ///< the popped slot, dst (`reduce`) or src (send, copy)
  const char* right = nullptr; ///< src for reducing ops
  char* dst = nullptr;         ///< local destination
  char* slot = nullptr;        ///< remote slot for pushing ops
  bool scale_left = false;     ///< premul: left is a pristine read of the rank's input
  bool scale_right = false;
};

/// How a unit combines its operands; chosen per unit so that the common cases (plain copies
/// and plain reductions) run loops without per-element branches.
enum class UnitKind { kCopy, kReduce, kGeneral };

/// out = scale?(left) [op scale?(right)] for one element.
template <typename E, Reduction R, UnitKind K>
__device__ __forceinline__ typename E::Storage combine(const Unit& u, const Scalar<E>& scalar,
                                                      typename E::Storage left,
                                                      typename E::Storage right) {
  if constexpr (K == UnitKind::kCopy) {
    return left;
  } else if constexpr (K == UnitKind::kReduce) {
    return reduce_element<E, R>(left, right);
  } else {
    if (u.scale_left) left = scalar.apply(left);
    if (u.right == nullptr) return left;
    if (u.scale_right) right = scalar.apply(right);
    return reduce_element<E, R>(left, right);
  }
}

/// Moves (and reduces) `n` elements of a unit with all threads of the CTA: 16-byte vectors
/// when every operand is 16-byte aligned, then (or otherwise) one element per thread and step.
template <typename E, Reduction R, UnitKind K>
__device__ __forceinline__ void process_unit_as(const Unit& u, uint64_t n,
                                                const Scalar<E>& scalar) {
  using S = typename E::Storage;
  constexpr int kPack = 16 / sizeof(S);
  union Pack {
    uint4 raw;
    S element[kPack];
  };
  const auto address_bits = reinterpret_cast<uintptr_t>(u.left) |
                            reinterpret_cast<uintptr_t>(u.right) |
                            reinterpret_cast<uintptr_t>(u.dst) | reinterpret_cast<uintptr_t>(u.slot);
  uint64_t scalar_begin = 0;
  if ((address_bits & 15) == 0) {
    const uint64_t npacks = n / kPack;
    const auto* left = reinterpret_cast<const uint4*>(u.left);
    const auto* right = reinterpret_cast<const uint4*>(u.right);
    auto* dst = reinterpret_cast<uint4*>(u.dst);
    auto* slot = reinterpret_cast<uint4*>(u.slot);
    // Each thread keeps kUnroll independent 16-byte loads in flight before it stores: one load
    // at a time leaves a CTA latency-bound (about 6 GB/s measured on H200 NVLink). Narrow
    // types reduce 8 or 16 lanes per pack, so they unroll less to stay in registers.
    constexpr int kUnroll = K == UnitKind::kCopy ? 8 : sizeof(S) == 1 ? 2 : sizeof(S) == 2 ? 4 : 8;
    const uint64_t stride = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < npacks; i += kUnroll * stride) {
      Pack v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) v[k].raw = __ldcg(left + i + k * stride);
      if constexpr (K != UnitKind::kCopy) {
        Pack w[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
          w[k].raw = right != nullptr ? __ldcg(right + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
#pragma unroll
          for (int e = 0; e < kPack; ++e)
            v[k].element[e] = combine<E, R, K>(u, scalar, v[k].element[e], w[k].element[e]);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (dst != nullptr) __stcg(dst + i + k * stride, v[k].raw);
        if (slot != nullptr) __stcg(slot + i + k * stride, v[k].raw);
      }
    }
    for (; i < npacks; i += stride) {  // fewer than kUnroll packs left for this thread
      Pack v;
      v.raw = __ldcg(left + i);
      if constexpr (K != UnitKind::kCopy) {
        Pack w;
        w.raw = right != nullptr ? __ldcg(right + i) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < kPack; ++e)
          v.element[e] = combine<E, R, K>(u, scalar, v.element[e], w.element[e]);
      }
      if (dst != nullptr) __stcg(dst + i, v.raw);
      if (slot != nullptr) __stcg(slot + i, v.raw);
    }
    scalar_begin = npacks * kPack;
  }
  // Unaligned operands (e.g. a user buffer offset by one element) and the vector tail.
  const S* left = reinterpret_cast<const S*>(u.left);
  const S* right = reinterpret_cast<const S*>(u.right);
  for (uint64_t i = scalar_begin + threadIdx.x; i < n; i += blockDim.x) {
    const S out = combine<E, R, K>(u, scalar, left[i], right != nullptr ? right[i] : S{});
    if (u.dst != nullptr) reinterpret_cast<S*>(u.dst)[i] = out;
    if (u.slot != nullptr) reinterpret_cast<S*>(u.slot)[i] = out;
  }
}

template <typename E, Reduction R>
__device__ __forceinline__ void process_unit(const Unit& u, uint64_t n, const Scalar<E>& scalar) {
  if (u.scale_left || u.scale_right) {
    process_unit_as<E, R, UnitKind::kGeneral>(u, n, scalar);
  } else if (u.right != nullptr) {
    process_unit_as<E, R, UnitKind::kReduce>(u, n, scalar);
  } else {
    process_unit_as<E, R, UnitKind::kCopy>(u, n, scalar);
  }
}

// ---- LL and LL128 ----

/// A flagged unit's connection ends: where it pops (this device's slot) and pushes (the peer's
/// slot), in which format, and the flags of those slot uses.
struct Wire {
  const char* in = nullptr;  ///< null when the op does not pop (then Unit::left is memory)
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
__device__ __forceinline__ bool process_flagged_as(const Unit& u, const Wire& w, uint64_t n,
                                                   uint64_t groups, const Scalar<E>& scalar,
                                                   const CallParams& p, const WaitSite& site) {
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
        if (warp_must_stop(p, site, spins, start)) return false;
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
__device__ __forceinline__ bool process_flagged(const Unit& u, const Wire& w, uint64_t n,
                                                const Scalar<E>& scalar, const CallParams& p,
                                                const WaitSite& site) {
  using S = typename E::Storage;
  const uint64_t groups = (n * sizeof(S) + kGroupDataBytes - 1) / kGroupDataBytes;
  // Small tiles (the latency-bound case LL exists for) need one group per lane at most: one
  // variant with run-time operand checks and one flag vote per poll, instead of kUnroll
  // votes and loads of which all but one would be for groups beyond the tile.
  if (groups <= 4 * static_cast<uint64_t>(blockDim.x >> 5))
    return process_flagged_as<E, R, UnitKind::kGeneral, 1>(u, w, n, groups, scalar, p, site);
  constexpr int kUnroll = 4;
  if (u.scale_left || u.scale_right)
    return process_flagged_as<E, R, UnitKind::kGeneral, kUnroll>(u, w, n, groups, scalar, p, site);
  if (u.right != nullptr)
    return process_flagged_as<E, R, UnitKind::kReduce, kUnroll>(u, w, n, groups, scalar, p, site);
  return process_flagged_as<E, R, UnitKind::kCopy, kUnroll>(u, w, n, groups, scalar, p, site);
}

/// Whether the LL slot used at `position` must be zeroed once read: each slot once every
/// kLLClearPeriod positions, at the last `nslots` positions before a multiple of it (slots
/// start zeroed, so a young connection never pays for it).
__device__ __forceinline__ bool ll_slot_clear_due(const RecvConnection& c, uint64_t position) {
  return position % kLLClearPeriod >= kLLClearPeriod - c.nslots;
}
/// All threads: zeroes the slot used at `position`. Every warp must be done reading it (a
/// line zeroed before its warp polled it would never arrive), and it is freed only after.
__device__ __forceinline__ void clear_slot(const RecvConnection& c, uint64_t position) {
  auto* slot = reinterpret_cast<uint4*>(c.slots + (position % c.nslots) * c.slot_stride);
  for (uint64_t i = threadIdx.x; i < c.slot_stride / sizeof(uint4); i += blockDim.x)
    __stcg(slot + i, make_uint4(0, 0, 0, 0));
}

__device__ __forceinline__ bool op_pops(uint8_t code) {
  return code == kOpRecv || code == kOpRecvCopySend || code == kOpRecvReduceCopy ||
         code == kOpRecvReduceSend || code == kOpRecvReduceCopySend;
}
__device__ __forceinline__ bool op_pushes(uint8_t code) {
  return code == kOpSend || code == kOpRecvCopySend || code == kOpRecvReduceSend ||
         code == kOpRecvReduceCopySend;
}

/// Thread 0: waits until every dependency of `op` has completed iteration `site.iteration`.
/// `deps` is the threadblock's dependency list (staged or in global memory), starting at
/// KernelParams::deps[dep_base].
__device__ __forceinline__ bool wait_dependencies(const CallParams& p, const OpDesc& op,
                                                  const DepDesc* deps, uint32_t dep_base,
                                                  uint64_t epoch, WaitSite site) {
  const uint64_t target = flag_value(epoch, site.iteration);
  for (uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
    const DepDesc dep = deps[d - dep_base];
    site.wait = kWaitDependency;
    site.peer = dep.tb;
    site.channel = dep.op;
    uint64_t* flag = p.flags + dep.flag;
    if (!spin_until(p, site, [&] { return flag_reached(load_acquire_device(flag), target); }))
      return false;
  }
  return true;
}

/// Ops and dependencies a CTA copies into shared memory before it starts (longer lists are
/// read from global memory as they come): 128 ops of 48 bytes and 128 dependencies of 12.
inline constexpr uint32_t kStagedOps = 128;
inline constexpr uint32_t kStagedDeps = 128;
static_assert(sizeof(OpDesc) % 8 == 0 && sizeof(SendConnection) % 8 == 0 &&
                  sizeof(RecvConnection) % 8 == 0 && sizeof(DepDesc) % 4 == 0,
              "staged tables are copied in whole words");

/// All threads: copies `bytes` (a multiple of sizeof(W)) from global to shared memory.
template <typename W>
__device__ __forceinline__ void stage(void* to, const void* from, uint32_t bytes) {
  auto* dst = static_cast<W*>(to);
  const auto* src = static_cast<const W*>(from);
  for (uint32_t i = threadIdx.x; i < bytes / sizeof(W); i += blockDim.x) dst[i] = src[i];
}

/// A CTA's shared-memory copy of its threadblock's tables (see run_threadblock).
struct Staging {
  OpDesc ops[kStagedOps];
  DepDesc deps[kStagedDeps];
  SendConnection send;
  RecvConnection recv;
};

/// Runs threadblock `index` of the call `p` on this CTA (every thread) and returns false when
/// it stopped (timeout, abort or another CTA's failure; posted). `ranks`: the call's
/// RankCallArgs, indexed by ThreadblockDesc::local_rank. `staging` is this CTA's shared
/// memory; the caller must barrier before running another threadblock with it.
///
/// kFlagged: the program's protocol is LL or LL128 (each connection's WireFormat says which);
/// otherwise Simple.
///
/// Latency (what a small message pays, so what this function avoids on its critical path):
/// the CTA copies its op list, dependencies and connection ends into shared memory up front
/// (one round of independent loads instead of one dependent global load per op); freeing a
/// slot is a relaxed store (post_free_slot); an op that others depend on publishes its flag
/// before its last unit frees or fills a slot, so the dependent threadblock does not wait for
/// thread 0's fence behind a store to peer memory; the launch count is per CTA (no atomic and
/// no fence at the end).
template <typename E, Reduction R, bool kFlagged>
__device__ __forceinline__ bool run_threadblock(const CallParams& p, const RankCallArgs* ranks,
                                                uint32_t index, Staging& staging) {
  using S = typename E::Storage;
  OpDesc* const staged_ops = staging.ops;
  DepDesc* const staged_deps = staging.deps;
  SendConnection& staged_send = staging.send;
  RecvConnection& staged_recv = staging.recv;

  const ThreadblockDesc tb = p.threadblocks[index];
  const bool leader = threadIdx.x == 0;
  // Written by this CTA at the end of the previous launch (stream order makes it visible);
  // only thread 0 uses it. Loads issued before the staging so that they overlap it.
  const uint64_t epoch = leader ? p.epochs[index] : 0;
  // Every thread tracks the FIFO positions (they advance in lockstep); thread 0 persists them.
  uint64_t send_position = tb.send >= 0 ? *p.sends[tb.send].position : 0;
  uint64_t recv_position = tb.recv >= 0 ? *p.recvs[tb.recv].position : 0;
  const bool ops_staged = tb.op_count <= kStagedOps;
  const bool deps_staged = tb.dep_count <= kStagedDeps;
  if (ops_staged) stage<uint64_t>(staged_ops, p.ops + tb.op_begin, tb.op_count * sizeof(OpDesc));
  if (deps_staged)
    stage<uint32_t>(staged_deps, p.deps + tb.dep_begin, tb.dep_count * sizeof(DepDesc));
  if (tb.send >= 0) stage<uint64_t>(&staged_send, p.sends + tb.send, sizeof(SendConnection));
  if (tb.recv >= 0) stage<uint64_t>(&staged_recv, p.recvs + tb.recv, sizeof(RecvConnection));
  __syncthreads();
  const OpDesc* ops = ops_staged ? staged_ops : p.ops + tb.op_begin;
  const DepDesc* deps = deps_staged ? staged_deps : p.deps + tb.dep_begin;
  const SendConnection* send = tb.send >= 0 ? &staged_send : nullptr;
  const RecvConnection* recv = tb.recv >= 0 ? &staged_recv : nullptr;
  const RankCallArgs& rank = ranks[tb.local_rank];
  const Scalar<E> scalar(rank);

  bool stopped = false;
  for (uint64_t j = 0; j < p.iterations && !stopped; ++j) {
    const uint64_t tile_begin = j * p.tile_elements;
    const uint64_t tile = min(p.tile_elements, p.chunk_elements - tile_begin);
    for (uint32_t i = 0; i < tb.op_count && !stopped; ++i) {
      const OpDesc op = ops[i];
      const bool pops = op_pops(op.code);
      const bool pushes = op_pushes(op.code);
      const int pristine = p.premul != 0 ? (op.premul >> p.premul_shift) & 3 : 0;
      const WaitSite site{tb.rank, tb.tb, static_cast<int32_t>(i), j, kWaitNone, -1, -1};
      const int64_t units = op.count > 0 ? op.count : 1;  // a nop waits once, moves nothing
      uint64_t* const flag = p.flags + tb.flag_begin + i;
      bool published = false;
      for (int64_t u = 0; u < units; ++u) {
        // Flagged receivers wait inside the unit, line by line; a unit that waits for nothing
        // needs no barrier (the previous unit ended with one).
        const bool waits = (u == 0 && op.dep_count > 0) || pushes || (!kFlagged && pops);
        if (!kFlagged || waits) {
          bool ready = true;
          if (leader) {
            ready = (u != 0 || wait_dependencies(p, op, deps, tb.dep_begin, epoch, site)) &&
                    (kFlagged || !pops || wait_filled_slot(p, *recv, recv_position, site)) &&
                    (!pushes || wait_free_slot(p, *send, send_position, site));
          }
          if (__syncthreads_or(!ready)) {
            stopped = true;
            break;
          }
        }
        if (op.code == kOpNop) break;
        // Thread 0, after the unit's final barrier: the op's flag first when this is its last
        // unit (see the latency note above), then the connection counters.
        const bool publish_now = leader && op.publishes != 0 && u + 1 == units;

        const uint64_t element_bytes = sizeof(S);
        auto local = [&](uint8_t buffer, int64_t chunk) {
          return rank.buffers[buffer] +
                 (static_cast<uint64_t>(chunk + u) * p.chunk_elements + tile_begin) * element_bytes;
        };
        Unit unit;
        const char* popped = pops ? slot_of(*recv, recv_position) : nullptr;
        unit.slot = pushes ? slot_of(*send, send_position) : nullptr;
        switch (op.code) {
          case kOpSend:
          case kOpCopy:
            unit.left = local(op.src_buffer, op.src_chunk);
            unit.scale_left = (pristine & kPremulSrc) != 0;
            if (op.code == kOpCopy) unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
          case kOpReduce:
            unit.left = unit.dst = local(op.dst_buffer, op.dst_chunk);
            unit.scale_left = (pristine & kPremulDst) != 0;
            unit.right = local(op.src_buffer, op.src_chunk);
            unit.scale_right = (pristine & kPremulSrc) != 0;
            break;
          case kOpRecv:
          case kOpRecvCopySend:
            unit.left = popped;
            unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
          default:  // rrc, rrs, rrcs: pop() op src
            unit.left = popped;
            unit.right = local(op.src_buffer, op.src_chunk);
            unit.scale_right = (pristine & kPremulSrc) != 0;
            if (op.code != kOpRecvReduceSend) unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
        }
        if constexpr (kFlagged) {
          bool ok = true;
          if (pops || pushes) {
            Wire wire;
            if (pops) {
              wire.in = popped;
              wire.in_format = recv->wire;
              wire.in_position = recv_position;
              unit.left = nullptr;
            }
            if (pushes) {
              wire.out = unit.slot;
              wire.out_format = send->wire;
              wire.out_position = send_position;
              unit.slot = nullptr;
            }
            WaitSite data_site = site;
            if (pops) {
              data_site.wait = kWaitData;
              data_site.peer = recv->peer;
              data_site.channel = recv->channel;
            }
            ok = process_flagged<E, R>(unit, wire, tile, scalar, p, data_site);
          } else {
            process_unit<E, R>(unit, tile, scalar);
          }
          if (__syncthreads_or(!ok)) {
            stopped = true;
            break;
          }
          // Only now has every warp read the slot: zero it (rarely) before freeing it.
          const bool clear = pops && recv->wire == kWireLL && ll_slot_clear_due(*recv, recv_position);
          if (clear) {
            clear_slot(*recv, recv_position);
            __syncthreads();
          }
          if (publish_now) {
            store_release_device(flag, flag_value(epoch, j));
            published = true;
          }
          if (leader && pops) post_free_slot(*recv, recv_position, clear);
        } else {
          process_unit<E, R>(unit, tile, scalar);
          __syncthreads();
          if (publish_now) {
            store_release_device(flag, flag_value(epoch, j));
            published = true;
          }
          if (leader) {
            if (pushes) post_filled_slot(*send, send_position);
            if (pops) post_free_slot(*recv, recv_position);
          }
        }
        send_position += pushes ? 1 : 0;
        recv_position += pops ? 1 : 0;
      }
      if (!stopped && leader && op.publishes != 0 && !published)
        store_release_device(flag, flag_value(epoch, j));
    }
  }

  if (leader) {
    if (send != nullptr) *send->position = send_position;
    if (recv != nullptr) *recv->position = recv_position;
    p.epochs[index] = epoch + 1;
  }
  return !stopped;
}

// ---- Run-time selection of the (element type, operator) instantiation ----

template <typename E>
struct ElementTag {
  using Type = E;
};

/// Calls fn(ElementTag<E>{}) for the ef::DataType value `dtype`.
template <typename Fn>
cudaError_t with_element(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0: return fn(ElementTag<IntegerElement<int8_t>>{});
    case 1: return fn(ElementTag<IntegerElement<uint8_t>>{});
    case 2: return fn(ElementTag<IntegerElement<int32_t>>{});
    case 3: return fn(ElementTag<IntegerElement<uint32_t>>{});
    case 4: return fn(ElementTag<IntegerElement<int64_t>>{});
    case 5: return fn(ElementTag<IntegerElement<uint64_t>>{});
    case 6: return fn(ElementTag<HalfElement>{});
    case 7: return fn(ElementTag<NativeFloatElement<float>>{});
    case 8: return fn(ElementTag<NativeFloatElement<double>>{});
    case 9: return fn(ElementTag<BFloat16Element>{});
    case 10: return fn(ElementTag<Fp8E4M3Element>{});
    case 11: return fn(ElementTag<Fp8E5M2Element>{});
    default: return cudaErrorInvalidValue;
  }
}

/// Calls fn(std::integral_constant<Reduction, R>{}) for the Reduction value `reduction`.
template <typename Fn>
cudaError_t with_reduction(int reduction, Fn&& fn) {
  switch (reduction) {
    case kReduceSum: return fn(std::integral_constant<Reduction, kReduceSum>{});
    case kReduceProd: return fn(std::integral_constant<Reduction, kReduceProd>{});
    case kReduceMin: return fn(std::integral_constant<Reduction, kReduceMin>{});
    case kReduceMax: return fn(std::integral_constant<Reduction, kReduceMax>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace efccl::device
