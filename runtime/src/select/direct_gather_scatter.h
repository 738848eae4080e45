// Runtime-side generators for the rooted collectives the algorithm library does not have:
// direct gather (every rank sends its block straight to the root) and direct scatter (the
// root sends every block straight to its owner). `channels` splits each block into that many
// chunks carried on separate channels (one CTA pair each), for bandwidth.
#pragma once

#include <cstdint>

#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::runtime {

/// Valid in-place and out-of-place (NCCL's aliasing); validated before returning.
StatusOr<ef::Program> direct_gather(int32_t nranks, int32_t root, int32_t channels,
                                    ef::Protocol protocol);
StatusOr<ef::Program> direct_scatter(int32_t nranks, int32_t root, int32_t channels,
                                     ef::Protocol protocol);

}  // namespace efccl::runtime
