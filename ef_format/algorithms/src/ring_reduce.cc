// Ring reduce: chunk c is reduced along the ring starting at root+1 and ending at the root
// (rrs on the way: the partial sums traced into scratch are never stored; rrc at the root).
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::kScratch;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> ring_reduce(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  const int32_t root = o.root;
  ProgramBuilder b("ring_reduce", ef::Collective::kReduce, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  if (n == 1) {
    b.chunk(0, kInput, 0, ch).copy(0, kOutput, 0);
    return b.compile();
  }
  for (int32_t c = 0; c < ch; ++c) {
    Ref acc = b.chunk((root + 1) % n, kInput, c);
    for (int32_t s = 2; s <= n; ++s) {
      const int32_t q = (root + s) % n;
      acc = b.chunk(q, kInput, c).reduce_into(acc, q == root ? kOutput : kScratch, c, -1, -1, c);
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
