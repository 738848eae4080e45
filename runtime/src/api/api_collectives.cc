// The NCCL ABI: reduction operators, collectives, send/receive and groups. Argument checks here
// (api/call_arguments.h); calls go to the thread's group (enqueue/group.h), and the outermost
// ncclGroupEnd completes the group's inits and splits (comm/grouped_init.h) before they run.
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "api/call_arguments.h"
#include "api/entry_point.h"
#include "base/device_guard.h"
#include "comm/communicator.h"
#include "comm/grouped_init.h"
#include "comm/reduction_ops.h"
#include "efccl/common/log.h"
#include "enqueue/group.h"
#include "enqueue/group_simulation.h"

using efccl::runtime::ApiStatus;
using efccl::runtime::CallKind;
using efccl::runtime::run_entry_point;
using efccl::runtime::run_grouped_entry_point;
using efccl::runtime::submit_call;

// ---- Reduction operators ----

EFCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  return run_entry_point("ncclRedOpCreatePreMulSum", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    return efccl::runtime::create_premul_op(comm, scalar, datatype, residence, op);
  });
}
EFCCL_ALIAS(ncclRedOpCreatePreMulSum)

EFCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return run_entry_point("ncclRedOpDestroy", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    return efccl::runtime::destroy_op(comm, op);
  });
}
EFCCL_ALIAS(ncclRedOpDestroy)

// ---- Collectives and point-to-point ----

EFCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) {
  return run_grouped_entry_point("ncclAllReduce", [&] {
    return submit_call(CallKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclAllReduce)

EFCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return run_grouped_entry_point("ncclBroadcast", [&] {
    return submit_call(CallKind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root,
                       comm, stream);
  });
}
EFCCL_ALIAS(ncclBroadcast)

EFCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return run_grouped_entry_point("ncclBcast", [&] {
    return submit_call(CallKind::kBroadcast, buff, buff, count, datatype, ncclSum, root, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclBcast)

EFCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return run_grouped_entry_point("ncclReduce", [&] {
    return submit_call(CallKind::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclReduce)

EFCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  return run_grouped_entry_point("ncclAllGather", [&] {
    return submit_call(CallKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
                       comm, stream);
  });
}
EFCCL_ALIAS(ncclAllGather)

EFCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  return run_grouped_entry_point("ncclReduceScatter", [&] {
    return submit_call(CallKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0,
                       comm, stream);
  });
}
EFCCL_ALIAS(ncclReduceScatter)

EFCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return run_grouped_entry_point("ncclAlltoAll", [&] {
    return submit_call(CallKind::kAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclAlltoAll)

EFCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  return run_grouped_entry_point("ncclGather", [&] {
    return submit_call(CallKind::kGather, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclGather)

EFCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  return run_grouped_entry_point("ncclScatter", [&] {
    return submit_call(CallKind::kScatter, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclScatter)

EFCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                int peer, ncclComm_t comm, cudaStream_t stream) {
  return run_grouped_entry_point("ncclSend", [&] {
    return submit_call(CallKind::kSend, sendbuff, nullptr, count, datatype, ncclSum, peer, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclSend)

EFCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  return run_grouped_entry_point("ncclRecv", [&] {
    return submit_call(CallKind::kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm,
                       stream);
  });
}
EFCCL_ALIAS(ncclRecv)

// ---- Groups ----

EFCCL_API ncclResult_t ncclGroupStart() {
  return run_entry_point("ncclGroupStart", [] { return efccl::runtime::group_start(); });
}
EFCCL_ALIAS(ncclGroupStart)

EFCCL_API ncclResult_t ncclGroupEnd() {
  return run_entry_point("ncclGroupEnd", [] {
    efccl::runtime::DeviceGuard guard;
    efccl::runtime::ClosedGroup closed = efccl::runtime::close_group("ncclGroupEnd");
    if (!closed.outermost) return closed.failure;
    // The group's inits and splits first (cancelled when the group failed), then its calls,
    // which run even when an init failed (calls on that communicator were refused already).
    const ApiStatus inits = efccl::runtime::finish_grouped_inits(closed.failure);
    if (!closed.failure) return closed.failure;
    const ApiStatus ran = efccl::runtime::run_group(std::move(closed.calls));
    return !inits ? inits : ran;
  });
}
EFCCL_ALIAS(ncclGroupEnd)

EFCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return run_entry_point("ncclGroupSimulateEnd", [&] {
    efccl::runtime::DeviceGuard guard;
    efccl::runtime::ClosedGroup closed = efccl::runtime::close_group("ncclGroupSimulateEnd");
    if (!closed.outermost) return closed.failure;
    // As ncclGroupEnd, except that the calls are estimated, not run (NCCL reads simInfo only
    // when the outermost group closes; a bad one fails the group like a failed call).
    ApiStatus failure = closed.failure;
    if (failure) failure = efccl::runtime::check_sim_info(simInfo);
    const ApiStatus inits = efccl::runtime::finish_grouped_inits(failure);
    if (!failure) return failure;
    if (!inits) return inits;
    if (closed.calls.empty()) return ApiStatus::ok();  // as NCCL: simInfo stays as it was
    efccl::StatusOr<double> time = efccl::runtime::estimate_group(closed.calls);
    if (!time)
      return ApiStatus::internal("estimating the group's time: " + time.status().message());
    constexpr std::size_t kTimeEnd =
        offsetof(ncclSimInfo_t, estimatedTime) + sizeof(simInfo->estimatedTime);
    if (simInfo->size >= kTimeEnd) simInfo->estimatedTime = static_cast<float>(*time);
    EFCCL_INFO(efccl::kLogTuning, -1,
               "ncclGroupSimulateEnd: " + std::to_string(closed.calls.size()) +
                   " call(s) not run; estimated time " + std::to_string(*time) + " us");
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclGroupSimulateEnd)
