// The chunk-oriented program builder: the C++ core of the MSCCLang / GC3 DSL (Cowan et al.,
// "GC3: An Optimizing Compiler for GPU Collective Communication", §5).
//
// An algorithm is written as a sequential trace of chunk operations on the buffers of every
// rank:
//
//   ProgramBuilder b("ring", ef::Collective::kAllReduce, 4, /*chunk_factor=*/4, ...);
//   Ref c = b.chunk(0, kInput, 1);            // chunk 1 of rank 0's input
//   c = b.chunk(1, kInput, 1).reduce(c);      // rank 1: in[1] = in[1] (op) rank 0's in[1]
//   c.copy(2, kOutput, 1);                    // rank 2: out[1] = that value
//
// compile() turns the trace into an ef::Program: chunk DAG -> instruction DAG (remote copy =
// send + recv, remote reduce = send + rrc) -> fusion (rcs, rrcs, rrs) -> threadblock
// assignment -> scheduling -> cross-threadblock dependencies -> instances.
//
// Errors never throw. The first misuse (a read of a never-written chunk, a reference whose
// chunk was overwritten since it was taken, an index out of range, ...) is recorded with the
// trace operation, rank, buffer and chunk it concerns; every later call is then a no-op and
// compile() returns that error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::compiler {

/// One buffer of every rank: input, output, scratch, or a named scratch buffer (laid out
/// after the anonymous scratch area at compile time).
struct Buffer {
  ef::BufferKind kind = ef::BufferKind::kInput;
  int32_t scratch_id = -1;  ///< >= 0: a buffer from ProgramBuilder::scratch_buffer()

  constexpr Buffer() = default;
  constexpr Buffer(ef::BufferKind k) : kind(k) {}  // NOLINT(google-explicit-constructor)
  constexpr Buffer(ef::BufferKind k, int32_t id) : kind(k), scratch_id(id) {}
  bool operator==(const Buffer&) const = default;
};

inline constexpr Buffer kInput{ef::BufferKind::kInput};
inline constexpr Buffer kOutput{ef::BufferKind::kOutput};
inline constexpr Buffer kScratch{ef::BufferKind::kScratch};

/// Switches of the compiler passes and facts about the program that are not part of the trace.
struct CompileOptions {
  bool fuse_rcs = true;   ///< recv then send of the received chunk -> rcs
  bool fuse_rrcs = true;  ///< rrc then send of its result -> rrcs
  bool fuse_rrs = true;   ///< rrc then send, result used nowhere else -> rrs (no local write)
  /// MSCCL's one-dependency-per-op form: extra dependencies go on nops placed before the op.
  bool dependence_nop = false;
  /// Instances: chunk i of instance k becomes i*instances + k (interleaved); otherwise each
  /// rank-block of the buffer is repeated `instances` times (block replication).
  bool interleaved_replication = true;
  /// Out-of-place traces: also mark the program in-place when it is correct under NCCL's
  /// buffer aliasing (docs/ef-format.md §2); dependencies then respect both layouts.
  bool detect_inplace = true;
  /// GC3's priority (dependency depth, then reverse depth) orders each threadblock's ops;
  /// false: the trace order.
  bool gc3_priority = true;
  bool validate = true;  ///< run ef::validate on the result and fail with its diagnostics
  int32_t root = 0;      ///< broadcast, reduce, gather, scatter
  uint64_t min_bytes = 0;
  std::optional<uint64_t> max_bytes;  ///< nullopt: unbounded
};

class ProgramBuilder;

/// A reference to `size` consecutive chunks of one buffer of one rank, as they were when the
/// reference was taken. Cheap to copy. A default-constructed Ref is invalid; operations on an
/// invalid Ref do nothing and return an invalid Ref (the builder holds the reason).
class Ref {
 public:
  Ref() = default;

  bool valid() const { return builder_ != nullptr; }
  int32_t rank() const { return rank_; }
  Buffer buffer() const { return buffer_; }
  int64_t index() const { return index_; }
  int64_t size() const { return size_; }

  /// Copies these chunks to `index` of `buffer` on `dst_rank` and returns a reference to the
  /// copy. A remote copy becomes a send on this rank and a receive on `dst_rank`; `sendtb`,
  /// `recvtb` pin the threadblocks (labels, per rank), `ch` the channel (-1: automatic).
  Ref copy(int32_t dst_rank, Buffer buffer, int64_t index, int sendtb = -1, int recvtb = -1,
           int ch = -1) const;

  /// MSCCLang's reduce: stores (other (op) this) at this reference's location and returns a
  /// reference to it. `other` on another rank is sent here and reduced on arrival (rrc).
  Ref reduce(const Ref& other, int sendtb = -1, int recvtb = -1, int ch = -1) const;

  /// Like reduce(), but stores the result at `index` of `buffer` on this rank, leaving this
  /// reference's chunks unchanged (e.g. out[i] = in[i] (op) received, without touching in[i]).
  Ref reduce_into(const Ref& other, Buffer buffer, int64_t index, int sendtb = -1, int recvtb = -1,
                  int ch = -1) const;

 private:
  friend class ProgramBuilder;
  ProgramBuilder* builder_ = nullptr;
  int32_t rank_ = -1;
  Buffer buffer_;
  int64_t index_ = 0;
  int64_t size_ = 0;
  uint64_t stamp_ = 0;  ///< trace time at which the chunks had the referenced values
};

/// One traced chunk operation (public for diagnostics and tests; built by Ref's methods).
struct TraceOp {
  enum class Kind : uint8_t { kCopy, kReduce };
  Kind kind = Kind::kCopy;
  /// copy: dst = a.  reduce: dst = b (op) a, dst on a's rank (b is `other`, maybe remote).
  int32_t a_rank = 0;
  Buffer a_buffer;
  int64_t a_index = 0;
  int32_t b_rank = -1;  ///< reduce only
  Buffer b_buffer;
  int64_t b_index = 0;
  int32_t dst_rank = 0;
  Buffer dst_buffer;
  int64_t dst_index = 0;
  int64_t count = 1;
  int32_t sendtb = -1, recvtb = -1, channel = -1;
};

/// Records a trace and compiles it (see the file comment).
class ProgramBuilder {
 public:
  /// `chunk_factor` follows MSCCLang: chunks per rank-block for allgather, reducescatter,
  /// alltoall, gather and scatter (nchunksperloop = nranks * chunk_factor), chunks per buffer
  /// otherwise. `inplace`: the trace sees NCCL's in-place aliasing and the program is valid
  /// in-place only; otherwise it is valid out-of-place (and in-place too when
  /// options.detect_inplace finds it correct there). `instances` replicates the program.
  ProgramBuilder(std::string name, ef::Collective collective, int32_t nranks, int64_t chunk_factor,
                 bool inplace = false, ef::Protocol protocol = ef::Protocol::kSimple,
                 int32_t instances = 1, CompileOptions options = {});
  ~ProgramBuilder();
  ProgramBuilder(const ProgramBuilder&) = delete;
  ProgramBuilder& operator=(const ProgramBuilder&) = delete;

  /// Custom collectives: the input and output chunks of `rank` (all input chunks start
  /// initialized). Call before tracing.
  void set_buffer_sizes(int32_t rank, int64_t input_chunks, int64_t output_chunks);
  /// Custom collectives: what the output must hold (indices before instance replication).
  void set_postconditions(std::vector<ef::Postcondition> postconditions);

  /// A new named scratch buffer (same name twice: the same buffer).
  Buffer scratch_buffer(const std::string& name);

  /// A reference to chunks index .. index+size-1 of `buffer` on `rank`.
  Ref chunk(int32_t rank, Buffer buffer, int64_t index, int64_t size = 1);

  /// The first error of the trace (ok while there is none).
  const Status& status() const;
  const std::vector<TraceOp>& trace() const;
  int32_t nranks() const;
  int64_t chunk_factor() const;

  /// Compiles the trace. Fails with the first trace error, when the trace does not compute
  /// the collective (naming the first wrong output chunk), or (options.validate) when the
  /// result fails ef::validate.
  StatusOr<ef::Program> compile() const;

 private:
  friend class Ref;
  Ref record(TraceOp op, const Ref& a, const Ref* b);
  Ref make_ref(int32_t rank, Buffer buffer, int64_t index, int64_t size);
  bool fail(std::string message);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace efccl::compiler
