// Scoped atomic loads and stores with an explicit memory order (cuda::atomic_ref), for the
// counters and flags the interpreter's CTAs exchange: system scope for what crosses devices or
// reaches the host, device scope for dependency flags (same rank, same GPU).
#pragma once

#include <cuda/atomic>

namespace efccl::device {

template <typename T>
__device__ __forceinline__ T load_acquire_system(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}
template <typename T>
__device__ __forceinline__ void store_release_system(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}
template <typename T>
__device__ __forceinline__ T load_relaxed_system(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_relaxed);
}
template <typename T>
__device__ __forceinline__ void store_relaxed_system(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_relaxed);
}
template <typename T>
__device__ __forceinline__ T load_acquire_device(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).load(cuda::memory_order_acquire);
}
template <typename T>
__device__ __forceinline__ void store_release_device(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_device>(*p).store(v, cuda::memory_order_release);
}

}  // namespace efccl::device
