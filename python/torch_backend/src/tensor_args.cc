#include "tensor_args.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <limits>

namespace efccl::torch_backend {
namespace {

/// efccl's type for an element type, if it has one.
bool efccl_type(at::ScalarType t, ncclDataType_t* out) {
  switch (t) {
    case at::kChar:
      *out = ncclInt8;
      return true;
    case at::kByte:
      *out = ncclUint8;
      return true;
    case at::kBool:
      *out = ncclUint8;
      return true;
    case at::kInt:
      *out = ncclInt32;
      return true;
    case at::kUInt32:
      *out = ncclUint32;
      return true;
    case at::kLong:
      *out = ncclInt64;
      return true;
    case at::kUInt64:
      *out = ncclUint64;
      return true;
    case at::kHalf:
      *out = ncclFloat16;
      return true;
    case at::kFloat:
      *out = ncclFloat32;
      return true;
    case at::kDouble:
      *out = ncclFloat64;
      return true;
    case at::kBFloat16:
      *out = ncclBfloat16;
      return true;
    case at::kFloat8_e4m3fn:
      *out = ncclFloat8e4m3;
      return true;
    case at::kFloat8_e5m2:
      *out = ncclFloat8e5m2;
      return true;
    default:
      return false;
  }
}

/// The real type complex `t` is made of (torch.view_as_real), if `t` is complex.
bool complex_part(at::ScalarType t, ncclDataType_t* out) {
  switch (t) {
    case at::kComplexHalf:
      *out = ncclFloat16;
      return true;
    case at::kComplexFloat:
      *out = ncclFloat32;
      return true;
    case at::kComplexDouble:
      *out = ncclFloat64;
      return true;
    default:
      return false;
  }
}

template <typename T>
void store(T value, unsigned char out[8]) {
  static_assert(sizeof(T) <= 8);
  std::memcpy(out, &value, sizeof(T));
}

}  // namespace

BufferArgs buffer_of(const at::Tensor& t, bool reducing, const char* op) {
  BufferArgs b;
  b.data = t.data_ptr();
  const auto n = static_cast<size_t>(t.numel());
  if (efccl_type(t.scalar_type(), &b.type)) {
    b.count = n;
    return b;
  }
  if (complex_part(t.scalar_type(), &b.type)) {  // a pair of reals per element
    b.count = n * 2;
    return b;
  }
  TORCH_CHECK(!reducing, "efccl ", op, ": tensors of type ", t.scalar_type(),
              " cannot be reduced (efccl reduces int8, uint8, bool, int32, uint32, int64, uint64, "
              "float16, bfloat16, float32, float64, float8 and complex tensors)");
  b.type = ncclInt8;  // moved as bytes
  b.count = n * t.element_size();
  return b;
}

void check_tensor(const at::Tensor& t, const at::Device& device, const char* op, const char* role,
                  bool contiguous) {
  TORCH_CHECK(t.defined(), "efccl ", op, ": the ", role, " tensor is undefined");
  TORCH_CHECK(t.is_cuda(), "efccl ", op, ": the ", role, " tensor is on ", t.device(),
              "; the efccl backend serves CUDA tensors (use \"cpu:gloo,cuda:efccl\" for both)");
  TORCH_CHECK(t.layout() == at::kStrided, "efccl ", op, ": the ", role,
              " tensor is sparse or not strided");
  TORCH_CHECK(t.device() == device, "efccl ", op, ": the ", role, " tensor is on ", t.device(),
              " but this process group's communicator is on ", device,
              " (one device per process and group)");
  if (contiguous) {
    TORCH_CHECK(t.is_contiguous(), "efccl ", op, ": the ", role,
                " tensor must be contiguous (call .contiguous())");
  } else {
    TORCH_CHECK(t.is_non_overlapping_and_dense(), "efccl ", op, ": the ", role,
                " tensor must be dense without overlapping elements");
  }
}

void check_single(const std::vector<at::Tensor>& tensors, const char* op, const char* role) {
  TORCH_CHECK(tensors.size() == 1, "efccl ", op, ": expected one ", role,
              " tensor per process, got ", tensors.size(), " (one device per process)");
}

void check_same_shape(const std::vector<at::Tensor>& ts, const at::Tensor& like, const char* op,
                      const char* role) {
  for (size_t i = 0; i < ts.size(); ++i) {
    TORCH_CHECK(ts[i].numel() == like.numel() && ts[i].scalar_type() == like.scalar_type(),
                "efccl ", op, ": ", role, " tensor ", i, " has ", ts[i].numel(), " elements of ",
                ts[i].scalar_type(), "; expected ", like.numel(), " of ", like.scalar_type());
  }
}

ReduceArgs reduce_args_of(const c10d::ReduceOp& op, const at::Tensor& data, const char* opname) {
  ReduceArgs r;
  const bool is_bool = data.scalar_type() == at::kBool;
  const bool is_complex = at::isComplexType(data.scalar_type());
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      r.op = is_bool ? ncclMax : ncclSum;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = is_bool ? ncclMin : ncclProd;
      break;
    case c10d::ReduceOp::MIN:
      r.op = ncclMin;
      break;
    case c10d::ReduceOp::MAX:
      r.op = ncclMax;
      break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!is_bool, "efccl ", opname, ": ReduceOp.AVG of bool tensors is undefined");
      r.op = ncclAvg;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(!is_bool, "efccl ", opname, ": premul_sum of bool tensors is undefined");
      TORCH_CHECK(op.supplement_, "efccl ", opname,
                  ": a PREMUL_SUM op without its factor (make it with "
                  "torch.distributed._make_nccl_premul_sum)");
      // PREMUL_SUM ops are made only by makeNCCLPreMulSum, whose supplement is this type.
      const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      r.premul = true;
      if (s->tensor_factor.defined()) {
        TORCH_CHECK(s->tensor_factor.numel() == 1, "efccl ", opname,
                    ": the premul_sum factor tensor must have one element");
        at::ScalarType want =
            is_complex ? c10::toRealValueType(data.scalar_type()) : data.scalar_type();
        r.premul_on_device = true;
        r.factor_tensor = s->tensor_factor.to(data.device(), want).contiguous();
      } else {
        r.factor = s->double_factor;
      }
      break;
    }
    default:
      TORCH_CHECK(false, "efccl ", opname, ": reduce op ", static_cast<int>(op.op_),
                  " (bitwise AND/OR/XOR) is not supported by efccl, as by NCCL");
  }
  if (is_complex)
    TORCH_CHECK(op.op_ == c10d::ReduceOp::SUM || op.op_ == c10d::ReduceOp::AVG ||
                    op.op_ == c10d::ReduceOp::PREMUL_SUM,
                "efccl ", opname,
                ": complex tensors can only be reduced with SUM, AVG or "
                "PREMUL_SUM (they are reduced as pairs of reals)");
  return r;
}

void encode_factor(double factor, ncclDataType_t type, unsigned char out[8]) {
  std::memset(out, 0, 8);
  switch (type) {
    case ncclInt8:
      store(static_cast<int8_t>(factor), out);
      break;
    case ncclUint8:
      store(static_cast<uint8_t>(factor), out);
      break;
    case ncclInt32:
      store(static_cast<int32_t>(factor), out);
      break;
    case ncclUint32:
      store(static_cast<uint32_t>(factor), out);
      break;
    case ncclInt64:
      store(static_cast<int64_t>(factor), out);
      break;
    case ncclUint64:
      store(static_cast<uint64_t>(factor), out);
      break;
    case ncclFloat16:
      store(c10::Half(static_cast<float>(factor)), out);
      break;
    case ncclFloat32:
      store(static_cast<float>(factor), out);
      break;
    case ncclFloat64:
      store(factor, out);
      break;
    case ncclBfloat16:
      store(c10::BFloat16(static_cast<float>(factor)), out);
      break;
    case ncclFloat8e4m3:
      store(c10::Float8_e4m3fn(static_cast<float>(factor)), out);
      break;
    case ncclFloat8e5m2:
      store(c10::Float8_e5m2(static_cast<float>(factor)), out);
      break;
    default:
      TORCH_CHECK(false, "efccl premul_sum: no factor encoding for type ", type);
  }
}

uint64_t bytes_of(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

const char* op_type_name(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST:
      return "broadcast";
    case c10d::OpType::ALLREDUCE:
      return "allreduce";
    case c10d::OpType::ALLREDUCE_COALESCED:
      return "allreduce_coalesced";
    case c10d::OpType::REDUCE:
      return "reduce";
    case c10d::OpType::ALLGATHER:
      return "allgather";
    case c10d::OpType::_ALLGATHER_BASE:
      return "allgather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED:
      return "allgather_coalesced";
    case c10d::OpType::GATHER:
      return "gather";
    case c10d::OpType::SCATTER:
      return "scatter";
    case c10d::OpType::REDUCE_SCATTER:
      return "reduce_scatter";
    case c10d::OpType::ALLTOALL_BASE:
      return "alltoall_base";
    case c10d::OpType::ALLTOALL:
      return "alltoall";
    case c10d::OpType::SEND:
      return "send";
    case c10d::OpType::RECV:
      return "recv";
    case c10d::OpType::RECVANYSOURCE:
      return "recv_anysource";
    case c10d::OpType::BARRIER:
      return "barrier";
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return "reduce_scatter_tensor";
    case c10d::OpType::COALESCED:
      return "coalesced";
    case c10d::OpType::_ALLREDUCE_SPARSE:
      return "allreduce_sparse";
    default:
      return "unknown";
  }
}

}  // namespace efccl::torch_backend
