#include "ring_phases.h"

namespace efccl::algorithms::detail {

using compiler::kOutput;
using compiler::Ref;

void ring_reduce_scatter(compiler::ProgramBuilder& b, const std::vector<int32_t>& ranks,
                         const std::vector<int64_t>& index, int64_t size, const ValueOf& value,
                         compiler::Buffer partials, int ch) {
  const auto m = ranks.size();
  if (m < 2) return;
  for (std::size_t k = 0; k < m; ++k) {
    Ref acc = value(ranks[(k + 1) % m], index[k], size);
    for (std::size_t s = 2; s <= m; ++s) {
      const int32_t q = ranks[(k + s) % m];
      const compiler::Buffer dst = s == m ? kOutput : partials;
      acc = value(q, index[k], size).reduce_into(acc, dst, index[k], -1, -1, ch);
    }
  }
}

void ring_allgather(compiler::ProgramBuilder& b, const std::vector<int32_t>& ranks,
                    const std::vector<int64_t>& index, int64_t size, int ch) {
  const auto m = ranks.size();
  for (std::size_t k = 0; k < m; ++k) {
    Ref acc = b.chunk(ranks[k], kOutput, index[k], size);
    for (std::size_t s = 1; s < m; ++s) {
      acc = acc.copy(ranks[(k + s) % m], kOutput, index[k], -1, -1, ch);
    }
  }
}

}  // namespace efccl::algorithms::detail
