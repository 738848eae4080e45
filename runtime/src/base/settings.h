// The runtime's EFCCL_* settings, read from the environment. A value that is not what the
// variable takes is reported once (WARN, naming the variable and the value) and the default used.
#pragma once

#include <chrono>
#include <cstddef>

namespace efccl::runtime {

/// EFCCL_TIMEOUT_MS (default 600000, as PyTorch's NCCL watchdog): how long a kernel wait or a
/// rank's call waiting for the others may go without progress.
std::chrono::nanoseconds call_timeout();
/// EFCCL_INIT_TIMEOUT_MS (default 120000): how long ranks wait for each other in
/// ncclCommInitRank* and ncclCommSplit/Shrink.
std::chrono::milliseconds init_timeout();
/// EFCCL_EXECUTOR_CACHE (default 256, at most 2^20): prepared programs kept per clique.
std::size_t executor_cache_capacity();
/// EFCCL_GROUP_FUSION: 1 (default) enqueues a group's launches together, fused where the kernels
/// allow; 0 launches every program run on its own.
bool group_fusion_enabled();

}  // namespace efccl::runtime
