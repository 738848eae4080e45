// The interface between the op decoder (op_decoder.cuh) and the protocols, in the style of
// NCCL's Primitives<T, RedOp, ..., Proto>: the decoder describes one unit of an op as a
// Transfer (send, recv, copy, reduce, recv-copy-send, recv-reduce-copy, recv-reduce-send,
// recv-reduce-copy-send, or nothing but the waits for a nop) and hands it to
// Primitives<E, R, Protocol>, which waits, moves the tile and posts in its protocol:
//   * ProtoSimple (prims_simple.cuh): slots hold plain bytes, counters say when they are
//     filled and freed;
//   * ProtoFlagged (prims_flagged.cuh): LL and LL128 lines carry their own flags; each
//     connection says which of the two formats it uses (an LL128 program may run some of its
//     connections over LL, and an op may pop one format and push the other), so the two
//     formats share one instantiation.
// The op kind is a run-time value (ops are interpreted), so every kind goes through the same
// three calls of a protocol (wait, move, post) rather than a function of its own: one copy of
// each protocol's unit in the kernel, as many registers as one unit needs. NCCL's genericOp
// has the same three steps inside; they are separate here because the decoder publishes an
// op's dependency flag between the last two.
#pragma once

#include <cstdint>

#include "connection_device_handle.h"
#include "kernel_params.h"
#include "reduce_copy.cuh"
#include "reduction.cuh"
#include "scoped_atomics.cuh"
#include "wait_bound.h"

namespace efccl::device {
namespace {

/// The units (tiles of chunks) of one op, as the decoder hands them to the primitives: the op's
/// kind, which says whether it pops the threadblock's receive connection (the popped tile is
/// then the left operand) and pushes its send connection (the result then goes to the slot),
/// decoded once per op, and the memory operands of the current unit, set by the member named
/// after the kind. Each member sets only the operands its kind has (the others stay null).
struct Transfer {
  uint8_t kind;           ///< OpKind
  bool pops;              ///< takes the popped tile from the receive connection
  bool pushes;            ///< puts the result into the send connection's slot
  /// Direct transfers (Simple only; kernel_params.h, DirectBits): how the pop takes its value
  /// and how the push delivers it; 0 = through the slots.
  uint8_t pop_mode = 0;
  uint8_t push_mode = 0;
  const char* pulled = nullptr;  ///< kDirectPull: the unit's tile in the sender's memory
  char* push_to = nullptr;       ///< kDirectPush: the unit's tile in the receiver's memory
  UnitOperands operands;  ///< memory operands only: the primitives add the slots

  /// Decoded once per op, so that its units do not test the kind again.
  __device__ __forceinline__ explicit Transfer(uint8_t op_kind)
      : kind(op_kind),
        pops(kind == kOpRecv || kind == kOpRecvCopySend || kind == kOpRecvReduceCopy ||
             kind == kOpRecvReduceSend || kind == kOpRecvReduceCopySend),
        pushes(kind == kOpSend || kind == kOpRecvCopySend || kind == kOpRecvReduceSend ||
               kind == kOpRecvReduceCopySend) {}

  /// False for a nop: it only waits for its dependencies.
  __device__ __forceinline__ bool moves() const { return kind != kOpNop; }

  /// s: src -> slot.
  __device__ __forceinline__ void send(const char* src, bool scale_src) {
    operands.left = src;
    operands.scale_left = scale_src;
  }
  /// r: slot -> dst.
  __device__ __forceinline__ void recv(char* dst) { operands.dst = dst; }
  /// cpy: src -> dst.
  __device__ __forceinline__ void copy(const char* src, bool scale_src, char* dst) {
    operands.left = src;
    operands.scale_left = scale_src;
    operands.dst = dst;
  }
  /// re: dst op src -> dst.
  __device__ __forceinline__ void reduce(char* dst, bool scale_dst, const char* src,
                                         bool scale_src) {
    operands.left = operands.dst = dst;
    operands.scale_left = scale_dst;
    operands.right = src;
    operands.scale_right = scale_src;
  }
  /// rcs: slot -> dst and the next slot.
  __device__ __forceinline__ void recv_copy_send(char* dst) { operands.dst = dst; }
  /// rrc: slot op src -> dst.
  __device__ __forceinline__ void recv_reduce_copy(const char* src, bool scale_src, char* dst) {
    operands.right = src;
    operands.scale_right = scale_src;
    operands.dst = dst;
  }
  /// rrs: slot op src -> the next slot.
  __device__ __forceinline__ void recv_reduce_send(const char* src, bool scale_src) {
    operands.right = src;
    operands.scale_right = scale_src;
  }
  /// rrcs: slot op src -> dst and the next slot.
  __device__ __forceinline__ void recv_reduce_copy_send(const char* src, bool scale_src,
                                                        char* dst) {
    recv_reduce_copy(src, scale_src, dst);
  }
};

/// Protocol tags (see the top of this file).
struct ProtoSimple {};
struct ProtoFlagged {};

/// The connection ends of one threadblock and its positions in them, which every thread keeps
/// in a register during a launch (they advance in lockstep) and thread 0 persists at its end.
struct ThreadblockConnections {
  const SendConnectionDeviceHandle* send;  ///< null when the threadblock sends to nobody
  const RecvConnectionDeviceHandle* recv;  ///< null when it receives from nobody
  uint64_t send_position;
  uint64_t recv_position;

  __device__ __forceinline__ void advance(const Transfer& t) {
    send_position += t.pushes ? 1 : 0;
    recv_position += t.pops ? 1 : 0;
  }
  /// Thread 0, at the end of the launch.
  __device__ __forceinline__ void save_positions() const {
    if (send != nullptr) send->save_position(send_position);
    if (recv != nullptr) recv->save_position(recv_position);
  }
};

/// The primitives of one threadblock over `Protocol` (specialized in prims_simple.cuh and
/// prims_flagged.cuh). Each specialization offers, for one unit of a Transfer, in this order
/// (all threads call each; false: the call must stop, the failure is posted):
///   Primitives(bound, connections, scalar);  refers to the decoder's (they stay in registers)
///   bool wait(const Transfer&, bool gated, bool deps_ready, const WaitSite&);
///     the connection waits and the barrier that releases the CTA; `gated`: the decoder waited
///     for the op's dependencies before this unit, `deps_ready` is thread 0's result;
///   bool move(const Transfer&, uint64_t n, const WaitSite&);
///     the tile's n elements (the connection slots join a copy of the transfer's operands),
///     ending with a barrier;
///   void post(const Transfer&);
///     thread 0 posts the connection counters; positions advance;
///   void save_positions() const;  thread 0, at the end of the launch.
/// The decoder publishes an op's dependency flag between move() and post() of its last unit.
template <typename E, Reduction R, typename Protocol>
class Primitives;

}  // namespace
}  // namespace efccl::device

#include "prims_flagged.cuh"
#include "prims_simple.cuh"
