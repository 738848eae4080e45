// The boundary between the host code (C++20) and the kernels (C++17, interpreter_kernel.cu):
// launches and occupancy queries, selected at run time by datatype and operator.
#pragma once

#include <cuda_runtime_api.h>

#include "kernel_params.h"

namespace efccl::device {

/// `dtype` is an ef::DataType value; `reduction` a Reduction (sum, prod, min, max); `flagged`:
/// the program's connections are LL or LL128 (WireFormat), not Simple.
/// Enqueues one interpreter launch: one CTA per entry of params.threadblocks.
cudaError_t launch_interpreter(const KernelParams& params, int dtype, int reduction, bool flagged,
                               int nblocks, int threads, cudaStream_t stream);

/// How many CTAs of `threads` threads of the (dtype, reduction, flagged) kernel fit on one SM
/// of the current device.
cudaError_t interpreter_blocks_per_sm(int dtype, int reduction, bool flagged, int threads,
                                      int* blocks);

/// Enqueues one fused launch (kernel_params.h, FusedParams): `nblocks` CTAs run the
/// threadblocks of params.ncalls calls of one (dtype, reduction), Simple and flagged alike.
cudaError_t launch_fused(const FusedParams& params, int dtype, int reduction, int nblocks,
                         int threads, cudaStream_t stream);

/// How many CTAs of `threads` threads of the fused (dtype, reduction) kernel fit on one SM.
cudaError_t fused_blocks_per_sm(int dtype, int reduction, int threads, int* blocks);

/// Integer avg's final pass (dtype must be an integer type): divides the result regions of the
/// local ranks' API outputs by params.divisor, after the interpreter launch on the same stream.
cudaError_t launch_divide(const DivideParams& params, int dtype, cudaStream_t stream);

}  // namespace efccl::device
