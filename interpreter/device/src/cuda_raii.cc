// Owning wrappers of CUDA resources.
#include "cuda_raii.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "cuda_status.h"

namespace efccl::device {

RelaxedCaptureMode::RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
RelaxedCaptureMode::~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }

DeviceScope::DeviceScope(int device) {
  cudaGetDevice(&previous_);
  if (previous_ != device) cudaSetDevice(device);
}

DeviceScope::~DeviceScope() {
  // Only when something changed it (cudaGetDevice is a thread-local read, cudaSetDevice is
  // not free, and scopes sit on every launch).
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != previous_) cudaSetDevice(previous_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) {
    DeviceScope scope(device_);
    cudaFree(ptr_);
  }
}

Status DeviceBuffer::allocate(int device, std::size_t bytes) {
  DeviceScope scope(device);
  device_ = device;
  const cudaError_t e = cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 16));
  if (e != cudaSuccess) {
    // Not sticky: clear it, or the next launch's cudaGetLastError would report it as its own.
    (void)cudaGetLastError();
    ptr_ = nullptr;
    return cuda_error(
        "cudaMalloc(" + std::to_string(bytes) + " bytes) on device " + std::to_string(device), e);
  }
  bytes_ = bytes;
  return zero_now(std::max<std::size_t>(bytes, 16));
}

Status DeviceBuffer::upload_bytes(int device, const void* data, std::size_t bytes) {
  if (Status s = allocate(device, bytes); !s) return s;
  if (bytes == 0) return Status::ok();
  DeviceScope scope(device);
  // On a private stream, waited for: a pageable cudaMemcpy may return before its DMA lands,
  // and the first launch (on a non-blocking stream) would not wait for it.
  cudaStream_t s = nullptr;
  EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaError_t e = cudaMemcpyAsync(ptr_, data, bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  EFCCL_CUDA_RETURN(e, "uploading the program to device " + std::to_string(device));
  return Status::ok();
}

Status DeviceBuffer::zero() {
  if (ptr_ == nullptr) return Status::ok();
  DeviceScope scope(device_);
  return zero_now(bytes_);
}

/// Zeroes the first `bytes` and waits for exactly that: cudaMemset would run on the legacy
/// stream, which kernels on non-blocking streams do not wait for (a first launch could read
/// stale flags), and a device-wide sync would wait for other, possibly spinning, kernels.
Status DeviceBuffer::zero_now(std::size_t bytes) {
  cudaStream_t s = nullptr;
  EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaError_t e = cudaMemsetAsync(ptr_, 0, bytes, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  EFCCL_CUDA_RETURN(
      e, "zeroing " + std::to_string(bytes) + " bytes on device " + std::to_string(device_));
  return Status::ok();
}

MappedHostBuffer::~MappedHostBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

Status MappedHostBuffer::allocate(std::size_t bytes) {
  EFCCL_CUDA_RETURN(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                    "cudaHostAlloc (mapped)");
  std::memset(ptr_, 0, bytes);
  bytes_ = bytes;
  return Status::ok();
}

HostRegistration::~HostRegistration() {
  if (data_ != nullptr) cudaHostUnregister(data_);
}

Status HostRegistration::register_range(char* data, std::size_t bytes) {
  const cudaError_t e =
      cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the next launch must not report it as its own
    return cuda_error("cudaHostRegister of " + std::to_string(bytes) + " bytes of shared memory",
                      e);
  }
  data_ = data;
  return Status::ok();
}

StatusOr<char*> HostRegistration::device_pointer(char* host, int device) {
  DeviceScope scope(device);
  void* p = nullptr;
  EFCCL_CUDA_RETURN(
      cudaHostGetDevicePointer(&p, host, 0),
      "cudaHostGetDevicePointer of pinned host memory on device " + std::to_string(device));
  return static_cast<char*>(p);
}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& o) noexcept {
  std::swap(event_, o.event_);
  std::swap(device_, o.device_);
  return *this;
}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) {
    DeviceScope scope(device_);
    cudaEventDestroy(event_);
  }
}

StatusOr<cudaEvent_t> DeviceEvent::get(int device) {
  if (event_ == nullptr) {
    device_ = device;
    EFCCL_CUDA_RETURN(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                      "cudaEventCreate on device " + std::to_string(device));
  }
  return event_;
}

}  // namespace efccl::device
