// Direct scatter: the root sends block q straight to rank q, chunk c on channel c, and copies
// its own block locally (nothing in-place, where its output is that block).
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;

StatusOr<ef::Program> direct_scatter(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  const int32_t root = o.root;
  ProgramBuilder b("direct_scatter", ef::Collective::kScatter, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t q = 0; q < n; ++q) {
    if (q == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      b.chunk(root, kInput, int64_t{q} * ch + c).copy(q, kOutput, c, -1, -1, c);
    }
  }
  b.chunk(root, kInput, int64_t{root} * ch, ch).copy(root, kOutput, 0);
  return b.compile();
}

}  // namespace efccl::algorithms::detail
