// The boundary between the host code (C++20) and the resident kernel (resident_kernel.cu), like
// interpreter_kernel.h for the launched kernels.
#pragma once

#include <cuda_runtime_api.h>

#include "resident_queue.h"

namespace efccl::device {

/// Enqueues the resident grid (params.nctas CTAs of kResidentThreads threads) on `stream`. It
/// runs until the host raises ResidentHostState::stop_generation to params.generation.
cudaError_t launch_resident_grid(const ResidentGridParams& params, cudaStream_t stream);

/// How many resident CTAs fit on one SM of the current device.
cudaError_t resident_blocks_per_sm(int* blocks);

}  // namespace efccl::device
