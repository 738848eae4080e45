// The argument checks of the collective and point-to-point entry points, as NCCL makes them,
// before a call is recorded in the thread's group.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/api_status.h"
#include "launch/call.h"

namespace efccl::runtime {

/// ncclInvalidArgument unless `t` is one of nccl.h's datatypes.
ApiStatus check_datatype(ncclDataType_t t);

/// Checks one call as NCCL does (communicator, datatype, root or peer, count, buffers, operator)
/// and records it in the thread's group (or runs it, outside a group). `root` is the peer for
/// ncclSend/ncclRecv.
ApiStatus submit_call(CallKind kind, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                      cudaStream_t stream);

}  // namespace efccl::runtime
