// The GPU interpreter of EF programs (docs/ef-format.md §4-5), shared by its two kernels
// (interpreter_kernel.cu: one call, one CTA per threadblock of every rank on this device;
// fused_kernel.cu: several calls of a group in one launch). A CTA running a threadblock walks
// iterations j = 0 .. iterations-1 and, in each, its op list; an op with count c processes
// tile j of its chunks k .. k+c-1, one unit at a time. The decoder here turns each op into a
// Transfer, sets its operands for each unit and hands it to the protocol's primitives
// (primitives.cuh), which wait, move and publish; what belongs to the op rather than the
// protocol stays here: its dependencies (thread 0 waits before the op's first unit) and its flag
// (published after its last unit).
//
// Registers: up to the 128 that __launch_bounds__ allows (ptxas, sm_90: the one-call Simple
// instantiations spill at most 20 bytes, the flagged ones up to 56, the fused kernel up to
// about 250; see docs/device-executor.md for what a unit may cost besides); the CTA size is
// chosen per (type, operator, protocol) by the executor so that the whole grid is co-resident.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernel_params.h"
#include "primitives.cuh"
#include "reduction.cuh"
#include "scoped_atomics.cuh"
#include "wait_bound.h"

namespace efccl::device {
namespace {

/// A dependency flag's value once op `i` has completed iteration `j` in launch `epoch`. Flags
/// only grow within a launch and each launch starts above every value of the previous ones,
/// so nothing is reset between calls; the comparison is modular, so the 32-bit epoch may wrap.
__device__ __forceinline__ uint64_t flag_value(uint64_t epoch, uint64_t iteration) {
  return (epoch << 32) | (iteration + 1);
}
__device__ __forceinline__ bool flag_reached(uint64_t flag, uint64_t target) {
  return static_cast<int64_t>(flag - target) >= 0;
}

/// Thread 0: waits until every dependency of `op` has completed iteration `site.iteration`.
/// `deps` is the threadblock's dependency list (staged or in global memory), starting at
/// CallParams::deps[dep_base].
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
    if (!p.bound.spin_until(site, [&] { return flag_reached(load_acquire_device(flag), target); }))
      return false;
  }
  return true;
}

/// Ops and dependencies a CTA copies into shared memory before it starts (longer lists are
/// read from global memory as they come): 128 ops of 48 bytes and 128 dependencies of 12.
inline constexpr uint32_t kStagedOps = 128;
inline constexpr uint32_t kStagedDeps = 128;
static_assert(sizeof(OpDesc) % 8 == 0 && sizeof(SendConnectionDeviceHandle) % 8 == 0 &&
                  sizeof(RecvConnectionDeviceHandle) % 8 == 0 && sizeof(DepDesc) % 4 == 0,
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
  SendConnectionDeviceHandle send;
  RecvConnectionDeviceHandle recv;
  char* multi[2 * kMaxMultiOperands];          ///< an mrc unit's sources, then targets
  int32_t multi_local[2 * kMaxMultiOperands];  ///< their ranks' local indexes
  /// Direct transfers between processes (XprocParams): the remote ranks' buffers, and whether
  /// this call's pairs with them are direct.
  char* xbuffers[kMaxXprocRemoteRanks][kNumBuffers];
  int xdirect;
};

/// Thread 0: waits until every met location's board shows `target` or later in its `ended`
/// (XprocBoard), or gives up (posted: false).
__device__ __forceinline__ bool xproc_wait_ended(const CallParams& p, const XprocParams& x,
                                                 WaitSite site, uint64_t target) {
  site.wait = kWaitProcessEnd;
  site.channel = -1;
  for (uint32_t m = 0; m < x.nlocations; ++m) {
    uint64_t* ended = &x.remote[m]->ended;
    site.peer = static_cast<int32_t>(x.remote_slot[m]);
    if (!p.bound.spin_until(site, [&] { return flag_reached(load_acquire_device(ended), target); }))
      return false;
  }
  return true;
}

/// Thread 0 of CTA 0, and of every CTA with a peer in another process, of a launch that meets
/// other processes' launches on its GPU: CTA 0 publishes (once the met launches of the previous
/// meeting have ended: when that call was not direct nobody waited for them at its end, and one
/// of their CTAs may still be reading this board), then each waits until every met location's
/// launch of this call has started and copies that location's buffers into `staging`. Returns
/// false when a wait gave up (posted); `*direct` says whether the call's pairs with other
/// processes run direct: only when every location, this one included, published valid buffers
/// for the same mode.
__device__ __forceinline__ bool xproc_start(const CallParams& p, const XprocParams& x,
                                            uint32_t index, uint64_t epoch, WaitSite site,
                                            Staging& staging, bool* direct) {
  if (index == 0) {
    // This location's previous meeting ended before this launch started (stream order).
    if (!xproc_wait_ended(p, x, site, load_acquire_device(&x.mine->ended))) return false;
    for (uint32_t m = 0; m < x.nlocations; ++m) x.mine->pub[x.remote_slot[m]] = x.published[m];
    store_release_device(&x.mine->started, epoch + 1);
  }
  bool ok = x.nlocations > 0;
  for (uint32_t m = 0; m < x.nlocations; ++m) {
    ok = ok && x.published[m].valid != 0 && x.published[m].direct_shift == p.direct_shift;
    uint64_t* started = &x.remote[m]->started;
    site.wait = kWaitProcessStart;
    site.peer = static_cast<int32_t>(x.remote_slot[m]);
    site.channel = -1;
    if (!p.bound.spin_until(site, [&] { return flag_reached(load_acquire_device(started),
                                                            epoch + 1); }))
      return false;
    const XprocPublication& pub = x.remote[m]->pub[x.my_slot];
    ok = ok && pub.valid != 0 && pub.direct_shift == p.direct_shift;
    for (uint32_t k = 0; k < x.remote_rank_count[m]; ++k)
      for (int b = 0; b < kNumBuffers; ++b)
        staging.xbuffers[x.remote_rank_begin[m] + k][b] = pub.buffers[k][b];
  }
  *direct = ok && p.direct_shift != kDirectOff;
  return true;
}

/// Thread 0 of every CTA at the end of such a launch: counts this CTA as ended (the last one
/// marks the launch ended); when the call ran direct, CTA 0 then waits (unless the CTA stopped:
/// the call fails anyway) until the met locations' launches of this call have ended (the
/// launch, and so the others' use of this location's buffers, ends only after that).
__device__ __forceinline__ bool xproc_end(const CallParams& p, const XprocParams& x,
                                          uint32_t index, uint64_t epoch, WaitSite site,
                                          bool stopped, bool direct) {
  const uint64_t before = cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(x.mine->count)
                              .fetch_add(1, cuda::memory_order_acq_rel);
  if ((before + 1) % x.my_ctas == 0) store_release_device(&x.mine->ended, epoch + 1);
  if (index != 0 || stopped || !direct) return true;
  return xproc_wait_ended(p, x, site, epoch + 1);
}

/// Runs threadblock `index` of the call `p` on this CTA (every thread) and returns false when
/// it stopped (timeout, abort or another CTA's failure; posted). `ranks`: the call's
/// RankCallArgs, indexed by ThreadblockDesc::local_rank. `staging` is this CTA's shared
/// memory; the caller must barrier before running another threadblock with it.
///
/// Protocol: ProtoSimple, or ProtoFlagged for LL and LL128 programs (each connection's
/// WireFormat says which of the two).
///
/// Latency (what a small message pays, so what this function avoids on its critical path):
/// the CTA copies its op list, dependencies and connection ends into shared memory up front
/// (one round of independent loads instead of one dependent global load per op); freeing a
/// slot is a relaxed store (RecvConnectionDeviceHandle::post_free_slot); an op that others
/// depend on publishes its flag before its last unit frees or fills a slot, so the dependent
/// threadblock does not wait for thread 0's fence behind a store to peer memory; the launch
/// count is per CTA (no atomic and no fence at the end).
template <typename E, Reduction R, typename Protocol>
__device__ __forceinline__ bool run_threadblock(const CallParams& p, const RankCallArgs* ranks,
                                                uint32_t index, Staging& staging,
                                                const XprocParams* xproc = nullptr) {
  using S = typename E::Storage;
  // Direct transfers (kernel_params.h, DirectBits): Simple only.
  constexpr bool kDirectCode = std::is_same_v<Protocol, ProtoSimple>;
  const ThreadblockDesc tb = p.threadblocks[index];
  const bool leader = threadIdx.x == 0;
  // Written by this CTA at the end of the previous launch (stream order makes it visible);
  // only thread 0 uses it. Loads issued before the staging so that they overlap it.
  const uint64_t epoch = leader ? p.epochs[index] : 0;
  ThreadblockConnections ends;
  ends.send_position = tb.send >= 0 ? p.sends[tb.send].load_position() : 0;
  ends.recv_position = tb.recv >= 0 ? p.recvs[tb.recv].load_position() : 0;
  const bool ops_staged = tb.op_count <= kStagedOps;
  const bool deps_staged = tb.dep_count <= kStagedDeps;
  if (ops_staged) stage<uint64_t>(staging.ops, p.ops + tb.op_begin, tb.op_count * sizeof(OpDesc));
  if (deps_staged)
    stage<uint32_t>(staging.deps, p.deps + tb.dep_begin, tb.dep_count * sizeof(DepDesc));
  if (tb.send >= 0)
    stage<uint64_t>(&staging.send, p.sends + tb.send, sizeof(SendConnectionDeviceHandle));
  if (tb.recv >= 0)
    stage<uint64_t>(&staging.recv, p.recvs + tb.recv, sizeof(RecvConnectionDeviceHandle));
  __syncthreads();
  const OpDesc* ops = ops_staged ? staging.ops : p.ops + tb.op_begin;
  const DepDesc* deps = deps_staged ? staging.deps : p.deps + tb.dep_begin;
  ends.send = tb.send >= 0 ? &staging.send : nullptr;
  ends.recv = tb.recv >= 0 ? &staging.recv : nullptr;
  const RankCallArgs& rank = ranks[tb.local_rank];
  const Scalar<E> scalar(rank);
  Primitives<E, R, Protocol> prims(p.bound, ends, scalar);

  bool stopped = false;
  // Pairs with ranks of other processes run direct only when the meeting says so (every op's
  // remote pairs otherwise keep the slots, on both sides alike).
  bool xdirect = false;
  if (kDirectCode && xproc != nullptr && (index == 0 || tb.recv_local < -1 || tb.send_local < -1)) {
    if (leader) {
      bool direct = false;
      const WaitSite site{tb.rank, tb.tb, -1, 0, kWaitNone, -1, -1};
      stopped = !xproc_start(p, *xproc, index, epoch, site, staging, &direct);
      staging.xdirect = stopped ? -1 : (direct ? 1 : 0);
    }
    __syncthreads();
    stopped = staging.xdirect < 0;
    xdirect = staging.xdirect > 0;
  }
  // 32-bit loop counters: the host refuses 2^32 - 1 tiles per chunk or more (launch.cc), and a
  // valid op's count lies inside a buffer of at most ef::kMaxChunks chunks.
  const uint32_t iterations = static_cast<uint32_t>(p.iterations);
  for (uint32_t j = 0; j < iterations && !stopped; ++j) {
    const uint64_t tile_begin = static_cast<uint64_t>(j) * p.tile_elements;
    const uint64_t tile = min(p.tile_elements, p.chunk_elements - tile_begin);
    for (uint32_t i = 0; i < tb.op_count && !stopped; ++i) {
      const OpDesc op = ops[i];
      Transfer t(op.code);
      const int pristine = p.premul != 0 ? (op.premul >> p.premul_shift) & 3 : 0;
      const bool scale_src = (pristine & kPremulSrc) != 0;
      const WaitSite site{tb.rank, tb.tb, static_cast<int32_t>(i), j, kWaitNone, -1, -1};
      const uint32_t units =
          op.count > 0 ? static_cast<uint32_t>(op.count) : 1;  // a nop waits once
      if constexpr (kDirectCode) {
        const uint32_t direct = (static_cast<uint32_t>(op.direct) >> p.direct_shift) & 15u;
        t.pop_mode = static_cast<uint8_t>(direct & kDirectPopMask);
        t.push_mode = static_cast<uint8_t>(direct >> kDirectPushShift);
        if (!xdirect) {
          if (tb.recv_local < -1) t.pop_mode = 0;
          if (tb.send_local < -1) t.push_mode = 0;
        }
      }
      uint64_t* const flag = p.flags + tb.flag_begin + i;
      bool published = false;
      for (uint32_t u = 0; u < units; ++u) {
        // Thread 0 waits for the op's dependencies before its first unit; the primitives'
        // barrier then releases the CTA after those and the connection waits together.
        const bool gated = u == 0 && op.dep_count > 0;
        bool deps_ready = true;
        if (leader && gated) deps_ready = wait_dependencies(p, op, deps, tb.dep_begin, epoch, site);
        if (!prims.wait(t, gated, deps_ready, site)) {
          stopped = true;
          break;
        }
        if (!t.moves()) break;  // a nop
        if (op.code == kOpMultiReduceCopy) {
          // mrc: no connection; its operands are tiles of the launch's ranks' buffers.
          const int nsrc = op.pull_chunk;
          const int ndst = op.push_chunk;
          if (threadIdx.x < static_cast<unsigned>(nsrc + ndst)) {
            const MultiOperand m = p.operands[op.src_chunk + threadIdx.x];
            staging.multi[threadIdx.x] =
                ranks[m.local_rank].buffers[m.buffer] +
                (static_cast<uint64_t>(m.chunk + u) * p.chunk_elements + tile_begin) * sizeof(S);
            staging.multi_local[threadIdx.x] = m.local_rank;
          }
          __syncthreads();
          multi_reduce_copy<E, R>(staging.multi, nsrc, ndst, tile, p.premul != 0, ranks,
                                  staging.multi_local);
          __syncthreads();  // the tile is written; staging.multi may be reused
        } else {
          const auto at = [&](uint8_t buffer, int64_t chunk) {
            return rank.buffers[buffer] +
                   (static_cast<uint64_t>(chunk + u) * p.chunk_elements + tile_begin) * sizeof(S);
          };
          switch (op.code) {
            case kOpSend:
              t.send(at(op.src_buffer, op.src_chunk), scale_src);
              break;
            case kOpRecv:
              t.recv(at(op.dst_buffer, op.dst_chunk));
              break;
            case kOpCopy:
              t.copy(at(op.src_buffer, op.src_chunk), scale_src, at(op.dst_buffer, op.dst_chunk));
              break;
            case kOpReduce:
              t.reduce(at(op.dst_buffer, op.dst_chunk), (pristine & kPremulDst) != 0,
                       at(op.src_buffer, op.src_chunk), scale_src);
              break;
            case kOpRecvCopySend:
              t.recv_copy_send(at(op.dst_buffer, op.dst_chunk));
              break;
            case kOpRecvReduceCopy:
              t.recv_reduce_copy(at(op.src_buffer, op.src_chunk), scale_src,
                                 at(op.dst_buffer, op.dst_chunk));
              break;
            case kOpRecvReduceSend:
              t.recv_reduce_send(at(op.src_buffer, op.src_chunk), scale_src);
              break;
            default:  // rrcs (validation admits no other code)
              t.recv_reduce_copy_send(at(op.src_buffer, op.src_chunk), scale_src,
                                      at(op.dst_buffer, op.dst_chunk));
              break;
          }
          if constexpr (kDirectCode) {
            // The peer's tile of a direct transfer (its rank shares this launch).
            const auto peer_at = [&](int32_t local, uint8_t buffer, int32_t chunk) {
              char* base = local >= 0 ? ranks[local].buffers[buffer]
                                      : staging.xbuffers[-2 - local][buffer];
              return base +
                     (static_cast<uint64_t>(chunk + u) * p.chunk_elements + tile_begin) * sizeof(S);
            };
            if (t.pop_mode == kDirectPull)
              t.pulled = peer_at(tb.recv_local, op.pull_buffer, op.pull_chunk);
            if (t.push_mode == kDirectPush)
              t.push_to = peer_at(tb.send_local, op.push_buffer, op.push_chunk);
          }
          if (!prims.move(t, tile, site)) {
            stopped = true;
            break;
          }
        }
        // Thread 0, after the unit's final barrier: the op's flag first when this is its last
        // unit (see the latency note above), then the connection counters.
        if (leader && op.publishes != 0 && u + 1 == units) {
          store_release_device(flag, flag_value(epoch, j));
          published = true;
        }
        prims.post(t);
      }
      if (!stopped && leader && op.publishes != 0 && !published)
        store_release_device(flag, flag_value(epoch, j));
    }
  }

  if (kDirectCode && xproc != nullptr) {
    __syncthreads();  // every thread's last unit is done
    if (leader) {
      const WaitSite site{tb.rank, tb.tb, -1, iterations, kWaitNone, -1, -1};
      if (!xproc_end(p, *xproc, index, epoch, site, stopped, xdirect)) stopped = true;
    }
  }
  if (leader) {
    prims.save_positions();
    p.epochs[index] = epoch + 1;
  }
  return !stopped;
}

}  // namespace
}  // namespace efccl::device
