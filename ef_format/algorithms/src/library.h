// The algorithm generators behind the library's index (one file each). Each receives parameters
// that algorithm_library.cc has already checked (ranks within the algorithm's range, nodes dividing
// ranks, instances >= 1, channels within the algorithm's limit, root a rank; the root is in the
// options) and the compile options to use.
#pragma once

#include "efccl/algorithms/algorithm_library.h"

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
StatusOr<ef::Program> allpairs_allgather(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o);
StatusOr<ef::Program> direct_gather(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> direct_scatter(const AlgorithmParams& p, const compiler::CompileOptions& o);
StatusOr<ef::Program> send_recv(const AlgorithmParams& p, const compiler::CompileOptions& o);
// Ranks sharing one GPU in one launch only (mrc ops read and write every rank's buffers;
// shared_gpu.cc).
StatusOr<ef::Program> shared_gpu_allreduce(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_allgather(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_reducescatter(const AlgorithmParams& p,
                                               const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_broadcast(const AlgorithmParams& p,
                                           const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_reduce(const AlgorithmParams& p,
                                        const compiler::CompileOptions& o);
// One threadblock of one rank, one chunk: any count (the tails of the three above).
StatusOr<ef::Program> shared_gpu_allreduce_single(const AlgorithmParams& p,
                                                  const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_broadcast_single(const AlgorithmParams& p,
                                                  const compiler::CompileOptions& o);
StatusOr<ef::Program> shared_gpu_reduce_single(const AlgorithmParams& p,
                                               const compiler::CompileOptions& o);
// Hierarchical: nodes x gpus_per_node, nodes divides ranks (checked).
StatusOr<ef::Program> two_step_alltoall(const AlgorithmParams& p,
                                        const compiler::CompileOptions& o);
StatusOr<ef::Program> hierarchical_allreduce(const AlgorithmParams& p,
                                             const compiler::CompileOptions& o);
StatusOr<ef::Program> multilane_allreduce(const AlgorithmParams& p,
                                          const compiler::CompileOptions& o);
StatusOr<ef::Program> alltonext(const AlgorithmParams& p, const compiler::CompileOptions& o);

}  // namespace efccl::algorithms::detail
