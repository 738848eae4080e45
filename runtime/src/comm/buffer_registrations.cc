#include "comm/buffer_registrations.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "base/pointer_text.h"
#include "comm/communicator.h"
#include "efccl/common/log.h"

/// The handle of a no-op registration: ncclCommRegister's `void*` and ncclCommWindowRegister's
/// ncclWindow_t (opaque in nccl.h). Owned by the communicator's `buffer_registrations`.
struct ncclWindow_vidmem {
  bool window = false;  ///< from ncclCommWindowRegister
  void* buff = nullptr;
  size_t size = 0;
};

namespace efccl::runtime {
namespace {

void log_registration_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    EFCCL_INFO(kLogAlloc | kLogInit, -1,
               "ncclCommRegister / ncclCommWindowRegister are accepted as no-ops: efccl copies "
               "every transfer through its own FIFOs, so user buffers need no registration");
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
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  comm->buffer_registrations.push_back(h);
  *out = h;
  return ApiStatus::ok();
}

ApiStatus remove_buffer_registration(ncclComm_t comm, void* handle, bool window) {
  const char* what = window ? "window" : "handle";
  if (handle == nullptr) return ApiStatus::invalid_argument(std::string(what) + " is NULL");
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  auto& list = comm->buffer_registrations;
  auto it = std::find(list.begin(), list.end(), handle);
  if (it == list.end() || static_cast<ncclWindow_vidmem*>(*it)->window != window)
    return ApiStatus::invalid_argument(std::string(what) + " " + pointer_text(handle) +
                                       " was not returned by " +
                                       (window ? "ncclCommWindowRegister" : "ncclCommRegister") +
                                       " on this communicator, or was deregistered already");
  delete static_cast<ncclWindow_vidmem*>(*it);
  list.erase(it);
  return ApiStatus::ok();
}

void release_buffer_registrations(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  for (void* h : comm->buffer_registrations) delete static_cast<ncclWindow_vidmem*>(h);
  comm->buffer_registrations.clear();
}

}  // namespace efccl::runtime
