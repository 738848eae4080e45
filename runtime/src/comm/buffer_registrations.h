// ncclCommRegister / ncclCommWindowRegister: efccl copies transfers through its own connection
// memory, so a registration records the buffer (the handles are real and checked, so that a
// wrong or repeated deregistration is reported as NCCL reports it), and, on a communicator whose
// GPU ranks of other processes share, maps it into those processes until it is deregistered
// (comm/shared_registrations.h).
#pragma once

#include <nccl.h>

#include <cstddef>

#include "base/api_status.h"

namespace efccl::runtime {

/// Records a registration of `buff` on `comm` (`window`: from ncclCommWindowRegister) and
/// returns its handle in `*out`.
ApiStatus add_buffer_registration(ncclComm_t comm, void* buff, std::size_t size, bool window,
                                  void** out);
/// Ends a registration made on `comm` by the same kind of call; a shared one returns once the
/// other processes unmapped it (ncclSystemError naming one that did not confirm in time).
ApiStatus remove_buffer_registration(ncclComm_t comm, void* handle, bool window);
/// Frees the registrations of a communicator being destroyed (abort: without waiting for the
/// other processes to confirm that they unmapped them) and stops its sharing service.
void release_buffer_registrations(ncclComm_t comm, bool abort);

}  // namespace efccl::runtime
