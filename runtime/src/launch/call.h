// One API call of one rank, as recorded by the group until the outermost ncclGroupEnd.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/ef/program.h"

namespace efccl::runtime {

class Clique;

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
  std::shared_ptr<Clique> clique;  ///< keeps the clique alive until the group ends
  int32_t rank = 0;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  uint64_t count = 0;
  ef::DataType dtype = ef::DataType::kFloat32;
  ef::RedOp op = ef::RedOp::kSum;
  double premul_scalar = 1.0;  ///< kPreMulSum: this rank's scalar, read at enqueue time
  int32_t root = 0;            ///< rooted collectives: the root; send/recv: the peer
  cudaStream_t stream = nullptr;
  uint64_t sequence = 0;  ///< per-rank collective number in the clique (set by the clique)
};

inline bool is_p2p(CallKind k) { return k == CallKind::kSend || k == CallKind::kRecv; }
inline bool is_rooted(CallKind k) {
  return k == CallKind::kBroadcast || k == CallKind::kReduce || k == CallKind::kGather ||
         k == CallKind::kScatter;
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

}  // namespace efccl::runtime
