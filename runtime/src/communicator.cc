#include "communicator.h"

#include <sstream>
#include <unordered_set>

namespace efccl::runtime {
namespace {

std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const ncclComm*>& live_comms() {
  static auto* s = new std::unordered_set<const ncclComm*>();  // outlives static destructors
  return *s;
}

}  // namespace

void register_comm(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_comms().insert(comm);
}

bool unregister_comm(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(live_mutex());
  return live_comms().erase(comm) > 0;
}

ApiStatus check_comm(const ncclComm* comm) {
  if (comm == nullptr) return ApiStatus::invalid_argument("comm is NULL");
  std::lock_guard<std::mutex> lock(live_mutex());
  if (live_comms().count(comm) == 0) {
    std::ostringstream m;
    m << "comm " << static_cast<const void*>(comm)
      << " is not a live communicator (destroyed, aborted, or never created)";
    return ApiStatus::invalid_argument(m.str());
  }
  if (comm->magic != kCommMagic)
    return ApiStatus::invalid_argument("comm is corrupted (bad magic)");
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
