// The interpreter kernel for one call: CTA i runs threadblock i of the device's ranks
// (op_decoder.cuh), and integer avg's division pass; their launchers and occupancy.
#include <algorithm>
#include <cstdint>

#include "interpreter_kernel.h"
#include "kernel_dispatch.cuh"
#include "op_decoder.cuh"

namespace efccl::device {
namespace {

template <typename E, Reduction R, typename Protocol>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    interpreter_kernel(const __grid_constant__ KernelParams p) {
  __shared__ Staging staging;
  run_threadblock<E, R, Protocol>(p, p.ranks, blockIdx.x, staging,
                                  p.xproc.active != 0 ? &p.xproc : nullptr);
}

template <typename E>
__global__ void divide_kernel(const __grid_constant__ DivideParams p) {
  using S = typename E::Storage;
  for (uint32_t k = blockIdx.y; k < p.nsegments; k += gridDim.y) {
    const DivideSegment seg = p.segments[k];
    S* data = reinterpret_cast<S*>(p.outputs[seg.local_rank]) +
              static_cast<uint64_t>(seg.first_chunk) * p.chunk_elements;
    const uint64_t n = static_cast<uint64_t>(seg.chunks) * p.chunk_elements;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
      data[i] = divide_element<E>(data[i], p.divisor);
  }
}

template <typename E, Reduction R>
cudaError_t launch_typed(const KernelParams& params, bool flagged, int nblocks, int threads,
                         cudaStream_t stream) {
  if (flagged) {
    interpreter_kernel<E, R, ProtoFlagged><<<nblocks, threads, 0, stream>>>(params);
  } else {
    interpreter_kernel<E, R, ProtoSimple><<<nblocks, threads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

template <typename E, Reduction R>
cudaError_t occupancy_typed(bool flagged, int threads, int* blocks) {
  return flagged ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       blocks, interpreter_kernel<E, R, ProtoFlagged>, threads, 0)
                 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       blocks, interpreter_kernel<E, R, ProtoSimple>, threads, 0);
}

}  // namespace

cudaError_t launch_interpreter(const KernelParams& params, int dtype, int reduction, bool flagged,
                               int nblocks, int threads, cudaStream_t stream) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      return launch_typed<E, decltype(r)::value>(params, flagged, nblocks, threads, stream);
    });
  });
}

cudaError_t interpreter_blocks_per_sm(int dtype, int reduction, bool flagged, int threads,
                                      int* blocks) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      return occupancy_typed<E, decltype(r)::value>(flagged, threads, blocks);
    });
  });
}

cudaError_t launch_divide(const DivideParams& params, int dtype, cudaStream_t stream) {
  if (params.nsegments == 0 || params.largest_segment_elements == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  constexpr uint64_t kMaxBlocksPerSegment = 1024;
  const uint64_t wanted = (params.largest_segment_elements + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(std::min(wanted, kMaxBlocksPerSegment)),
                  std::min(params.nsegments, 65535u));
  return with_element(dtype, [&](auto element) -> cudaError_t {
    using E = typename decltype(element)::Type;
    if constexpr (kIsInteger<E>) {
      divide_kernel<E><<<grid, kThreads, 0, stream>>>(params);
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace efccl::device
