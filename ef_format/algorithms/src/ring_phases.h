// Ring reduce-scatter and ring allgather over a subset of the ranks, the building blocks of the
// hierarchical algorithms (a ring inside a node, or across nodes among the GPUs with one local
// index).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "efccl/compiler/program_builder.h"

namespace efccl::algorithms::detail {

/// Where `rank` holds its current value of chunks index .. index+size-1.
using ValueOf = std::function<compiler::Ref(int32_t rank, int64_t index, int64_t size)>;

/// Part k (chunks index[k] .. index[k]+size-1) is reduced along the ring ranks[k+1], ranks[k+2],
/// ..., and ends in the output of ranks[k]. Partial sums are traced into `partials` at the
/// same index (fusion turns them into rrs, which store nothing). Every transfer uses
/// channel `ch` (-1: the compiler's automatic channel).
void ring_reduce_scatter(compiler::ProgramBuilder& b, const std::vector<int32_t>& ranks,
                         const std::vector<int64_t>& index, int64_t size, const ValueOf& value,
                         compiler::Buffer partials, int ch);

/// Part k (in the output of ranks[k]) is copied around the ring into the output of every other
/// rank of `ranks` (rcs on the way).
void ring_allgather(compiler::ProgramBuilder& b, const std::vector<int32_t>& ranks,
                    const std::vector<int64_t>& index, int64_t size, int ch);

}  // namespace efccl::algorithms::detail
