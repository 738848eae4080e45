// Reduction operators a communicator creates (ncclRedOpCreatePreMulSum / ncclRedOpDestroy), and
// how a call's ncclRedOp_t becomes an ef::RedOp and, for premulsum, this rank's scalar.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/api_status.h"
#include "efccl/ef/datatype.h"

struct ncclComm;

namespace efccl::runtime {

/// ncclRedOpCreatePreMulSum: `scalar` is host memory read now (ncclScalarHostImmediate) or
/// device memory read at each call's enqueue (ncclScalarDevice). Arguments are checked.
ApiStatus create_premul_op(ncclComm* comm, void* scalar, ncclDataType_t datatype,
                           ncclScalarResidence_t residence, ncclRedOp_t* op);
/// ncclRedOpDestroy of an operator created on `comm`.
ApiStatus destroy_op(ncclComm* comm, ncclRedOp_t op);
/// The operator of a call of `dtype` on `comm`: a built-in one, or a premulsum operator with
/// this rank's scalar (a device-resident scalar is read now, in `stream`'s order).
ApiStatus resolve_op(ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype, cudaStream_t stream,
                     ef::RedOp* out, double* scalar);

}  // namespace efccl::runtime
