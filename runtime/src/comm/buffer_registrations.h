// ncclCommRegister / ncclCommWindowRegister: accepted as no-ops (efccl copies every transfer
// through its own connection memory, so user buffers need no registration), but the handles are
// real and checked, so that a wrong or repeated deregistration is reported as NCCL reports it.
#pragma once

#include <nccl.h>

#include <cstddef>

#include "base/api_status.h"

namespace efccl::runtime {

/// Records a registration of `buff` on `comm` (`window`: from ncclCommWindowRegister) and
/// returns its handle in `*out`.
ApiStatus add_buffer_registration(ncclComm_t comm, void* buff, std::size_t size, bool window,
                                  void** out);
/// Ends a registration made on `comm` by the same kind of call.
ApiStatus remove_buffer_registration(ncclComm_t comm, void* handle, bool window);
/// Frees the registrations of a communicator being destroyed.
void release_buffer_registrations(ncclComm_t comm);

}  // namespace efccl::runtime
