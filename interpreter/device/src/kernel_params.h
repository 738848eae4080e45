// The interpreter kernel's view of a Program and of one call: plain structs shared by the host
// code (C++20, g++) and the kernel (C++17, nvcc). Everything here is trivially copyable and
// self-contained; the host builds these tables from an ef::Program (device_executor.cc) and the
// kernel only reads them (interpreter_kernel.cu).
#pragma once

#include <cstddef>
#include <cstdint>

namespace efccl::device {

/// Largest CTA the kernel is compiled for; the executor picks a smaller one when the grid would
/// otherwise not be co-resident.
inline constexpr int kMaxThreadsPerBlock = 512;
/// Ranks one launch can serve (several ranks may share a GPU); bounds the kernel parameter size.
inline constexpr int kMaxLocalRanks = 64;
/// Distance between counters written by different agents (avoids false sharing across links).
inline constexpr std::size_t kCounterStride = 128;

/// The binary operator a call reduces with (avg and premulsum reduce with kSum after scaling).
enum Reduction : int { kReduceSum = 0, kReduceProd = 1, kReduceMin = 2, kReduceMax = 3 };

/// ef::OpCode, same values (checked by a static_assert in device_executor.cc).
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

/// One op of one threadblock (docs/ef-format.md §4). Offsets and counts are in chunks.
struct OpDesc {
  int64_t src_chunk;
  int64_t dst_chunk;
  int64_t count;        ///< units per iteration (0 for nop)
  uint32_t dep_begin;   ///< first entry in KernelParams::deps
  uint32_t dep_count;
  uint8_t code;         ///< OpKind
  uint8_t src_buffer;   ///< BufferIndex (unused when the op has no src)
  uint8_t dst_buffer;   ///< BufferIndex (unused when the op has no dst)
  uint8_t premul;       ///< PremulBits << kPremulShift{OutOfPlace,InPlace}
  uint8_t publishes;    ///< 1: some op depends on this one, so it publishes its flag
  uint8_t reserved[7];
};

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
};

/// A dependency: the flag to wait for, plus the (tb, op) it stands for (for messages).
struct DepDesc {
  uint32_t flag;
  int32_t tb;
  int32_t op;
};

/// How a connection's slots carry a tile (docs/ef-format.md §5).
///  * Simple: the tile's bytes as they are; the sender release-stores `tail` once the whole
///    CTA has written the slot, the receiver acquires it before reading.
///  * LL: 8-byte lines of 4 data bytes and a 4-byte flag, each line one 8-byte store; the
///    receiver polls every line until its flag is the one of this slot use. No tail.
///  * LL128: 128-byte lines of 120 data bytes and an 8-byte flag, each line stored by 8 lanes
///    of one warp in one 16-byte-per-lane instruction; the receiver checks the flag lane of
///    each line it loaded with one such instruction. No tail. Relies on the GPU delivering a
///    warp's aligned 128-byte store to peer memory as a unit (NVLink, compute capability 9.0).
/// Both flagged formats cut a tile into 120-byte groups: group L is one LL128 line, or 30 LL
/// lines, and lane g (0..7) of the 8 lanes that handle it owns its bytes [16g, 16g + 16)
/// (lane 7: [112, 120)), so an op may pop one format and push the other.
enum WireFormat : uint32_t { kWireSimple = 0, kWireLL = 1, kWireLL128 = 2 };

inline constexpr uint32_t kGroupDataBytes = 120;  ///< data bytes per 120-byte group
inline constexpr uint32_t kLL128LineBytes = 128;  ///< LL128 wire bytes per group
inline constexpr uint32_t kLLGroupWireBytes = 2 * kGroupDataBytes;  ///< LL wire bytes per group
/// LL flags are 31-bit (position mod 2^31, plus 1, so never 0), so a line written by an earlier
/// use of the slot could carry the flag expected now once the position has moved 2^31 on. The
/// receiver zeroes a slot after reading it once every kLLClearPeriod positions of that slot,
/// which bounds the age of any line it reads to well under 2^31 positions.
inline constexpr uint64_t kLLClearPeriod = uint64_t{1} << 30;

/// The sending end of a connection (sender, receiver, channel); lives on the sender's device.
/// Slots and `tail` are in the receiver's memory (written here through peer access); `head`
/// is in the sender's memory and written by the receiver. Counters only grow, across calls.
struct SendConnection {
  char* slots;          ///< receiver's memory: `nslots` slots of `slot_stride` bytes
  uint64_t* tail;       ///< receiver's memory: units pushed so far (Simple only)
  uint64_t* head;       ///< sender's memory: units popped so far (written by the receiver)
  uint64_t* position;   ///< sender's memory: this side's push count, persisted between calls
  uint64_t slot_stride; ///< wire bytes per slot
  uint32_t nslots;
  int32_t peer;         ///< receiving rank
  int32_t channel;
  uint32_t wire;        ///< WireFormat, the same at both ends
};

/// The receiving end of a connection; lives on the receiver's device.
struct RecvConnection {
  char* slots;          ///< this device's memory (read; LL slots are also zeroed here)
  uint64_t* tail;       ///< this device's memory: units pushed (Simple only)
  uint64_t* head;       ///< sender's memory: units popped so far (written by this side)
  uint64_t* position;   ///< this device's memory: this side's pop count, persisted
  uint64_t slot_stride; ///< wire bytes per slot
  uint32_t nslots;
  int32_t peer;         ///< sending rank
  int32_t channel;
  uint32_t wire;        ///< WireFormat
};

/// Per-device state that survives launches. Zero-initialised once; never reset between calls.
/// The launch count that forms the high half of every dependency flag is kept per CTA
/// (KernelParams::epochs): every CTA of a launch runs to its end once, so all of them hold the
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
  uint64_t* flags;
  const SendConnection* sends;
  const RecvConnection* recvs;
  LaunchState* state;
  uint64_t* epochs;             ///< one per threadblock: launches it has completed
  ErrorRecord* error;           ///< host-mapped, this device's record
  StopSignals* signals;         ///< host-mapped, shared by all devices
  uint64_t chunk_elements;      ///< B
  uint64_t tile_elements;       ///< E
  uint64_t iterations;          ///< ceil(B / E), < 2^32
  uint64_t timeout_ns;          ///< per wait without progress; > 0
  int32_t premul_shift;         ///< kPremulShift{OutOfPlace,InPlace}
  int32_t premul;               ///< 1: scale pristine reads (premulsum, avg on floats)
};

/// The kernel's one parameter for one call (passed as __grid_constant__; about 3.2 KiB): CTA i
/// runs threadblock i.
struct KernelParams : CallParams {
  RankCallArgs ranks[kMaxLocalRanks];
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
