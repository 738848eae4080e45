// The NCCL ABI: communicators (creation, destruction, queries, split, shrink, revoke). Argument
// checks here; the work in comm/.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "api/entry_point.h"
#include "base/device_guard.h"
#include "base/settings.h"
#include "comm/comm_init.h"
#include "comm/communicator.h"
#include "comm/regroup.h"
#include "efccl/common/log.h"
#include "efccl/net/unique_id.h"
#include "enqueue/clique.h"

using efccl::runtime::ApiStatus;
using efccl::runtime::CommInit;
using efccl::runtime::run_entry_point;
using efccl::runtime::run_grouped_entry_point;

namespace {

/// ncclCommRevoke and ncclCommShrink(NCCL_SHRINK_ABORT): the communicator's kernels (and its
/// real NCCL's, with EFCCL_FALLBACK=nccl) give up, and this waits until they have ended. Only
/// this clique's kernels are waited for, not other work on the device.
ApiStatus stop_kernels(ncclComm_t comm, const char* fn) {
  efccl::runtime::Clique& clique = *comm->clique;
  ApiStatus real;
  if (efccl::runtime::CollectiveFallback* f = clique.fallback(); f != nullptr)
    real = f->revoke(comm->rank, clique.timeout());
  clique.abort(comm->rank);
  if (ApiStatus s = clique.wait_for_kernels(); !s)
    EFCCL_WARN(comm->device, std::string(fn) + ": " + s.message());
  return real;
}

}  // namespace

EFCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return run_entry_point("ncclGetUniqueId", [&] {
    // A random magic and the address of a root listener started here (or NCCL_COMM_ID's),
    // which the ranks of the communicator meet at; an unused root ends after the init timeout.
    if (uniqueId == nullptr) return ApiStatus::invalid_argument("uniqueId is NULL");
    efccl::runtime::log_version_once();
    static_assert(sizeof(efccl::net::UniqueId) == sizeof(ncclUniqueId));
    efccl::net::UniqueId id;
    const efccl::Status s = efccl::net::create_unique_id(&id, efccl::runtime::init_timeout());
    if (s) std::memcpy(uniqueId->internal, id.internal, sizeof(id.internal));
    return ApiStatus::from(s, ncclSystemError);
  });
}
EFCCL_ALIAS(ncclGetUniqueId)

EFCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return run_entry_point("ncclCommInitAll",
                         [&] { return efccl::runtime::init_all(comms, ndev, devlist); });
}
EFCCL_ALIAS(ncclCommInitAll)

EFCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                        int rank) {
  return run_grouped_entry_point("ncclCommInitRank", [&] {
    return efccl::runtime::init_rank(comm, nranks, commId, rank, nullptr);
  });
}
EFCCL_ALIAS(ncclCommInitRank)

EFCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  return run_grouped_entry_point("ncclCommInitRankConfig", [&] {
    return efccl::runtime::init_rank(comm, nranks, commId, rank, config);
  });
}
EFCCL_ALIAS(ncclCommInitRankConfig)

EFCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  return run_grouped_entry_point("ncclCommInitRankScalable", [&] {
    // The ids only spread NCCL's bootstrap over several roots; efccl's one root is the first's.
    if (newcomm != nullptr) *newcomm = nullptr;
    if (commIds == nullptr) return ApiStatus::invalid_argument("commIds is NULL");
    if (nId < 1 || nId > std::max(nranks, 1))
      return ApiStatus::invalid_argument("nId " + std::to_string(nId) + " must be in 1..nranks (" +
                                         std::to_string(nranks) + ")");
    return efccl::runtime::init_rank(newcomm, nranks, commIds[0], myrank, config);
  });
}
EFCCL_ALIAS(ncclCommInitRankScalable)

EFCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return run_entry_point("ncclCommDestroy",
                         [&] { return efccl::runtime::release_comm(comm, false); });
}
EFCCL_ALIAS(ncclCommDestroy)

EFCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return run_entry_point("ncclCommAbort", [&] { return efccl::runtime::release_comm(comm, true); });
}
EFCCL_ALIAS(ncclCommAbort)

EFCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return run_entry_point("ncclCommFinalize", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    ApiStatus s = comm->clique->finalize(comm->rank);
    if (efccl::runtime::CollectiveFallback* f = comm->clique->fallback(); s && f != nullptr)
      s = f->finalize(comm->rank, comm->clique->timeout());
    return s;
  });
}
EFCCL_ALIAS(ncclCommFinalize)

EFCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const char* fn = "ncclCommGetAsyncError";
  return run_entry_point(fn, [&] {
    CommInit init = CommInit::kReady;
    ApiStatus init_failure;
    if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init, &init_failure); !s) return s;
    if (asyncError == nullptr) return ApiStatus::invalid_argument("asyncError is NULL");
    switch (init) {
      case CommInit::kPending:
        *asyncError = ncclInProgress;  // a grouped or non-blocking init
        break;
      case CommInit::kFailed:
        *asyncError = init_failure.code();
        break;
      case CommInit::kReady:
        // Revoked: quiescent once ncclCommRevoke returned (it waits for the aborted kernels).
        if (comm->revoked.load()) {
          *asyncError = ncclSuccess;
        } else {
          ApiStatus async = comm->clique->async_error(comm->rank);
          if (efccl::runtime::CollectiveFallback* f = comm->clique->fallback();
              async && f != nullptr)
            async = f->async_error(comm->rank);
          // Polled: remembered for ncclGetLastError, not logged again (the kernel's failure was).
          efccl::runtime::remember(fn, async);
          *asyncError = async.code();
        }
        break;
    }
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclCommGetAsyncError)

EFCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return run_entry_point("ncclCommCount", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    if (count == nullptr) return ApiStatus::invalid_argument("count is NULL");
    *count = comm->clique->nranks();
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclCommCount)

EFCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return run_entry_point("ncclCommCuDevice", [&] {
    CommInit init;  // any state: the device is known from the start
    if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init); !s) return s;
    if (device == nullptr) return ApiStatus::invalid_argument("device is NULL");
    *device = comm->device;
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclCommCuDevice)

EFCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return run_entry_point("ncclCommUserRank", [&] {
    CommInit init;  // any state: the rank is known from the start
    if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init); !s) return s;
    if (rank == nullptr) return ApiStatus::invalid_argument("rank is NULL");
    *rank = comm->rank;
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclCommUserRank)

EFCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  return run_grouped_entry_point(fn, [&] {
    if (newcomm == nullptr) return ApiStatus::invalid_argument("newcomm is NULL");
    *newcomm = nullptr;
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return ApiStatus::invalid_argument("color " + std::to_string(color) +
                                         " must be >= 0 or NCCL_SPLIT_NOCOLOR");
    std::vector<int> all(static_cast<std::size_t>(comm->clique->nranks()));
    for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
    return efccl::runtime::regroup(fn, comm, all, color, key, newcomm, config);
  });
}
EFCCL_ALIAS(ncclCommSplit)

EFCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  const char* fn = "ncclCommShrink";
  return run_grouped_entry_point(fn, [&] {
    if (newcomm == nullptr) return ApiStatus::invalid_argument("newcomm is NULL");
    *newcomm = nullptr;
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return ApiStatus::invalid_argument("shrinkFlags " + std::to_string(shrinkFlags) +
                                         " is not NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT");
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
      return ApiStatus::invalid_argument("excludeRanksList is NULL or excludeRanksCount < 0");
    const int n = comm->clique->nranks();
    std::vector<bool> excluded(static_cast<std::size_t>(n), false);
    for (int i = 0; i < excludeRanksCount; ++i) {
      const int r = excludeRanksList[i];
      if (r < 0 || r >= n)
        return ApiStatus::invalid_argument("excludeRanksList[" + std::to_string(i) +
                                           "] = " + std::to_string(r) +
                                           " is not a rank of the communicator");
      excluded[static_cast<std::size_t>(r)] = true;
    }
    if (excluded[static_cast<std::size_t>(comm->rank)])
      return ApiStatus::invalid_argument("rank " + std::to_string(comm->rank) +
                                         " excludes itself; excluded ranks do not call "
                                         "ncclCommShrink");
    if (shrinkFlags == NCCL_SHRINK_ABORT)
      if (ApiStatus s = stop_kernels(comm, fn); !s)
        EFCCL_WARN(comm->device, std::string(fn) + ": " + s.message());
    std::vector<int> remaining;
    for (int r = 0; r < n; ++r)
      if (!excluded[static_cast<std::size_t>(r)]) remaining.push_back(r);
    return efccl::runtime::regroup(fn, comm, remaining, 0, comm->rank, newcomm, config);
  });
}
EFCCL_ALIAS(ncclCommShrink)

EFCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  const char* fn = "ncclCommRevoke";
  return run_entry_point(fn, [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return ApiStatus::invalid_argument("revokeFlags must be NCCL_REVOKE_DEFAULT (0), got " +
                                         std::to_string(revokeFlags));
    // In-flight kernels give up; efccl waits for them here, so the communicator is quiescent
    // (ncclCommGetAsyncError: ncclSuccess) when this returns. Later operations are refused;
    // destroy, split and shrink remain allowed.
    comm->revoked.store(true);
    return stop_kernels(comm, fn);
  });
}
EFCCL_ALIAS(ncclCommRevoke)
