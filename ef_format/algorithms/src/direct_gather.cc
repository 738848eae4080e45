// Direct gather: every rank sends its block straight to the root, chunk c on channel c; the
// root copies its own block locally (nothing in-place, where its input is that block).
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;

StatusOr<ef::Program> direct_gather(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  const int32_t root = o.root;
  ProgramBuilder b("direct_gather", ef::Collective::kGather, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t q = 0; q < n; ++q) {
    if (q == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      b.chunk(q, kInput, c).copy(root, kOutput, int64_t{q} * ch + c, -1, -1, c);
    }
  }
  b.chunk(root, kInput, 0, ch).copy(root, kOutput, int64_t{root} * ch);
  return b.compile();
}

}  // namespace efccl::algorithms::detail
