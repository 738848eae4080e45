// All-pairs allgather in one communication step (small messages): every rank sends each chunk
// of its block straight to every other rank's output, so the whole collective takes one
// latency instead of the ring's n-1. Chunk c of a block travels on channel c: `channels`
// lanes per pair of ranks.
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;

StatusOr<ef::Program> allpairs_allgather(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  ProgramBuilder b("allpairs_allgather", ef::Collective::kAllGather, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t c = 0; c < ch; ++c) {
      const int64_t out = int64_t{r} * ch + c;
      // Peers in the order r+1, r+2, ...: at any moment the ranks send to different peers.
      for (int32_t s = 1; s < n; ++s)
        b.chunk(r, kInput, c).copy((r + s) % n, kOutput, out, -1, -1, c);
      b.chunk(r, kInput, c).copy(r, kOutput, out, -1, -1, c);  // nothing in-place
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
