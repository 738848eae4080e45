// Allreduce for ranks that share one GPU in one process (one launch): each rank's threadblocks
// own lanes of its block of chunks and, for each chunk, read every rank's input once, reduce
// them in registers and write the result into every rank's output (one mrc op). Per chunk that
// is n reads and n writes, the memory bound; programs of two-operand ops need 3n-4 reads and
// 2n-2 writes (docs/device-executor.md, "Why four ranks stay near half the bound"). No
// connections, no dependencies, valid in place (each chunk is read and written by one op only,
// each element read before the same thread writes it). It runs only where every rank shares
// the launch; the runtime picks it only there (select/tuning.h).
#include "library.h"

#include "efccl/ef/validate.h"

namespace efccl::algorithms::detail {

StatusOr<ef::Program> shared_gpu_allreduce(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t lanes = p.channels * p.instances;
  ef::Program prog;
  prog.name = "shared_gpu_allreduce";
  prog.collective = ef::Collective::kAllReduce;
  prog.protocol = p.protocol;
  prog.nranks = n;
  prog.nchunksperloop = static_cast<int64_t>(n) * lanes;
  prog.nchannels = 1;
  prog.inplace = true;
  prog.outofplace = true;
  prog.min_bytes = o.min_bytes;
  prog.max_bytes = o.max_bytes;
  prog.ranks.resize(static_cast<std::size_t>(n));
  for (int32_t r = 0; r < n; ++r) {
    ef::Rank& rank = prog.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = prog.nchunksperloop;
    rank.output_chunks = prog.nchunksperloop;
    for (int32_t k = 0; k < lanes; ++k) {
      const int64_t chunk = static_cast<int64_t>(r) * lanes + k;
      ef::Op op;
      op.code = ef::OpCode::kMultiReduceCopy;
      op.count = 1;
      for (int32_t q = 0; q < n; ++q) {
        op.sources.push_back({q, ef::BufferKind::kInput, chunk});
        op.targets.push_back({q, ef::BufferKind::kOutput, chunk});
      }
      ef::Threadblock tb;
      tb.ops.push_back(std::move(op));
      rank.threadblocks.push_back(std::move(tb));
    }
  }
  std::string problems;
  for (const auto& d : ef::validate(prog)) problems += "\n  " + d.to_string();
  if (!problems.empty()) return Status::error("shared_gpu_allreduce is not valid:" + problems);
  return prog;
}

}  // namespace efccl::algorithms::detail
