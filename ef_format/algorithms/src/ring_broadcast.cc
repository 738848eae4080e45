// Ring broadcast: chunk c of the root's buffer travels root -> root+1 -> ... on channel c
// (rcs at every intermediate rank); the root copies it locally (nothing in-place).
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> ring_broadcast(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  const int32_t root = o.root;
  ProgramBuilder b("ring_broadcast", ef::Collective::kBroadcast, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t c = 0; c < ch; ++c) {
    Ref acc = b.chunk(root, kInput, c);
    for (int32_t s = 1; s < n; ++s) acc = acc.copy((root + s) % n, kOutput, c, -1, -1, c);
    b.chunk(root, kInput, c).copy(root, kOutput, c, -1, -1, c);
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
