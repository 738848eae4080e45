// All-pairs allreduce in one communication step (small messages): every rank sends its whole
// buffer to every other rank's scratch (one multi-chunk op per peer), then reduces the n-1
// copies into its output. Sends to different peers use different connections, so they all
// proceed at once; peer q's data travels on channel (q - r) mod channels.
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::kScratch;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> allpairs_allreduce(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int64_t cf = p.channels;  // chunks per buffer: one lane per channel
  ProgramBuilder b("allpairs_allreduce", ef::Collective::kAllReduce, n, cf, p.inplace, p.protocol,
                   p.instances, o);
  // Scratch slot of peer q on rank r: peers in rank order, skipping r.
  auto slot = [](int32_t q, int32_t r) { return q < r ? q : q - 1; };
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t q = 0; q < n; ++q) {
      if (q == r) continue;
      const int ch = static_cast<int>(((q - r) % n + n) % n % p.channels);
      b.chunk(q, kInput, 0, cf).copy(r, kScratch, slot(q, r) * cf, -1, -1, ch);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    Ref acc = b.chunk(r, kInput, 0, cf).copy(r, kOutput, 0);
    for (int32_t q = 0; q < n; ++q) {
      if (q != r) acc = acc.reduce(b.chunk(r, kScratch, slot(q, r) * cf, cf));
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
