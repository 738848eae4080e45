#include "comm/reduction_ops.h"

#include <cstring>
#include <mutex>
#include <string>

#include "base/device_guard.h"
#include "comm/communicator.h"
#include "efccl/host/numeric.h"

namespace efccl::runtime {
namespace {

/// A scalar of `dtype` at `p` (host memory) as a double.
double scalar_value(ef::DataType dtype, const void* p) { return host::element_to_double(dtype, p); }

}  // namespace

ApiStatus create_premul_op(ncclComm* comm, void* scalar, ncclDataType_t datatype,
                           ncclScalarResidence_t residence, ncclRedOp_t* op) {
  if (op == nullptr) return ApiStatus::invalid_argument("op is NULL");
  if (scalar == nullptr) return ApiStatus::invalid_argument("scalar is NULL");
  if (static_cast<int>(datatype) < 0 || static_cast<int>(datatype) >= ncclNumTypes)
    return ApiStatus::invalid_argument("invalid datatype " +
                                       std::to_string(static_cast<int>(datatype)));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return ApiStatus::invalid_argument("invalid scalar residence " +
                                       std::to_string(static_cast<int>(residence)));
  PreMulSumOp created;
  created.in_use = true;
  created.dtype = static_cast<ef::DataType>(datatype);
  created.device_resident = residence == ncclScalarDevice;
  if (created.device_resident)
    created.device_scalar = scalar;
  else
    created.host_value = scalar_value(created.dtype, scalar);
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  std::size_t index = 0;
  while (index < comm->premul_ops.size() && comm->premul_ops[index].in_use) ++index;
  if (index >= static_cast<std::size_t>(ncclMaxRedOp - ncclNumOps))
    return ApiStatus::internal("too many reduction operators on this communicator");
  if (index == comm->premul_ops.size())
    comm->premul_ops.push_back(created);
  else
    comm->premul_ops[index] = created;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(index));
  return ApiStatus::ok();
}

ApiStatus destroy_op(ncclComm* comm, ncclRedOp_t op) {
  const int index = static_cast<int>(op) - ncclNumOps;
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  if (static_cast<int>(op) < ncclNumOps)
    return ApiStatus::invalid_argument("operator " + std::to_string(static_cast<int>(op)) +
                                       " is built in and cannot be destroyed");
  if (index >= static_cast<int>(comm->premul_ops.size()) ||
      !comm->premul_ops[static_cast<std::size_t>(index)].in_use)
    return ApiStatus::invalid_argument("operator " + std::to_string(static_cast<int>(op)) +
                                       " was not created on this communicator");
  comm->premul_ops[static_cast<std::size_t>(index)].in_use = false;
  return ApiStatus::ok();
}

ApiStatus resolve_op(ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype, cudaStream_t stream,
                     ef::RedOp* out, double* scalar) {
  const int v = static_cast<int>(op);
  if (v >= 0 && v < ncclNumOps) {
    *out = static_cast<ef::RedOp>(v);
    return ApiStatus::ok();
  }
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  const int index = v - ncclNumOps;
  if (v < 0 || index >= static_cast<int>(comm->premul_ops.size()) ||
      !comm->premul_ops[static_cast<std::size_t>(index)].in_use)
    return ApiStatus::invalid_argument("invalid reduction operator " + std::to_string(v) +
                                       " (not built in, and not created on this communicator "
                                       "by ncclRedOpCreatePreMulSum)");
  const PreMulSumOp& p = comm->premul_ops[static_cast<std::size_t>(index)];
  if (static_cast<int>(p.dtype) != static_cast<int>(dtype))
    return ApiStatus::invalid_argument(
        "reduction operator " + std::to_string(v) + " was created for datatype " +
        std::string(ef::to_string(p.dtype)) + " but the call uses " +
        std::string(ef::to_string(static_cast<ef::DataType>(dtype))));
  *out = ef::RedOp::kPreMulSum;
  *scalar = p.host_value;
  if (p.device_resident) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
        status != cudaStreamCaptureStatusNone)
      return ApiStatus::invalid_usage(
          "a premulsum operator with a device-resident scalar cannot be used during CUDA graph "
          "capture yet (efccl reads the scalar when the call is enqueued)");
    DeviceGuard guard;
    unsigned char bytes[8] = {};
    cudaSetDevice(comm->device);
    // In the call's stream order, so that a kernel the caller queued to compute the scalar has
    // finished (the legacy default stream does not order against non-blocking streams).
    cudaError_t e =
        cudaMemcpyAsync(bytes, p.device_scalar, ef::size_of(p.dtype), cudaMemcpyDefault, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess)
      return ApiStatus::cuda(std::string("reading the premulsum scalar: ") + cudaGetErrorString(e));
    *scalar = scalar_value(p.dtype, bytes);
  }
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
