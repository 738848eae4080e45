// Owning wrappers of the CUDA resources the device executor uses: the thread's capture mode,
// the current device, device memory, mapped host memory (allocated, or registered) and events. Each
// undoes what it did when it goes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::device {

/// Puts the calling thread in relaxed stream-capture mode for a scope. Creating an executor and
/// growing its scratch allocate and wait for private streams; under a global or thread-local
/// capture (PyTorch's default is global) those calls would invalidate the capture. None of them
/// touches a capturing stream: memory is zeroed on private non-blocking streams, and nothing
/// synchronises a device. NCCL switches modes around its allocations the same way.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

/// Makes `device` current for a scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

/// cudaMalloc'd memory on one device, zero-filled.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  /// Allocates `bytes` (at least 16) on `device` and waits until they are zero.
  Status allocate(int device, std::size_t bytes);
  /// Allocates and fills with `values`, waiting until they have landed.
  template <typename T>
  Status upload(int device, const std::vector<T>& values) {
    return upload_bytes(device, values.data(), values.size() * sizeof(T));
  }
  /// Zeroes the whole buffer and waits for it.
  Status zero();

  template <typename T = char>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  Status upload_bytes(int device, const void* data, std::size_t bytes);
  Status zero_now(std::size_t bytes);

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

/// Pinned host memory mapped into every device's address space (host writes, GPU polls).
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  ~MappedHostBuffer();
  /// Allocates `bytes`, zero-filled.
  Status allocate(std::size_t bytes);
  char* get() const { return static_cast<char*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Host memory allocated elsewhere (a shared segment), pinned and mapped into every device's
/// address space for a scope (cudaHostRegister, portable and mapped).
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();
  /// Registers [data, data + bytes).
  Status register_range(char* data, std::size_t bytes);
  /// Where device `device` reaches `host` (inside the range; cudaHostGetDevicePointer).
  static StatusOr<char*> device_pointer(char* host, int device);

 private:
  char* data_ = nullptr;
};

/// A CUDA event on one device, created on first use, destroyed with its owner.
class DeviceEvent {
 public:
  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& o) noexcept { *this = std::move(o); }
  DeviceEvent& operator=(DeviceEvent&& o) noexcept;
  ~DeviceEvent();
  /// The event, created on `device` (the current device) when first asked for.
  StatusOr<cudaEvent_t> get(int device);

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

}  // namespace efccl::device
