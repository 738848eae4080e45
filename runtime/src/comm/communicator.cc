#include "comm/communicator.h"

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

ApiStatus check_comm_handle(const ncclComm* comm, CommInit* init, ApiStatus* init_failure) {
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
  *init = comm->init;
  if (init_failure != nullptr && comm->init == CommInit::kFailed)
    *init_failure = comm->init_failure;
  return ApiStatus::ok();
}

ApiStatus check_comm(const ncclComm* comm) {
  CommInit init = CommInit::kReady;
  ApiStatus failure;
  if (ApiStatus s = check_comm_handle(comm, &init, &failure); !s) return s;
  switch (init) {
    case CommInit::kReady:
      return ApiStatus::ok();
    case CommInit::kPending:
      return ApiStatus::invalid_usage(
          "the communicator is not initialized yet: its clique forms once every rank of its "
          "unique id has called ncclCommInitRank* (inside a group: at the outermost "
          "ncclGroupEnd)");
    case CommInit::kFailed:
      return ApiStatus::invalid_usage("the communicator's initialization failed (" +
                                      failure.message() + "); it can only be destroyed or aborted");
  }
  return ApiStatus::internal("bad communicator init state");
}

void attach_clique(ncclComm* comm, std::shared_ptr<Clique> clique) {
  std::lock_guard<std::mutex> lock(live_mutex());
  comm->clique = std::move(clique);
  comm->init = CommInit::kReady;
}

void fail_init(ncclComm* comm, const ApiStatus& why) {
  std::lock_guard<std::mutex> lock(live_mutex());
  comm->init = CommInit::kFailed;
  comm->init_failure = why;
}

}  // namespace efccl::runtime
