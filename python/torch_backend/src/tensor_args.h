// What efccl is given for torch tensors and reduce ops: datatypes, operators (premul_sum
// included), element counts, and the checks that make a bad tensor an error naming the
// operation, never a wrong read of GPU memory.
#pragma once

#include <ATen/ATen.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace efccl::torch_backend {

/// A tensor as efccl sees it: a base pointer, an element count and a datatype. Reductions
/// need the tensor's own type; moves (allgather, broadcast, all-to-all, send, ...) may carry any
/// type as bytes.
struct BufferArgs {
  void* data = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclUint8;
};

/// Every element of `t` (dense, no overlap) as efccl's `type`: for reductions (`reducing`) the
/// tensor's own element type (complex as pairs of reals); otherwise whole bytes when the type has
/// no efccl equivalent. Throws naming `op` for an unsupported type.
BufferArgs buffer_of(const at::Tensor& t, bool reducing, const char* op);

/// Throws unless `t` is a dense CUDA tensor on `device` that efccl can address from its data
/// pointer: contiguous (`contiguous`), or at least non-overlapping and dense.
void check_tensor(const at::Tensor& t, const at::Device& device, const char* op, const char* role,
                  bool contiguous);

/// Throws unless `tensors` holds exactly one tensor (torch passes one per process).
void check_single(const std::vector<at::Tensor>& tensors, const char* op, const char* role);

/// Throws unless every tensor of `ts` has the size and type of `like`.
void check_same_shape(const std::vector<at::Tensor>& ts, const at::Tensor& like, const char* op,
                      const char* role);

/// A reduce op for efccl: a built-in ncclRedOp_t, or a premul_sum to create per call.
struct ReduceArgs {
  ncclRedOp_t op = ncclSum;
  bool premul = false;            ///< create ncclRedOpCreatePreMulSum before the call
  bool premul_on_device = false;  ///< the factor is `factor_tensor` (ncclScalarDevice)
  double factor = 1.0;            ///< the host factor otherwise (ncclScalarHostImmediate)
  at::Tensor factor_tensor;       ///< one element of the data's type, on the data's device
};

/// The efccl operator for `op` on data of `type` (bool: SUM is MAX and PRODUCT is MIN, as
/// torch's NCCL group does); throws for what efccl cannot do (bitwise ops, AVG of bool, ...).
ReduceArgs reduce_args_of(const c10d::ReduceOp& op, const at::Tensor& data, const char* opname);

/// The host scalar `factor` in the representation of efccl `type` (8 bytes, zero padded).
void encode_factor(double factor, ncclDataType_t type, unsigned char out[8]);

/// Bytes of `t` (numel times element size).
uint64_t bytes_of(const at::Tensor& t);

/// Short name of an OpType ("allreduce", "send", ...).
const char* op_type_name(c10d::OpType type);

}  // namespace efccl::torch_backend
