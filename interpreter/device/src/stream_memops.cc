// cuStreamBatchMemOp through the runtime's driver entry points.
#include "stream_memops.h"

#include <cuda.h>

#include <string>

#include "cuda_status.h"

namespace efccl::device {
namespace {

using BatchMemOp = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

/// The driver function `name` in its `version` signature, through the runtime (no -lcuda).
StatusOr<void*> driver_entry(const char* name, int version) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &entry, version, cudaEnableDefault, &found);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_error(std::string("cudaGetDriverEntryPointByVersion(") + name + ")", e);
  }
  if (found != cudaDriverEntryPointSuccess || entry == nullptr)
    return Status::error(std::string("the CUDA driver has no ") + name + " (version " +
                         std::to_string(version) + ") entry point (query result " +
                         std::to_string(static_cast<int>(found)) + ")");
  return entry;
}

/// The driver's cuStreamBatchMemOp (its CUDA 12.0 signature, the one cuda.h declares), looked
/// up once.
StatusOr<BatchMemOp> batch_mem_op() {
  static const StatusOr<void*> entry = driver_entry("cuStreamBatchMemOp", 12000);
  if (!entry) return entry.status();
  return reinterpret_cast<BatchMemOp>(*entry);
}

}  // namespace

Status write_then_wait(cudaStream_t stream, uint32_t* word, uint32_t value, uint32_t until) {
  auto fn = batch_mem_op();
  if (!fn) return fn.status();
  CUstreamBatchMemOpParams ops[2] = {};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = reinterpret_cast<CUdeviceptr>(word);
  ops[0].writeValue.value = value;
  ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;  // fenced after the earlier work
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = reinterpret_cast<CUdeviceptr>(word);
  ops[1].waitValue.value = until;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  const CUresult r = (*fn)(reinterpret_cast<CUstream>(stream), 2, ops, 0);
  if (r != CUDA_SUCCESS)
    return Status::error("cuStreamBatchMemOp (doorbell write and wait) failed with CUresult " +
                         std::to_string(static_cast<int>(r)));
  return Status::ok();
}

StatusOr<bool> lazy_module_loading() {
  using GetLoadingMode = CUresult (*)(CUmoduleLoadingMode*);
  auto entry = driver_entry("cuModuleGetLoadingMode", 11070);
  if (!entry) return entry.status();
  CUmoduleLoadingMode mode = CU_MODULE_LAZY_LOADING;
  const CUresult r = reinterpret_cast<GetLoadingMode>(*entry)(&mode);
  if (r != CUDA_SUCCESS)
    return Status::error("cuModuleGetLoadingMode failed with CUresult " +
                         std::to_string(static_cast<int>(r)));
  return mode == CU_MODULE_LAZY_LOADING;
}

}  // namespace efccl::device
