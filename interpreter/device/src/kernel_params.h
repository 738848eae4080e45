// The interpreter kernel's view of a Program and of one call: plain structs shared by the host
// code (C++20, g++) and the kernel (C++17, nvcc). Everything here is trivially copyable; the
// host builds the tables from an ef::Program (program_tables.h) and the kernels read them.
// Besides the tables, a launch writes: dependency flags, per-CTA launch counts (epochs),
// connection counters and slots (through the connection handles), and on failure its device's
// ErrorRecord and the stop signals (WaitBound).
#pragma once

#include <cstddef>
#include <cstdint>

#include "connection_device_handle.h"
#include "wait_bound.h"

namespace efccl::device {

/// Largest CTA the kernel is compiled for; the executor picks a smaller one when the grid would
/// otherwise not be co-resident.
inline constexpr int kMaxThreadsPerBlock = 512;
/// Ranks one launch can serve (several ranks may share a GPU); bounds the kernel parameter size.
inline constexpr int kMaxLocalRanks = 64;

/// The binary operator a call reduces with (avg and premulsum reduce with kSum after scaling).
enum Reduction : int { kReduceSum = 0, kReduceProd = 1, kReduceMin = 2, kReduceMax = 3 };

/// ef::OpCode, same values (checked by a static_assert in program_tables.cc).
enum OpKind : uint8_t {
  kOpSend = 0,
  kOpRecv = 1,
  kOpCopy = 2,
  kOpReduce = 3,
  kOpRecvCopySend = 4,
  kOpRecvReduceCopy = 5,
  kOpRecvReduceSend = 6,
  kOpRecvReduceCopySend = 7,
  kOpNop = 8,
  kOpMultiReduceCopy = 9,  ///< mrc: operands in CallParams::operands (see OpDesc)
};

/// ef::BufferKind, same values: index into RankCallArgs::buffers.
enum BufferIndex : uint8_t { kBufferInput = 0, kBufferOutput = 1, kBufferScratch = 2, kNumBuffers = 3 };

/// OpDesc::premul bits: which operand reads are pristine (ef::analyze_premul), per call mode.
/// The kernel shifts by PremulShift of the call's mode and tests the low two bits.
enum PremulBits : uint8_t {
  kPremulSrc = 1,
  kPremulDst = 2,
};
inline constexpr int kPremulShiftOutOfPlace = 0;
inline constexpr int kPremulShiftInPlace = 2;

/// OpDesc::direct: the op's direct modes (ef::analyze_direct), a nibble per call mode: bits 0-1
/// how its pop takes its value, bits 2-3 how its push delivers it. The kernel shifts by
/// CallParams::direct_shift (kDirectShift*; kDirectOff reads zero: every pop and push through
/// the slots).
enum DirectBits : uint8_t {
  kDirectPopMask = 3,
  kDirectPull = 1,    ///< the pop reads the sender's region (pull_buffer, pull_chunk)
  kDirectPushed = 2,  ///< the pop's value is already in the op's dst (the sender wrote it)
  kDirectPushShift = 2,
  kDirectPulled = 1,  ///< (after kDirectPushShift) the push writes nothing: the receiver pulls
  kDirectPush = 2,    ///< (after kDirectPushShift) the push writes the receiver's region
};
inline constexpr int kDirectShiftOutOfPlace = 0;
inline constexpr int kDirectShiftInPlace = 4;
inline constexpr int kDirectOff = 8;

/// Sources, and targets, of one mrc op at most (ef::kMaxMultiOperands).
inline constexpr int kMaxMultiOperands = 16;

/// One operand of an mrc op: a chunk of a buffer of one of the launch's ranks.
struct MultiOperand {
  int64_t chunk;
  int32_t local_rank;  ///< index into the call's RankCallArgs
  uint8_t buffer;      ///< BufferIndex
  uint8_t reserved[3];
};

/// One op of one threadblock (docs/ef-format.md §4). Offsets and counts are in chunks. An mrc
/// (kOpMultiReduceCopy) keeps its operands in CallParams::operands: src_chunk is the index of
/// its first, pull_chunk the number of sources and push_chunk the number of targets, which
/// follow the sources.
struct OpDesc {
  int64_t src_chunk;
  int64_t dst_chunk;
  int64_t count;        ///< units per iteration (0 for nop); at most ef::kMaxChunks
  uint32_t dep_begin;   ///< first entry in KernelParams::deps
  uint32_t dep_count;
  uint8_t code;         ///< OpKind
  uint8_t src_buffer;   ///< BufferIndex (unused when the op has no src)
  uint8_t dst_buffer;   ///< BufferIndex (unused when the op has no dst)
  uint8_t premul;       ///< PremulBits << kPremulShift{OutOfPlace,InPlace}
  uint8_t publishes;    ///< 1: some op depends on this one, so it publishes its flag
  uint8_t direct;       ///< DirectBits << kDirectShift{OutOfPlace,InPlace}
  uint8_t pull_buffer;  ///< kDirectPull: BufferIndex in the sender's (ThreadblockDesc::recv_local)
  uint8_t push_buffer;  ///< kDirectPush: BufferIndex in the receiver's (ThreadblockDesc::send_local)
  int32_t pull_chunk;   ///< kDirectPull: the sender's first chunk (< ef::kMaxChunks)
  int32_t push_chunk;   ///< kDirectPush: the receiver's first chunk
};
static_assert(sizeof(OpDesc) == 48, "OpDesc is staged in shared memory: keep it at 48 bytes");

/// One CTA of the launch: an EF threadblock of one of the device's ranks.
struct ThreadblockDesc {
  int32_t local_rank;  ///< index into KernelParams::ranks
  int32_t rank;        ///< global rank (messages only)
  int32_t tb;          ///< threadblock id within the rank (messages only)
  int32_t send;        ///< index into KernelParams::sends, or -1
  int32_t recv;        ///< index into KernelParams::recvs, or -1
  uint32_t op_begin;   ///< first op in KernelParams::ops
  uint32_t op_count;
  uint32_t flag_begin; ///< the flag of op i is KernelParams::flags[flag_begin + i]
  uint32_t dep_begin;  ///< this threadblock's dependencies: deps[dep_begin, dep_begin + dep_count)
  uint32_t dep_count;  ///< (its ops' DepDesc ranges lie inside, in op order)
  /// Direct transfers: the local index (into the call's RankCallArgs) of the rank this
  /// threadblock receives from / sends to when that rank is in the same launch; -2 - j when it
  /// is remote rank j of a launch that meets other processes on its GPU (XprocParams); else -1.
  int32_t recv_local;
  int32_t send_local;
};

/// A dependency: the flag to wait for, plus the (tb, op) it stands for (for messages).
struct DepDesc {
  uint32_t flag;
  int32_t tb;
  int32_t op;
};

/// The call's buffers and premul scalars for one rank (the scalar in each representation the
/// element types need, converted on the host exactly as the host executor converts it).
struct RankCallArgs {
  char* buffers[kNumBuffers];  ///< input, output, scratch (chunk 0 of each)
  double scalar_f64;
  int64_t scalar_i64;
  float scalar_f32;
  int32_t reserved;
};

/// One call's tables and sizes: everything a CTA needs except the ranks' buffers.
struct CallParams {
  const ThreadblockDesc* threadblocks;  ///< one per threadblock of the device's ranks
  const OpDesc* ops;
  const DepDesc* deps;
  const MultiOperand* operands;  ///< mrc operands (null when the program has none)
  uint64_t* flags;
  const SendConnectionDeviceHandle* sends;
  const RecvConnectionDeviceHandle* recvs;
  uint64_t* epochs;             ///< one per threadblock: launches it has completed
  WaitBound bound;              ///< deadline, stop signals, error record
  uint64_t chunk_elements;      ///< B
  uint64_t tile_elements;       ///< E
  uint64_t iterations;          ///< ceil(B / E), < 2^32
  int32_t premul_shift;         ///< kPremulShift{OutOfPlace,InPlace}
  int32_t premul;               ///< 1: scale pristine reads (premulsum, avg on floats)
  int32_t direct_shift;         ///< kDirectShift{OutOfPlace,InPlace}, or kDirectOff
  int32_t reserved;
};

/// Direct transfers between processes on one GPU (docs/device-executor.md, "Direct transfers
/// between processes"): the launches of the ranks of every process on the GPU that a launch
/// has connections with meet on each location's board, in its counter arena: each publishes
/// where the others reach its ranks' buffers, waits until they all started, and its CTA 0 waits
/// at the end until all their CTAs ended, so that the launches behave as one.
inline constexpr int kMaxXprocLocations = 4;   ///< other processes' locations a launch meets
inline constexpr int kMaxXprocLocalRanks = 4;  ///< ranks of one location on the GPU
inline constexpr int kMaxXprocRemoteRanks = kMaxXprocLocations * kMaxXprocLocalRanks;
inline constexpr int kMaxXprocSlots = kMaxXprocLocations + 1;  ///< locations on one GPU

/// What one location publishes for one reader: its ranks' buffers in the reader's process.
struct XprocPublication {
  uint32_t valid;  ///< 1: every buffer of this call is mapped in the reader's process
  int32_t direct_shift;  ///< the publisher's CallParams::direct_shift
  char* buffers[kMaxXprocLocalRanks][kNumBuffers];
};

/// One location's board (zeroed with its counter arena, never reset between calls). Only
/// launches that meet (XprocParams::active) touch it; `started` and `ended` hold the launch
/// count (CallParams::epochs) + 1 of the latest such launch, compared modulo 2^64.
struct XprocBoard {
  uint64_t started;  ///< its CTA 0 has published
  uint64_t pad0[15];
  uint64_t ended;  ///< every CTA has ended (set by the last one)
  uint64_t count;  ///< CTAs of meeting launches that have ended, over all of them
  uint64_t pad1[14];
  XprocPublication pub[kMaxXprocSlots];  ///< by the reader's slot on the GPU
};

/// A launch's side of the meeting (KernelParams::xproc; active == 0: it meets nobody).
struct XprocParams {
  uint32_t active;
  uint32_t nlocations;  ///< remote locations met
  uint32_t my_slot;     ///< this location's slot on the GPU
  uint32_t my_ctas;     ///< CTAs of this launch
  XprocBoard* mine;
  XprocBoard* remote[kMaxXprocLocations];
  uint32_t remote_slot[kMaxXprocLocations];
  uint32_t remote_rank_begin[kMaxXprocLocations];  ///< its ranks' first remote index
  uint32_t remote_rank_count[kMaxXprocLocations];
  XprocPublication published[kMaxXprocLocations];  ///< what this launch publishes to each
};

/// The kernel's one parameter for one call (passed as __grid_constant__; about 3.7 KiB): CTA i
/// runs threadblock i.
struct KernelParams : CallParams {
  RankCallArgs ranks[kMaxLocalRanks];
  XprocParams xproc;
};

/// Fused launches (several calls of one group in one launch per device and stream).
inline constexpr int kMaxFusedCalls = 32;
inline constexpr int kMaxFusedRanks = 64;

/// One call of a fused launch: its threadblock t runs on CTA cta_begin + t.
struct FusedCall : CallParams {
  uint32_t cta_begin;
  uint32_t nthreadblocks;
  uint32_t rank_begin;  ///< its local ranks' RankCallArgs: FusedParams::ranks[rank_begin ...]
  uint32_t flagged;     ///< 1: the LL/LL128 instantiation of the walk, 0: Simple
};

/// The fused kernel's parameter (about 7.3 KiB; kernel parameters may be up to 32 KiB since CUDA
/// 12.1 on compute capability 7.0 and later). Each CTA runs, in call order, the threadblocks
/// that fall on it: at most one per call, so that a call's threadblocks are co-resident once
/// the calls before them on their CTAs have finished, and every device orders the calls alike.
struct FusedParams {
  uint32_t ncalls;
  uint32_t reserved;
  FusedCall calls[kMaxFusedCalls];
  RankCallArgs ranks[kMaxFusedRanks];
};

/// Integer avg's final pass divides these output regions by nranks (the host executor's
/// "result region": the whole output of allreduce and reducescatter, the root's of reduce,
/// the postcondition chunks of custom; other collectives do not reduce).
struct DivideSegment {
  int32_t local_rank;
  int32_t reserved;
  int64_t first_chunk;  ///< in the rank's API output
  int64_t chunks;
};

struct DivideParams {
  char* outputs[kMaxLocalRanks];  ///< API output per local rank
  const DivideSegment* segments;
  uint32_t nsegments;
  uint32_t reserved;
  uint64_t chunk_elements;
  uint64_t largest_segment_elements;  ///< sizes the grid
  uint64_t divisor;
};

}  // namespace efccl::device
