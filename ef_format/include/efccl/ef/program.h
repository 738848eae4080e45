// The EF program model: Program -> ranks -> threadblocks -> ops. The semantics of every field
// are defined in docs/ef-format.md; this header is the in-memory form shared by the loaders,
// validation, the compiler, the host executor and the GPU interpreter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/common/status.h"

namespace efccl::ef {

/// The collective a program implements; decides buffer shapes, aliasing and verification.
enum class Collective : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kGather,
  kScatter,
  kCustom,  ///< expected placement given by Program::postconditions
};

/// The wire protocol of a program's connections (NCCL's three).
enum class Protocol : uint8_t { kSimple, kLL, kLL128 };

/// The three per-rank buffers of a call.
enum class BufferKind : uint8_t { kInput, kOutput, kScratch };

/// Op codes; the MSCCL XML spelling is in the comment.
enum class OpCode : uint8_t {
  kSend,                ///< s:    send src
  kRecv,                ///< r:    dst = recv
  kCopy,                ///< cpy:  dst = src (local)
  kReduce,              ///< re:   dst = dst (op) src (local)
  kRecvCopySend,        ///< rcs:  v = recv; dst = v; send v
  kRecvReduceCopy,      ///< rrc:  dst = recv (op) src
  kRecvReduceSend,      ///< rrs:  send (recv (op) src)
  kRecvReduceCopySend,  ///< rrcs: v = recv (op) src; dst = v; send v
  kNop,                 ///< nop:  only waits for its dependencies
  /// mrc: targets[*] = sources[0] (op) sources[1] (op) ... — operands in any rank's buffers,
  /// for ranks that share one launch (one process, one GPU); no connection (docs/ef-format.md
  /// §4, "Multi-rank ops"). EF JSON only: MSCCL XML has no spelling for it.
  kMultiReduceCopy,
};

/// A chunk-granular position in one of the rank's buffers.
struct BufferRef {
  BufferKind buffer = BufferKind::kInput;
  int64_t offset = 0;  ///< in chunks from the start of the buffer
  bool operator==(const BufferRef&) const = default;
};

/// A chunk-granular position in rank `rank`'s buffer (the operands of multi-rank ops).
struct RankBufferRef {
  int32_t rank = 0;
  BufferKind buffer = BufferKind::kInput;
  int64_t offset = 0;  ///< in chunks from the start of the buffer
  bool operator==(const RankBufferRef&) const = default;
};

/// Largest number of sources, and of targets, of one multi-rank op.
inline constexpr int kMaxMultiOperands = 16;

/// "Wait until op `op` of threadblock `tb` (same rank) has completed this iteration."
struct Dependency {
  int32_t tb = 0;
  int32_t op = 0;
  bool operator==(const Dependency&) const = default;
};

/// One instruction of a threadblock.
struct Op {
  OpCode code = OpCode::kNop;
  std::optional<BufferRef> src;  ///< required by ops that read a local buffer
  std::optional<BufferRef> dst;  ///< required by ops that write a local buffer
  int64_t count = 1;             ///< chunks, contiguous from src/dst offsets; 0 only for nop
  std::vector<Dependency> deps;
  /// MSCCL's hasdep as written in an imported file (nullopt in EF JSON, where it is derived).
  std::optional<bool> declared_hasdep;
  /// mrc only: the chunks it reads (inputs) and writes (outputs), each `count` chunks long.
  std::vector<RankBufferRef> sources;
  std::vector<RankBufferRef> targets;
  bool operator==(const Op&) const = default;
};

/// A sequential instruction list with at most one send peer and one receive peer.
struct Threadblock {
  int32_t send_peer = -1;  ///< -1: this threadblock sends nothing
  int32_t recv_peer = -1;  ///< -1: this threadblock receives nothing
  int32_t channel = 0;
  std::vector<Op> ops;
  bool operator==(const Threadblock&) const = default;
};

/// What one rank executes and how large its buffers are (in chunks).
struct Rank {
  int64_t input_chunks = 0;
  int64_t output_chunks = 0;
  int64_t scratch_chunks = 0;
  std::vector<Threadblock> threadblocks;
  bool operator==(const Rank&) const = default;
};

/// Custom collectives: output chunk `index` of `rank` must equal the reduction (a copy when
/// there is one source) of the listed input chunks.
struct ChunkSource {
  int32_t rank = 0;
  int64_t index = 0;  ///< chunk index in that rank's input buffer
  bool operator==(const ChunkSource&) const = default;
};
struct Postcondition {
  int32_t rank = 0;
  int64_t index = 0;  ///< chunk index in the rank's output buffer
  std::vector<ChunkSource> sources;
  bool operator==(const Postcondition&) const = default;
};

/// Where a connection's slots (and its tail counter) live. The receiver's GPU is the default
/// (NCCL's P2P transport); the others are the balancer's extra paths (docs/ef-format.md §3,
/// "Connection placement"): pinned host memory (written by the sender over PCIe, read by the
/// receiver over PCIe), or the memory of a GPU that runs no part of this connection (a relay
/// GPU that runs no kernel for it: written over sender -> relay, read over relay -> receiver).
/// The placement never changes results; it changes which links carry the bytes.
enum class SlotLocation : uint8_t {
  kReceiver,  ///< the receiver's GPU (default)
  kHost,      ///< pinned host memory
  kDevice,    ///< external slot device `device` (bound to a real GPU by the engine at run time)
};

/// The placement of one connection (sender, receiver, channel). Connections not listed in
/// Program::placements use kReceiver.
struct ConnectionPlacement {
  int32_t sender = 0;
  int32_t receiver = 0;
  int32_t channel = 0;
  SlotLocation location = SlotLocation::kReceiver;
  int32_t device = 0;  ///< kDevice only: 0 .. Program::slot_devices - 1
  bool operator==(const ConnectionPlacement&) const = default;
};

/// Where a program came from, so that diagnostics can point into the original file.
struct SourceMap {
  enum class Format : uint8_t { kMemory, kJson, kMscclXml };
  Format format = Format::kMemory;
  std::string file = "<memory>";
  /// XML only: line of each <gpu>, <tb>, <step> element, indexed [rank][tb][op].
  std::vector<int> rank_lines;
  std::vector<std::vector<int>> tb_lines;
  std::vector<std::vector<std::vector<int>>> op_lines;
  /// XML only: the id attribute of each <tb> of each rank (tb index -> id as written).
  bool operator==(const SourceMap&) const = default;
};

/// A whole EF program (format version 1).
struct Program {
  std::string name;
  Collective collective = Collective::kAllReduce;
  Protocol protocol = Protocol::kSimple;
  int32_t nranks = 0;             ///< == ranks.size()
  int64_t nchunksperloop = 1;     ///< a call's buffer (see chunk_elements) is cut into this many chunks
  int32_t nchannels = 1;          ///< channels are 0 .. nchannels-1
  int32_t root = 0;               ///< broadcast, reduce, gather, scatter
  bool inplace = true;            ///< valid for in-place calls
  bool outofplace = true;         ///< valid for out-of-place calls
  uint64_t min_bytes = 0;         ///< inclusive
  std::optional<uint64_t> max_bytes;  ///< inclusive; nullopt = unbounded
  std::vector<Rank> ranks;
  std::vector<Postcondition> postconditions;  ///< kCustom only
  /// External slot devices the program names (SlotLocation::kDevice); the engine maps each to
  /// a GPU when it prepares the program (0: none).
  int32_t slot_devices = 0;
  /// Connections whose slots do not live at the receiver, ordered by (sender, receiver,
  /// channel), at most one entry per connection.
  std::vector<ConnectionPlacement> placements;
  SourceMap source;  ///< not part of the program's value; ignored by operator==

  bool operator==(const Program& o) const;
};

/// The placement of connection (sender, receiver, channel): its entry in p.placements, or a
/// kReceiver placement when it has none.
ConnectionPlacement placement_of(const Program& p, int32_t sender, int32_t receiver,
                                 int32_t channel);

// ---- Names (the spelling used in EF JSON, CLI flags and messages) ----
std::string_view to_string(Collective c);
std::string_view to_string(Protocol p);
std::string_view to_string(BufferKind b);
std::string_view to_string(OpCode op);
std::string_view to_string(SlotLocation s);  ///< "receiver", "host", "device"
std::optional<Collective> parse_collective(std::string_view s);
std::optional<Protocol> parse_protocol(std::string_view s);
std::optional<BufferKind> parse_buffer_kind(std::string_view s);
std::optional<OpCode> parse_op_code(std::string_view s);
std::optional<SlotLocation> parse_slot_location(std::string_view s);
/// The MSCCL XML spelling ("s", "rrcs", "cpy", "re", ...).
std::string_view to_msccl_string(OpCode op);
std::optional<OpCode> parse_msccl_op_code(std::string_view s);

// ---- Op properties ----
bool op_receives(OpCode op);  ///< r, rcs, rrc, rrs, rrcs
bool op_sends(OpCode op);     ///< s, rcs, rrs, rrcs
bool op_reads_src(OpCode op); ///< s, cpy, re, rrc, rrs, rrcs
bool op_writes_dst(OpCode op);///< r, cpy, re, rcs, rrc, rrcs
bool op_reduces(OpCode op);   ///< re, rrc, rrs, rrcs, mrc
/// Whether some op of the program is an mrc (it then runs only where every rank shares one
/// launch: ranks of one process on one GPU).
bool uses_multi_rank_ops(const Program& p);

// ---- Collective shapes (docs/ef-format.md, "Buffers and chunks") ----
/// True for collectives whose result is a reduction (allreduce, reducescatter, reduce,
/// custom); the others move data and ignore the call's operator entirely.
bool collective_reduces(Collective c);
/// True for collectives whose NCCL count is per rank-block (allgather, reducescatter,
/// alltoall, gather, scatter): the call's element total is count * nranks.
bool count_is_per_block(Collective c);
/// Elements per chunk for a call with NCCL `count`, or nullopt when the call's element total
/// is not a multiple of nchunksperloop (the program does not apply to that call).
std::optional<uint64_t> chunk_elements(const Program& p, uint64_t count);
/// The smallest NCCL count > 0 this program can run (so that every chunk has >= 1 element).
uint64_t count_granularity(const Program& p);
/// Elements of the rank's input / output buffer that the NCCL API defines for `count`
/// (0 where the API has none or NCCL ignores it, e.g. the output of a non-root rank of reduce
/// or the input of a non-root rank of broadcast).
uint64_t api_input_elements(const Program& p, int32_t rank, uint64_t count);
uint64_t api_output_elements(const Program& p, int32_t rank, uint64_t count);
/// For in-place calls: where the input buffer starts inside the output buffer, in elements,
/// or (negative) where the output starts inside the input: NCCL's aliasing rules.
/// Returns nullopt when the rank has no aliasing (e.g. non-root of gather).
struct InPlaceAlias {
  bool input_inside_output = true;  ///< allgather/gather: in = out + offset
  uint64_t offset_elements = 0;
};
std::optional<InPlaceAlias> inplace_alias(const Program& p, int32_t rank, uint64_t count);

/// Whether a call (NCCL count, datatype, operator, mode, number of premulsum scalars: 0 or one
/// per rank) is one this program can run; the error says which part does not fit. Every engine
/// checks calls with this one rule before touching buffers.
Status check_call(const Program& p, uint64_t count, DataType dtype, RedOp op, bool inplace,
                  std::size_t premul_scalars);

}  // namespace efccl::ef
