// Host entry points of NCCL's device API (nccl_device/*.h, NCCL 2.28), exported with their
// pncclX aliases like the rest of the ABI (api/entry_point.h).
//
// efccl has no device communicators: every byte is moved by its EF interpreter kernel, and a
// user kernel cannot reach peers through an ncclDevComm, LSA windows or GIN. So:
//  - ncclDevCommCreate / ncclDevCommDestroy and ncclGinBarrierCreateRequirement (efccl has no
//    GPU-initiated networking) return ncclInvalidUsage, the reason in ncclGetLastError;
//  - the pure helpers compute what NCCL 2.28 computes: ncclLLA2ACalcSlots and the LSA-barrier
//    and LL all-to-all requirement builders (filled exactly as NCCL fills them), and the team
//    helpers with NCCL's formulas (nccl_device/impl/core__funcs.h) applied to an efccl
//    communicator, whose load/store-accessible (LSA) team is the rank alone: world {nranks,
//    rank, 1}, LSA {1, 0, 1}, rail (the outer factor of LSA) = world;
//  - on an invalid communicator a team helper reports the error like any entry point and
//    returns the empty team {0, 0, 1}, or rank -1.
#include <nccl.h>
#include <nccl_device/core.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "api/entry_point.h"
#include "base/api_status.h"
#include "comm/communicator.h"

// Complete the handle types nccl_device/core.h declares, with the layout of NCCL's
// nccl_device/impl/*__types.h. (Those headers are not included: they also define
// ncclWindow_vidmem, which efccl defines its own way in comm/buffer_registrations.cc.)
struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};
struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t bufHandle;
};
struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
};

// As declared in nccl_device/{lsa_barrier,gin_barrier,ll_a2a}.h.
extern "C" {
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t, int nBarriers,
                                             ncclLsaBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int nBarriers,
                                             ncclGinBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                        ncclDevResourceRequirements_t* outReq);
}

/// pnccl<name> for the team functions, which are overloaded for device code in the headers, so
/// their aliases spell the signature out.
#define EFCCL_ALIAS_SIGNATURE(result, name, ...) \
  extern "C" EFCCL_API result p##name(__VA_ARGS__) __attribute__((alias(#name)));

using efccl::runtime::ApiStatus;
using efccl::runtime::run_entry_point;

namespace {

constexpr ncclTeam_t kEmptyTeam{0, 0, 1};

ApiStatus no_device_communicators(const char* function) {
  return ApiStatus::invalid_usage(
      std::string(function) +
      " is not supported by efccl: NCCL's device API (ncclDevComm, LSA windows, GIN) has no "
      "efccl counterpart; efccl moves data only through its own EF programs, so use the host "
      "collectives (ncclAllReduce, ncclSend/ncclRecv, ...)");
}

/// The rank and size of `comm`, or false after reporting why it is not usable under `function`
/// (also when reporting it ran out of memory: nothing throws out of these C functions).
bool comm_shape(const char* function, ncclComm_t comm, int* rank, int* nranks) noexcept {
  return run_entry_point(function, [&] {
           if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
           *rank = comm->rank;
           *nranks = comm->clique->nranks();
           return ApiStatus::ok();
         }) == ncclSuccess;
}

ApiStatus check_requirement_args(int count, const char* count_name, const void* out_handle,
                                 const void* out_req) {
  if (out_handle == nullptr) return ApiStatus::invalid_argument("outHandle is NULL");
  if (out_req == nullptr) return ApiStatus::invalid_argument("outReq is NULL");
  if (count < 0)
    return ApiStatus::invalid_argument(std::string(count_name) + " " + std::to_string(count) +
                                       " is negative");
  return ApiStatus::ok();
}

}  // namespace

// ---- Device communicators: none in efccl ----

EFCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                         ncclDevComm_t* outDevComm) {
  return run_entry_point("ncclDevCommCreate",
                         [] { return no_device_communicators("ncclDevCommCreate"); });
}
EFCCL_ALIAS(ncclDevCommCreate)

EFCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  return run_entry_point("ncclDevCommDestroy", [] {
    return ApiStatus::invalid_usage(
        "ncclDevCommDestroy: efccl never creates device communicators (ncclDevCommCreate is not "
        "supported), so there is none to destroy");
  });
}
EFCCL_ALIAS(ncclDevCommDestroy)

// ---- Teams ----

EFCCL_API ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (!comm_shape("ncclTeamWorld", comm, &rank, &nranks)) return kEmptyTeam;
  return ncclTeam_t{nranks, rank, 1};
}
EFCCL_ALIAS_SIGNATURE(ncclTeam_t, ncclTeamWorld, ncclComm_t)

EFCCL_API ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (!comm_shape("ncclTeamLsa", comm, &rank, &nranks)) return kEmptyTeam;
  return ncclTeam_t{1, 0, 1};  // no peer is load/store accessible through efccl
}
EFCCL_ALIAS_SIGNATURE(ncclTeam_t, ncclTeamLsa, ncclComm_t)

EFCCL_API ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (!comm_shape("ncclTeamRail", comm, &rank, &nranks)) return kEmptyTeam;
  return ncclTeam_t{nranks, rank, 1};  // the outer factor of an LSA team of 1: the world
}
EFCCL_ALIAS_SIGNATURE(ncclTeam_t, ncclTeamRail, ncclComm_t)

EFCCL_API int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  int my_rank = 0, nranks = 0;
  if (!comm_shape("ncclTeamRankToWorld", comm, &my_rank, &nranks)) return -1;
  return my_rank + (rank - team.rank) * team.stride;
}
EFCCL_ALIAS_SIGNATURE(int, ncclTeamRankToWorld, ncclComm_t, ncclTeam_t, int)

EFCCL_API int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  int my_rank = 0, nranks = 0;
  if (!comm_shape("ncclTeamRankToLsa", comm, &my_rank, &nranks)) return -1;
  const int lsa_rank = 0;  // this rank's place in its LSA team of 1
  return lsa_rank + (rank - team.rank) * team.stride;
}
EFCCL_ALIAS_SIGNATURE(int, ncclTeamRankToLsa, ncclComm_t, ncclTeam_t, int)

// ---- Resource requirements ----

EFCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                       ncclLsaBarrierHandle_t* outHandle,
                                                       ncclDevResourceRequirements_t* outReq) {
  return run_entry_point("ncclLsaBarrierCreateRequirement", [&] {
    if (ApiStatus s = check_requirement_args(nBarriers, "nBarriers", outHandle, outReq); !s)
      return s;
    // As NCCL: per barrier 3 words of state and one inbox word per team rank.
    std::memset(outReq, 0, sizeof(*outReq));
    outHandle->nBarriers = nBarriers;
    outReq->bufferSize = (3 * static_cast<size_t>(nBarriers) +
                          static_cast<size_t>(nBarriers) * static_cast<size_t>(team.nRanks)) *
                         sizeof(uint32_t);
    outReq->bufferAlign = alignof(uint32_t);
    outReq->outBufferHandle = &outHandle->bufHandle;
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclLsaBarrierCreateRequirement)

EFCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                       int nBarriers,
                                                       ncclGinBarrierHandle_t* outHandle,
                                                       ncclDevResourceRequirements_t* outReq) {
  return run_entry_point("ncclGinBarrierCreateRequirement", [] {
    return ApiStatus::invalid_usage(
        "ncclGinBarrierCreateRequirement: efccl communicators have no GPU-initiated networking "
        "(GIN), and no device communicator to use a GIN barrier in");
  });
}
EFCCL_ALIAS(ncclGinBarrierCreateRequirement)

EFCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  // As NCCL: one 8-byte slot per element per started 8 bytes of it (no checks, as NCCL).
  const int64_t words = (static_cast<int64_t>(maxEltSize) + 7) / 8;
  return static_cast<int>(static_cast<int64_t>(maxElts) * words);
}
EFCCL_ALIAS(ncclLLA2ACalcSlots)

EFCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                  ncclLLA2AHandle_t* outHandle,
                                                  ncclDevResourceRequirements_t* outReq) {
  return run_entry_point("ncclLLA2ACreateRequirement", [&] {
    if (ApiStatus s = check_requirement_args(nBlocks, "nBlocks", outHandle, outReq); !s) return s;
    if (nSlots < 0)
      return ApiStatus::invalid_argument("nSlots " + std::to_string(nSlots) + " is negative");
    // As NCCL: per block one 16-byte header and two 16-byte lines per slot.
    outHandle->nSlots = static_cast<uint32_t>(nSlots);
    std::memset(outReq, 0, sizeof(*outReq));
    outReq->bufferSize = static_cast<size_t>(nBlocks) * (1 + 2 * static_cast<size_t>(nSlots)) * 16;
    outReq->bufferAlign = 16;
    outReq->outBufferHandle = &outHandle->bufHandle;
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclLLA2ACreateRequirement)
