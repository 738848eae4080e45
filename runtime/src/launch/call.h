// One API call of one rank, as the runtime carries it from the entry point to the launch: the
// group records it (enqueue/group.h), the clique's call queue matches it with the other ranks'
// (enqueue/call_queue.h), and a runner turns matched calls into program launches (launch/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/ef/program.h"

namespace efccl::runtime {

enum class CallKind : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};

struct Call {
  CallKind kind = CallKind::kAllReduce;
  int32_t rank = 0;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  uint64_t count = 0;
  ef::DataType dtype = ef::DataType::kFloat32;
  ef::RedOp op = ef::RedOp::kSum;
  double premul_scalar = 1.0;  ///< kPreMulSum: this rank's scalar, read at enqueue time
  int32_t root = 0;            ///< rooted collectives: the root (0 otherwise)
  int32_t peer = -1;           ///< ncclSend/ncclRecv: the other rank (-1 otherwise)
  cudaStream_t stream = nullptr;
  uint64_t sequence = 0;  ///< per-rank collective number in the clique (set by the call queue)
};

inline bool is_p2p(CallKind k) { return k == CallKind::kSend || k == CallKind::kRecv; }
inline bool is_rooted(CallKind k) {
  return k == CallKind::kBroadcast || k == CallKind::kReduce || k == CallKind::kGather ||
         k == CallKind::kScatter;
}
/// Collectives whose operator matters (allreduce, reduce, reduce-scatter).
inline bool reduces(CallKind k) {
  return k == CallKind::kAllReduce || k == CallKind::kReduce || k == CallKind::kReduceScatter;
}

/// NCCL's in-place rule for this rank's call (docs/ef-format.md §2); false for send/recv.
bool is_inplace(const Call& c);
/// The program collective of a collective call (not for send/recv).
ef::Collective collective_of(CallKind k);
/// "ncclAllReduce", ...
const char* api_name(CallKind k);
/// e.g. "ncclAllReduce(count 1000, float, sum)" for mismatch messages and logs.
std::string describe(const Call& c);
/// "0, 2, 3": ranks for messages.
std::string rank_list(const std::vector<int32_t>& ranks);
/// The bytes a call's count covers on this rank (count x element size).
inline uint64_t call_bytes(const Call& c) { return c.count * ef::size_of(c.dtype); }

}  // namespace efccl::runtime
