// Ring allgather: chunk c of rank r's block goes around the ring r -> r+1 -> ... on channel c
// (rcs at every intermediate rank); rank r copies its own block locally (nothing in-place).
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> ring_allgather(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  ProgramBuilder b("ring_allgather", ef::Collective::kAllGather, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t c = 0; c < ch; ++c) {
      const int64_t out = int64_t{r} * ch + c;
      Ref acc = b.chunk(r, kInput, c);
      for (int32_t s = 1; s < n; ++s) acc = acc.copy((r + s) % n, kOutput, out, -1, -1, c);
      b.chunk(r, kInput, c).copy(r, kOutput, out, -1, -1, c);
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
