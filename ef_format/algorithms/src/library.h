// The algorithm generators behind the registry (one file each). Each receives parameters
// that registry.cc has already checked (ranks >= 1, instances >= 1, channels >= 1, root a rank; the
// root is in the options) and the compile options to use.
#pragma once

#include "efccl/algorithms/registry.h"

namespace efccl::algorithms::detail {

StatusOr<ef::Program> ring_allreduce(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> ring_allgather(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> ring_reducescatter(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o);
StatusOr<ef::Program> allpairs_allreduce(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o);
StatusOr<ef::Program> ring_broadcast(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> ring_reduce(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> direct_alltoall(const AlgorithmParams& p, const compiler::CompileOptions& o);

}  // namespace efccl::algorithms::detail
