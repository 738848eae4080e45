// The fused interpreter kernel: several calls (of one or more executors) in one launch per
// device and stream. FusedParams places each call's threadblocks on a range of CTAs; a CTA
// runs the threadblocks that fall on it in call order, each exactly as the one-call kernel
// would (op_decoder.cuh), Simple and flagged programs alike.
//
// Why this cannot deadlock: a CTA holds at most one threadblock of a call, and every device
// orders the calls alike, so once every call before call k has finished, all threadblocks of
// call k run at once, which is all the one-call kernel guarantees (by induction on k). Calls
// of one executor share counters, flags and launch counts, so the placement puts every use of
// an executor on the same CTAs (threadblock t of its next call starts after t of its previous
// call ended on the same CTA); executor-owned memory is separate per use (the host's job).
//
// A threadblock that stops (timeout, abort) leaves its executor unusable; the CTA then skips its
// later threadblocks and marks their calls failed too (kErrorSkipped), so that their peers
// stop at once instead of waiting for the deadline.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "interpreter_kernel.h"
#include "kernel_dispatch.cuh"
#include "op_decoder.cuh"

// FusedParams is larger than the classic 4 KiB parameter limit; kernels may take up to 32 KiB
// of parameters since CUDA 12.1 (compute capability 7.0 and later).
#if !defined(CUDART_VERSION) || CUDART_VERSION < 12010
#error "the fused interpreter kernel needs CUDA 12.1 or later (kernel parameters over 4 KiB)"
#endif

namespace efccl::device {
namespace {

static_assert(sizeof(FusedParams) <= 32764, "FusedParams must fit CUDA's 32 KiB parameter limit");

template <typename E, Reduction R>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    fused_kernel(const __grid_constant__ FusedParams p) {
  __shared__ Staging staging;
  bool failed = false;  // CTA-uniform: run_threadblock's result comes from a barrier
  for (uint32_t c = 0; c < p.ncalls; ++c) {
    const FusedCall& call = p.calls[c];
    if (blockIdx.x < call.cta_begin || blockIdx.x - call.cta_begin >= call.nthreadblocks) continue;
    const uint32_t index = blockIdx.x - call.cta_begin;
    if (failed) {
      if (threadIdx.x == 0) {
        const ThreadblockDesc tb = call.threadblocks[index];
        const WaitSite site{tb.rank, tb.tb, -1, 0, kWaitNone, -1, -1};
        call.bound.post_error(kErrorSkipped, site, global_timer_ns(), 0);
      }
      continue;
    }
    const RankCallArgs* ranks = p.ranks + call.rank_begin;
    const bool ok = call.flagged != 0
                        ? run_threadblock<E, R, ProtoFlagged>(call, ranks, index, staging)
                        : run_threadblock<E, R, ProtoSimple>(call, ranks, index, staging);
    failed = !ok;
    __syncthreads();  // every thread is done with `staging` and the positions thread 0 stored
  }
}

}  // namespace

cudaError_t launch_fused(const FusedParams& params, int dtype, int reduction, int nblocks,
                         int threads, cudaStream_t stream) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      fused_kernel<E, decltype(r)::value><<<nblocks, threads, 0, stream>>>(params);
      return cudaGetLastError();
    });
  });
}

cudaError_t fused_blocks_per_sm(int dtype, int reduction, int threads, int* blocks) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          blocks, fused_kernel<E, decltype(r)::value>, threads, 0);
    });
  });
}

}  // namespace efccl::device
