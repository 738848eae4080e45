#include "api/call_arguments.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "base/device_guard.h"
#include "comm/communicator.h"
#include "comm/reduction_ops.h"
#include "enqueue/group.h"

namespace efccl::runtime {

ApiStatus check_datatype(ncclDataType_t t) {
  if (static_cast<int>(t) < 0 || static_cast<int>(t) >= ncclNumTypes)
    return ApiStatus::invalid_argument("invalid datatype " + std::to_string(static_cast<int>(t)) +
                                       " (valid: 0.." + std::to_string(ncclNumTypes - 1) + ")");
  return ApiStatus::ok();
}

ApiStatus submit_call(CallKind kind, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                      cudaStream_t stream) {
  if (ApiStatus s = check_comm(comm); !s) return s;
  if (comm->revoked.load())
    return ApiStatus::invalid_usage(
        "the communicator was revoked (ncclCommRevoke): only destroy, "
        "split and shrink are allowed");
  if (ApiStatus s = check_datatype(datatype); !s) return s;
  const int nranks = comm->clique->nranks();
  const bool p2p = is_p2p(kind);
  if ((is_rooted(kind) || p2p) && (root < 0 || root >= nranks))
    return ApiStatus::invalid_argument(std::string(p2p ? "peer " : "root ") + std::to_string(root) +
                                       " is out of range (the communicator has " +
                                       std::to_string(nranks) + " ranks)");
  // Element counts: total bytes of the largest API buffer must be addressable.
  const uint64_t size = ef::size_of(static_cast<ef::DataType>(datatype));
  const bool per_block = kind == CallKind::kAllGather || kind == CallKind::kReduceScatter ||
                         kind == CallKind::kAllToAll || kind == CallKind::kGather ||
                         kind == CallKind::kScatter;
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / size /
                         (per_block ? static_cast<uint64_t>(nranks) : 1);
  if (count > limit)
    return ApiStatus::invalid_argument(
        "count " + std::to_string(count) + " of " +
        std::string(ef::to_string(static_cast<ef::DataType>(datatype))) +
        " overflows the buffer size");
  if (count > 0) {
    const bool root_rank = comm->rank == root;
    bool need_send = true, need_recv = true;
    switch (kind) {
      case CallKind::kBroadcast:
        need_send = root_rank;
        break;
      case CallKind::kReduce:
      case CallKind::kGather:
        need_recv = root_rank;
        break;
      case CallKind::kScatter:
        need_send = root_rank;
        break;
      case CallKind::kSend:
        need_recv = false;
        break;
      case CallKind::kRecv:
        need_send = false;
        break;
      default:
        break;
    }
    if (need_send && sendbuff == nullptr) return ApiStatus::invalid_argument("sendbuff is NULL");
    if (need_recv && recvbuff == nullptr) return ApiStatus::invalid_argument("recvbuff is NULL");
  }
  Call call;
  call.kind = kind;
  call.rank = comm->rank;
  call.sendbuff = sendbuff;
  call.recvbuff = recvbuff;
  call.count = count;
  call.dtype = static_cast<ef::DataType>(datatype);
  if (p2p)
    call.peer = root;
  else if (is_rooted(kind))
    call.root = root;
  call.stream = stream;
  if (reduces(kind))
    if (ApiStatus s = resolve_op(comm, op, datatype, stream, &call.op, &call.premul_scalar); !s)
      return s;
  DeviceGuard guard;
  return enqueue(comm->clique, std::move(call));
}

}  // namespace efccl::runtime
