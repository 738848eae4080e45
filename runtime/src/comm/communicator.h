// The communicator behind ncclComm_t: one rank of a clique. Handles are checked against a
// process-wide set of live communicators before they are touched, so a destroyed or foreign
// pointer gives ncclInvalidArgument instead of a crash; the magic field catches corruption.
//
// A communicator from ncclCommInitRank* exists (and is live) before its clique does: it is
// pending until every rank of its unique id has joined (init_rank.h), then ready, or failed
// for good. Its init state and clique are written under the live-set lock, so a successful
// check_comm() makes the clique visible to the checking thread; it never changes afterwards.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "base/api_status.h"
#include "comm/rendezvous.h"
#include "enqueue/clique.h"
#include "fallback/real_config.h"

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

enum class CommInit : uint8_t {
  kPending,  ///< ncclCommInitRank*: waiting for the other ranks of its unique id
  kReady,    ///< clique attached; usable
  kFailed,   ///< its clique will never form (timeout, abort, CUDA failure); destroy it
};

class Rendezvous;
class SharedRegistrations;

}  // namespace efccl::runtime

namespace efccl::net {
class Bootstrap;
}  // namespace efccl::net

struct ncclComm {
  uint64_t magic = efccl::runtime::kCommMagic;
  int32_t rank = 0;
  int device = 0;
  std::shared_ptr<efccl::runtime::Clique> clique;                    ///< set once, when ready
  efccl::runtime::CommInit init = efccl::runtime::CommInit::kReady;  ///< under the live-set lock
  efccl::runtime::ApiStatus init_failure;                            ///< kFailed: why
  /// ncclCommInitRank*: the rendezvous of its unique id (immutable; null for ncclCommInitAll).
  std::shared_ptr<efccl::runtime::Rendezvous> rendezvous;
  bool blocking = true;  ///< ncclConfig_t::blocking (efccl completes every init synchronously)
  /// ncclCommInitRank*'s config, for the real communicator of EFCCL_FALLBACK=nccl.
  efccl::runtime::RealConfig real_config;
  std::mutex ops_mu;                                    ///< guards premul_ops
  std::vector<efccl::runtime::PreMulSumOp> premul_ops;  ///< op value ncclNumOps + index
  /// Handles of ncclCommRegister / ncclCommWindowRegister (no-op buffer registrations), under
  /// ops_mu.
  std::vector<void*> buffer_registrations;
  /// Multi-process communicators: this rank's bootstrap (ncclCommSplit/Shrink meet through it);
  /// set before the communicator becomes ready, then immutable.
  std::shared_ptr<efccl::net::Bootstrap> bootstrap;
  /// Multi-process communicators whose GPU other processes' ranks share: this rank's registered
  /// buffers mapped into their processes, and its service mapping theirs
  /// (comm/shared_registrations.h); set before the communicator becomes ready, then immutable.
  std::shared_ptr<efccl::runtime::SharedRegistrations> shared_registrations;
  /// ncclCommSplit/Shrink calls so far per set of participating ranks (under ops_mu): each
  /// participant counts the same calls, so the count names the call in their tags.
  std::map<std::vector<int>, uint64_t> regroups;
  std::atomic<bool> revoked{false};  ///< ncclCommRevoke: every later operation is refused
};

namespace efccl::runtime {

/// Registers a new communicator as live.
void register_comm(ncclComm* comm);
/// Removes it from the live set (later checks fail); returns false when it was not live.
bool unregister_comm(ncclComm* comm);
/// ok when `comm` is a live communicator whose clique has formed (pending or failed
/// initialisation: ncclInvalidUsage saying why).
ApiStatus check_comm(const ncclComm* comm);
/// ok when `comm` is a live communicator in any init state; `*init` (and `*init_failure` when
/// failed) receive its state.
ApiStatus check_comm_handle(const ncclComm* comm, CommInit* init,
                            ApiStatus* init_failure = nullptr);
/// Pending -> ready with `clique`.
void attach_clique(ncclComm* comm, std::shared_ptr<Clique> clique);
/// Pending -> failed with `why`.
void fail_init(ncclComm* comm, const ApiStatus& why);

}  // namespace efccl::runtime
