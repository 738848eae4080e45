// The compiler's internal representation: the builder's recorded state (Spec + trace), the
// chunk layout rules, and the instruction DAG that the passes transform.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "efccl/compiler/program_builder.h"
#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::compiler::detail {

/// Everything the builder knows besides the trace. Chunk counts are per instance ("base");
/// compile() multiplies them by `instances`.
struct Spec {
  std::string name;
  ef::Collective collective = ef::Collective::kAllReduce;
  int32_t nranks = 1;
  int64_t chunk_factor = 1;
  bool inplace = false;
  ef::Protocol protocol = ef::Protocol::kSimple;
  int32_t instances = 1;
  CompileOptions options;
  int64_t nchunks = 1;                                   ///< nchunksperloop of one instance
  std::vector<int64_t> input_chunks, output_chunks;      ///< per rank, one instance
  std::vector<ef::Postcondition> custom_postconditions;  ///< one instance
  std::vector<std::string> scratch_names;
  /// Chunks of each scratch buffer used per rank: [rank][0] anonymous, [rank][1 + id] named.
  std::vector<std::vector<int64_t>> scratch_used;
};

// ---- Chunk layout (chunk_layout.cc) ----

/// Chunks per rank-block (C/n) for per-block collectives, else 0.
int64_t rank_block_chunks(ef::Collective c, int32_t nranks, int64_t nchunks);
/// The standard input/output chunk counts of `rank` (docs/ef-format.md §2).
int64_t standard_input_chunks(ef::Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                              int32_t rank);
int64_t standard_output_chunks(ef::Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                               int32_t rank);
/// Where (input/output, chunk) lives under NCCL's in-place aliasing: the canonical one of the
/// two aliased names. Scratch and unaliased chunks map to themselves.
ef::BufferRef canonical_inplace(ef::Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                                int32_t rank, ef::BufferRef ref);
/// The collective's definition in chunks (custom: none; use the spec's).
std::vector<ef::Postcondition> standard_postconditions(ef::Collective c, int32_t nranks,
                                                       int64_t nchunks, int32_t root);

/// Maps chunk `index` of a buffer of one instance to the replicated buffer, for instance k.
struct Replication {
  int32_t instances = 1;
  bool interleaved = true;
  int64_t map(int64_t index, int64_t block, int32_t k) const {
    if (instances == 1) return index;
    if (interleaved || block <= 0) return index * instances + k;
    return (index / block) * block * instances + k * block + index % block;
  }
};

/// "rank 2 output[5]", "rank 0 scratch 'tmp'[3..4]"
std::string describe(const Spec& spec, int32_t rank, Buffer buffer, int64_t index, int64_t count);
std::string describe(const TraceOp& op, const Spec& spec, std::size_t op_index);

// ---- Instruction DAG ----

class ThreadblockGroups;

/// One instruction of one rank (op codes of ef::OpCode).
struct Instr {
  ef::OpCode code = ef::OpCode::kNop;
  int32_t rank = 0;
  std::optional<ef::BufferRef> src, dst;
  int64_t count = 1;
  int32_t send_peer = -1, recv_peer = -1;
  int32_t channel = 0;
  bool has_channel = false;                  ///< local ops without an explicit channel
  int32_t send_label = -1, recv_label = -1;  ///< manual threadblock labels (-1: automatic)
  int32_t pushes_to = -1;                    ///< the instruction that pops what this pushes
  int32_t pops_from = -1;                    ///< the instruction whose push this pops
  int32_t trace_op = 0;                      ///< originating TraceOp (diagnostics)
  int64_t order = 0;                         ///< position in the trace-ordered lowering
  bool alive = true;
  std::vector<int32_t> preds, succs;   ///< same-rank conflicts and push -> pop
  std::vector<int32_t> value_readers;  ///< instructions that read a value this one wrote
  bool writes_dead = false;            ///< every write is overwritten later or never observed
  // Filled by threadblock assignment and scheduling.
  int32_t tb = -1;
  int32_t tb_pos = -1;
};

/// Final (replicated) buffer sizes and the addressing of slots.
struct Layout {
  int32_t nranks = 0;
  int64_t nchunks = 0;  ///< final nchunksperloop
  std::vector<int64_t> input_chunks, output_chunks, scratch_chunks;
  std::vector<int64_t> scratch_offset;  ///< [1 + id]: where named scratch buffer id starts
  std::vector<int64_t> rank_base;       ///< first slot key of each rank
  int64_t total_slots = 0;
  /// The slot key of chunk `ref` of `rank`, with or without in-place aliasing.
  int64_t key(const Spec& spec, int32_t rank, ef::BufferRef ref, bool aliased) const;
};

struct Dag {
  Layout layout;
  std::vector<Instr> instrs;
  std::vector<ef::Postcondition> postconditions;  ///< final indices
  bool modes[2] = {false, false};  ///< [0] out-of-place layout, [1] in-place aliasing
};

/// Replicates the trace into instances and lowers it to instructions in trace order.
StatusOr<Dag> lower(const Spec& spec, const std::vector<TraceOp>& trace);
/// Symbolically executes the lowered instructions in trace order; ok when every output chunk
/// named by the postconditions ends with exactly its sources.
Status check_postconditions(const Spec& spec, const Dag& dag, bool aliased);
/// Conflict edges (read/write and write/write on a slot, in every enabled mode), push -> pop
/// edges, value readers and dead writes.
void build_edges(const Spec& spec, Dag& dag);
/// rcs, rrcs, rrs as enabled by the options, where `groups` allows the fused threadblock.
void fuse(const Spec& spec, Dag& dag, ThreadblockGroups& groups);
/// The trace with a channel for every remote copy and reduce traced with ch = -1 (MSCCLang's
/// automatic channel search; `lowered` is the trace's lowering, whose fusion candidates
/// define the flows). Explicit channels are kept.
std::vector<TraceOp> assign_channels(const Spec& spec, const std::vector<TraceOp>& trace,
                                     const Dag& lowered);
/// Per rank union-find over what forces instructions into one threadblock: a send connection
/// (peer, channel), a receive connection, a manual label. A group may hold at most one send
/// and one receive connection, all on one channel (docs/ef-format.md §3).
class ThreadblockGroups {
 public:
  explicit ThreadblockGroups(int32_t nranks);
  ThreadblockGroups(const ThreadblockGroups&) = delete;
  ThreadblockGroups& operator=(const ThreadblockGroups&) = delete;
  ~ThreadblockGroups();
  ThreadblockGroups(ThreadblockGroups&&) = delete;
  /// Joins the groups of everything `ins` uses; false, changing nothing and saying why, when
  /// that would put two send (or receive) connections or two channels in one group.
  bool add(const Instr& ins, std::string* why);
  /// The group of `ins` (which must have been added and use a connection or a label), or -1.
  int32_t group_of(const Instr& ins);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Gives every alive instruction a threadblock (Instr::tb, dense per rank) from `groups`;
/// instructions with neither connection nor label join a producer's threadblock or a local
/// one. Returns the threadblocks' send/recv peers and channels, per rank (no ops yet).
std::vector<std::vector<ef::Threadblock>> assign_threadblocks(Dag& dag, ThreadblockGroups& groups);
/// A global order of the alive instructions consistent with the DAG and with FIFO
/// connections; empty when none was found with the given priority.
std::vector<int32_t> schedule(const Dag& dag, bool gc3_priority);

}  // namespace efccl::compiler::detail
