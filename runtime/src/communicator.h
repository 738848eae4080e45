// The communicator behind ncclComm_t: one rank of a clique. Handles are checked against a
// process-wide set of live communicators before they are touched, so a destroyed or foreign
// pointer gives ncclInvalidArgument instead of a crash; the magic field catches corruption.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "api_status.h"
#include "clique.h"

namespace efccl::runtime {

/// A ncclRedOp_t made by ncclRedOpCreatePreMulSum.
struct PreMulSumOp {
  bool in_use = false;
  ef::DataType dtype = ef::DataType::kFloat32;
  bool device_resident = false;  ///< ncclScalarDevice: read at each call's enqueue
  double host_value = 1.0;       ///< ncclScalarHostImmediate: read at creation
  const void* device_scalar = nullptr;
};

inline constexpr uint64_t kCommMagic = 0xefcc1c0111u;
inline constexpr uint64_t kCommDeadMagic = 0xdeadc0111u;

}  // namespace efccl::runtime

struct ncclComm {
  uint64_t magic = efccl::runtime::kCommMagic;
  int32_t rank = 0;
  int device = 0;
  std::shared_ptr<efccl::runtime::Clique> clique;
  std::mutex ops_mu;  ///< guards premul_ops
  std::vector<efccl::runtime::PreMulSumOp> premul_ops;  ///< op value ncclNumOps + index
};

namespace efccl::runtime {

/// Registers a new communicator as live.
void register_comm(ncclComm* comm);
/// Removes it from the live set (later checks fail); returns false when it was not live.
bool unregister_comm(ncclComm* comm);
/// ok when `comm` is a live communicator.
ApiStatus check_comm(const ncclComm* comm);

}  // namespace efccl::runtime
