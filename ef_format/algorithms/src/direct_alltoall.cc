// Direct alltoall: chunk c of the block rank q holds for rank r goes straight to r (channel c).
// Out-of-place it lands in r's output; in-place the destination still holds data r has to
// send, so blocks land in scratch first and are copied out once everything was sent.
#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::kScratch;
using compiler::ProgramBuilder;

StatusOr<ef::Program> direct_alltoall(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  const int32_t ch = p.channels;
  ProgramBuilder b("direct_alltoall", ef::Collective::kAllToAll, n, ch, p.inplace, p.protocol,
                   p.instances, o);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t q = 0; q < n; ++q) {
      for (int32_t c = 0; c < ch; ++c) {
        const int64_t from = int64_t{r} * ch + c;  // in q's input
        const int64_t to = int64_t{q} * ch + c;    // in r's output
        const auto dst = (p.inplace && q != r) ? kScratch : kOutput;
        b.chunk(q, kInput, from).copy(r, dst, to, -1, -1, c);
      }
    }
  }
  if (p.inplace) {
    for (int32_t r = 0; r < n; ++r) {
      for (int32_t q = 0; q < n; ++q) {
        if (q == r) continue;
        for (int32_t c = 0; c < ch; ++c) {
          const int64_t to = int64_t{q} * ch + c;
          b.chunk(r, kScratch, to).copy(r, kOutput, to, -1, -1, c);
        }
      }
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
