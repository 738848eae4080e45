// Relaxed stream-capture mode for the calling thread while it lives: the runtime's own threads
// (and its calls outside the user's capture) query and create events, which must not invalidate
// a capture in global mode (PyTorch's default) that another thread has under way.
#pragma once

#include <cuda_runtime_api.h>

namespace efccl::runtime {

class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace efccl::runtime
