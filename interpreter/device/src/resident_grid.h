// The resident grids' host side, as the executor's launch paths see it (launch.cc, batch.cc):
// post a fused launch's calls instead of launching them, and how many SMs to leave to the grid
// when checking that a launched grid fits. The public controls are in efccl/device/resident.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "efccl/common/status.h"
#include "efccl/device/resident.h"
#include "kernel_params.h"

namespace efccl::device {

/// Posts `ncalls` calls placed on `nctas` CTAs (FusedCall::cta_begin + nthreadblocks <= nctas),
/// with `nranks` RankCallArgs, run by the (dtype, reduction) instantiation, to `device`'s
/// resident grid on `stream`: the stream's later work waits until the grid has run them. The
/// caller has ordered the stream after whatever the calls need (as for a launch) and must not
/// be capturing it. False (nothing enqueued) when resident execution is off or unavailable on
/// the device, nctas exceeds resident_capacity(device), or every slot is in flight: the caller
/// launches instead.
StatusOr<bool> post_resident(int device, cudaStream_t stream, const FusedCall* calls,
                             uint32_t ncalls, const RankCallArgs* ranks, uint32_t nranks,
                             uint32_t nctas, int dtype, int reduction);

/// SMs of `device` (which has `sm_count`) that co-residency checks of launched grids must leave
/// to its resident grid: one per resident CTA when resident execution is on (a CTA may sit
/// on an SM of its own), else 0. At most sm_count - 1.
int resident_reserved_sms(int device, int sm_count);

}  // namespace efccl::device
