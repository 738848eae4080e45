#include "comm/buffer_registrations.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "base/pointer_text.h"
#include "comm/communicator.h"
#include "comm/shared_registrations.h"
#include "efccl/common/log.h"

/// The handle of a no-op registration: ncclCommRegister's `void*` and ncclCommWindowRegister's
/// ncclWindow_t (opaque in nccl.h). Owned by the communicator's `buffer_registrations`.
struct ncclWindow_vidmem {
  bool window = false;  ///< from ncclCommWindowRegister
  void* buff = nullptr;
  size_t size = 0;
  uint64_t shared_id = 0;  ///< its sharing with the processes on the GPU (0: not shared)
};

namespace efccl::runtime {
namespace {

void log_registration_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    EFCCL_INFO(kLogAlloc | kLogInit, -1,
               "ncclCommRegister / ncclCommWindowRegister: efccl copies transfers through its "
               "own connection memory, so a registration only records the buffer, except on a "
               "communicator whose GPU ranks of other processes share: there the buffer is also "
               "mapped into those processes (comm/shared_registrations.h)");
  });
}

}  // namespace

ApiStatus add_buffer_registration(ncclComm_t comm, void* buff, std::size_t size, bool window,
                                  void** out) {
  log_registration_once();
  auto* h = new ncclWindow_vidmem();
  h->window = window;
  h->buff = buff;
  h->size = size;
  if (comm->shared_registrations != nullptr)
    h->shared_id = comm->shared_registrations->share(buff, size);
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  comm->buffer_registrations.push_back(h);
  *out = h;
  return ApiStatus::ok();
}

ApiStatus remove_buffer_registration(ncclComm_t comm, void* handle, bool window) {
  const char* what = window ? "window" : "handle";
  if (handle == nullptr) return ApiStatus::invalid_argument(std::string(what) + " is NULL");
  ncclWindow_vidmem* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(comm->ops_mu);
    auto& list = comm->buffer_registrations;
    auto it = std::find(list.begin(), list.end(), handle);
    if (it == list.end() || static_cast<ncclWindow_vidmem*>(*it)->window != window)
      return ApiStatus::invalid_argument(std::string(what) + " " + pointer_text(handle) +
                                         " was not returned by " +
                                         (window ? "ncclCommWindowRegister" : "ncclCommRegister") +
                                         " on this communicator, or was deregistered already");
    h = static_cast<ncclWindow_vidmem*>(*it);
    list.erase(it);
  }
  // Outside the lock: the other processes unmap the buffer before this returns (bounded).
  Status unshared = Status::ok();
  if (h->shared_id != 0 && comm->shared_registrations != nullptr)
    unshared = comm->shared_registrations->unshare(h->shared_id);
  delete h;
  if (!unshared) return ApiStatus::system(unshared.message());
  return ApiStatus::ok();
}

void release_buffer_registrations(ncclComm_t comm, bool abort) {
  // The other processes unmap what is still shared (without waiting for them on abort).
  if (comm->shared_registrations != nullptr) comm->shared_registrations->stop(abort);
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  for (void* h : comm->buffer_registrations) delete static_cast<ncclWindow_vidmem*>(h);
  comm->buffer_registrations.clear();
}

}  // namespace efccl::runtime
