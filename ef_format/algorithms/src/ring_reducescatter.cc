// Ring reducescatter: chunk c of rank r's block is reduced along the ring starting at r+1 and
// ends at r (rrs on the way, rrc into the output at r). The partial sums are traced into
// scratch; fusion turns those writes into rrs, so the program uses no scratch.
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::kScratch;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> ring_reducescatter(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  ProgramBuilder b("ring_reducescatter", ef::Collective::kReduceScatter, n, ch, p.inplace,
                   p.protocol, p.instances, o);
  if (n == 1) {
    b.chunk(0, kInput, 0, ch).copy(0, kOutput, 0);
    return b.compile();
  }
  for (int32_t owner = 0; owner < n; ++owner) {
    for (int32_t c = 0; c < ch; ++c) {
      const int64_t i = int64_t{owner} * ch + c;
      const int32_t start = (owner + 1) % n;
      Ref acc = b.chunk(start, kInput, i);
      for (int32_t s = 1; s < n; ++s) {
        const int32_t q = (start + s) % n;
        if (q == owner) {
          acc = b.chunk(q, kInput, i).reduce_into(acc, kOutput, c, -1, -1, c);
        } else {
          acc = b.chunk(q, kInput, i).reduce_into(acc, kScratch, i, -1, -1, c);
        }
      }
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
