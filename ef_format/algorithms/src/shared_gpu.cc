// Collectives for ranks that share one GPU in one process (one launch): each rank's
// threadblocks own lanes of its block of chunks and move each chunk in one pass (one mrc op):
// every input the chunk's result depends on is read once, reduced in registers where the
// collective reduces, and every output that receives it is written once. That is the memory
// bound: allreduce reads n inputs and writes n outputs per chunk where programs of two-operand
// ops need 3n-4 reads and 2n-2 writes (docs/device-executor.md, "Why four ranks stay near half
// the bound"); reduce-scatter and reduce read n and write 1 (a ring: 2n-2 and n-1); allgather
// and broadcast read 1 and write n (a ring forwarding from output to output: n and n). No
// connections, no dependencies, valid in place (each chunk is read and written by one op only,
// and where in-place aliasing makes a source and a target one range, each element is read
// before the same thread writes it). They run only where every rank shares the launch; the
// runtime picks them only there (select/tuning.h).
#include "efccl/ef/validate.h"
#include "library.h"

namespace efccl::algorithms::detail {
namespace {

/// Rank r's lane k handles chunk j = r * lanes + k of the collective's "big" buffer (every
/// rank's buffer for allreduce, broadcast and reduce; the concatenation of the ranks' blocks
/// for allgather's output and reduce-scatter's input, so that block r is rank r's own).
/// `single` (allreduce, broadcast, reduce): one chunk, one threadblock of one rank (the root;
/// rank 0 for allreduce), so that any count fits — the tail of a count the others do not divide.
StatusOr<ef::Program> shared_gpu_program(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o,
                                         ef::Collective collective, const char* name,
                                         bool single = false) {
  const int32_t n = p.ranks;
  const int32_t lanes = single ? 1 : p.channels * p.instances;
  const int32_t root = o.root;
  const int64_t all = single ? 1 : static_cast<int64_t>(n) * lanes;
  const int32_t owner = collective == ef::Collective::kAllReduce ? 0 : root;
  ef::Program prog;
  prog.name = name;
  prog.collective = collective;
  prog.protocol = p.protocol;
  prog.nranks = n;
  prog.root =
      collective == ef::Collective::kBroadcast || collective == ef::Collective::kReduce ? root : 0;
  prog.nchunksperloop = all;
  prog.nchannels = 1;
  prog.inplace = true;
  prog.outofplace = true;
  prog.min_bytes = o.min_bytes;
  prog.max_bytes = o.max_bytes;
  prog.ranks.resize(static_cast<std::size_t>(n));
  for (int32_t r = 0; r < n; ++r) {
    ef::Rank& rank = prog.ranks[static_cast<std::size_t>(r)];
    switch (collective) {
      case ef::Collective::kAllGather:
        rank.input_chunks = lanes;
        rank.output_chunks = all;
        break;
      case ef::Collective::kReduceScatter:
        rank.input_chunks = all;
        rank.output_chunks = lanes;
        break;
      case ef::Collective::kBroadcast:
        rank.input_chunks = r == root ? all : 0;
        rank.output_chunks = all;
        break;
      case ef::Collective::kReduce:
        rank.input_chunks = all;
        rank.output_chunks = r == root ? all : 0;
        break;
      default:  // allreduce
        rank.input_chunks = all;
        rank.output_chunks = all;
        break;
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    ef::Rank& rank = prog.ranks[static_cast<std::size_t>(r)];
    if (single && r != owner) continue;  // no threadblocks
    for (int32_t k = 0; k < lanes; ++k) {
      const int64_t j = single ? 0 : static_cast<int64_t>(r) * lanes + k;
      ef::Op op;
      op.code = ef::OpCode::kMultiReduceCopy;
      op.count = 1;
      switch (collective) {
        case ef::Collective::kAllGather:  // rank r's block to every output
          op.sources.push_back({r, ef::BufferKind::kInput, k});
          for (int32_t q = 0; q < n; ++q) op.targets.push_back({q, ef::BufferKind::kOutput, j});
          break;
        case ef::Collective::kReduceScatter:  // block r of every input, reduced, to rank r
          for (int32_t q = 0; q < n; ++q) op.sources.push_back({q, ef::BufferKind::kInput, j});
          op.targets.push_back({r, ef::BufferKind::kOutput, k});
          break;
        case ef::Collective::kBroadcast:
          op.sources.push_back({root, ef::BufferKind::kInput, j});
          for (int32_t q = 0; q < n; ++q) op.targets.push_back({q, ef::BufferKind::kOutput, j});
          break;
        case ef::Collective::kReduce:
          for (int32_t q = 0; q < n; ++q) op.sources.push_back({q, ef::BufferKind::kInput, j});
          op.targets.push_back({root, ef::BufferKind::kOutput, j});
          break;
        default:  // allreduce
          for (int32_t q = 0; q < n; ++q) {
            op.sources.push_back({q, ef::BufferKind::kInput, j});
            op.targets.push_back({q, ef::BufferKind::kOutput, j});
          }
          break;
      }
      ef::Threadblock tb;
      tb.ops.push_back(std::move(op));
      rank.threadblocks.push_back(std::move(tb));
    }
  }
  std::string problems;
  for (const auto& d : ef::validate(prog)) problems += "\n  " + d.to_string();
  if (!problems.empty()) return Status::error(std::string(name) + " is not valid:" + problems);
  return prog;
}

}  // namespace

StatusOr<ef::Program> shared_gpu_allreduce(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kAllReduce, "shared_gpu_allreduce");
}

StatusOr<ef::Program> shared_gpu_allreduce_single(const AlgorithmParams& p,
                                                  const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kAllReduce, "shared_gpu_allreduce_single", true);
}

StatusOr<ef::Program> shared_gpu_broadcast_single(const AlgorithmParams& p,
                                                  const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kBroadcast, "shared_gpu_broadcast_single", true);
}

StatusOr<ef::Program> shared_gpu_reduce_single(const AlgorithmParams& p,
                                               const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kReduce, "shared_gpu_reduce_single", true);
}

StatusOr<ef::Program> shared_gpu_allgather(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kAllGather, "shared_gpu_allgather");
}

StatusOr<ef::Program> shared_gpu_reducescatter(const AlgorithmParams& p,
                                               const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kReduceScatter, "shared_gpu_reducescatter");
}

StatusOr<ef::Program> shared_gpu_broadcast(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kBroadcast, "shared_gpu_broadcast");
}

StatusOr<ef::Program> shared_gpu_reduce(const AlgorithmParams& p,
                                        const compiler::CompileOptions& o) {
  return shared_gpu_program(p, o, ef::Collective::kReduce, "shared_gpu_reduce");
}

}  // namespace efccl::algorithms::detail
