// Stream memory operations (the CUDA driver's cuStreamBatchMemOp), reached through the runtime's
// cudaGetDriverEntryPointByVersion so that nothing links libcuda directly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "efccl/common/status.h"

namespace efccl::device {

/// Enqueues two memory operations on `stream`, as one batch: `*word = value` (after the
/// stream's earlier work, with a memory fence before it), then a wait until `*word == until`
/// (the stream's later work starts after it). `word` is device memory of the stream's device.
Status write_then_wait(cudaStream_t stream, uint32_t* word, uint32_t value, uint32_t until);

/// Whether the CUDA driver loads kernels lazily in this process (cuModuleGetLoadingMode: the
/// default unless CUDA_MODULE_LOADING=EAGER). Under lazy loading, loading a kernel may wait for
/// every kernel on the device to finish, so a kernel that never finishes on its own (the
/// resident grid) can make that wait forever. An error when the driver cannot say.
StatusOr<bool> lazy_module_loading();

}  // namespace efccl::device
