// Ring allreduce: `channels` rings over disjoint chunks. Chunk i of block b is reduced along
// the ring starting at rank b+1 and ending at its owner b (out = in (op) received: rrs on the
// way once fused, rrcs at the owner), then travels the ring once more to every other rank
// (rcs, and a recv at the last rank). Reads of the input precede every write of the same
// chunk, so the program is also correct in-place.
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> ring_allreduce(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  ProgramBuilder b("ring_allreduce", ef::Collective::kAllReduce, n, int64_t{n} * ch, p.inplace,
                   p.protocol, p.instances, o);
  if (n == 1) {
    b.chunk(0, kInput, 0, ch).copy(0, kOutput, 0);
    return b.compile();
  }
  for (int32_t c = 0; c < ch; ++c) {
    for (int32_t owner = 0; owner < n; ++owner) {
      const int64_t i = int64_t{owner} * ch + c;
      const int32_t start = (owner + 1) % n;
      Ref acc = b.chunk(start, kInput, i);
      for (int32_t s = 1; s < n; ++s) {
        const int32_t q = (start + s) % n;
        acc = b.chunk(q, kInput, i).reduce_into(acc, kOutput, i, -1, -1, c);
      }
      for (int32_t s = 1; s < n; ++s) acc = acc.copy((owner + s) % n, kOutput, i, -1, -1, c);
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
