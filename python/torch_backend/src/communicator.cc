#include "communicator.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "efccl_library.h"
#include "environment_override.h"

namespace efccl::torch_backend {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string arrival_key(const std::string& prefix, int rank) {
  return prefix + "/arrived/" + std::to_string(rank);
}

[[noreturn]] void throw_efccl(const std::string& context, const char* function, ncclResult_t r) {
  C10_THROW_ERROR(DistBackendError, "efccl: " + context + ": " + describe_failure(function, r));
}

}  // namespace

void await_all_ranks(c10d::Store& store, const std::string& prefix, const GroupIdentity& group,
                     std::chrono::milliseconds timeout, const std::string& what) {
  store.set(arrival_key(prefix, group.rank), std::string("1"));
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(group.size));
  for (int r = 0; r < group.size; ++r) keys.push_back(arrival_key(prefix, r));
  try {
    store.wait(keys, timeout);
    return;
  } catch (const std::exception& e) {
    std::string missing;
    int nmissing = 0;
    for (int r = 0; r < group.size; ++r) {
      bool arrived = false;
      try {
        arrived = store.check({keys[static_cast<size_t>(r)]});
      } catch (const std::exception&) {  // the store itself is gone: say so below
      }
      if (!arrived) {
        missing += (nmissing++ ? ", " : "") + group.describe_rank(r);
      }
    }
    if (nmissing == 0)
      C10_THROW_ERROR(DistBackendError, "efccl: " + what + " on " + group.describe() +
                                            ": waiting for the other ranks failed: " + e.what());
    C10_THROW_ERROR(DistBackendError,
                    "efccl: " + what + " on " + group.describe() + ": " + missing +
                        " did not arrive within " + std::to_string(timeout.count()) +
                        " ms (the group's timeout: init_process_group/new_group timeout=)");
  }
}

std::vector<std::pair<std::string, std::string>> creation_environment(
    const CommunicatorSettings& settings, std::chrono::milliseconds init_budget) {
  std::vector<std::pair<std::string, std::string>> env;
  std::string files = EnvironmentOverride::original("EFCCL_ALGO_FILES");
  for (const std::string& f : settings.algorithm_files) files += (files.empty() ? "" : ",") + f;
  env.emplace_back("EFCCL_ALGO_FILES", files);
  // The process's own settings win; otherwise efccl's deadlines are the group's.
  const std::string timeout = EnvironmentOverride::original("EFCCL_TIMEOUT_MS");
  env.emplace_back(
      "EFCCL_TIMEOUT_MS",
      timeout.empty() ? std::to_string(std::max<int64_t>(settings.timeout.count(), 1)) : timeout);
  const std::string init = EnvironmentOverride::original("EFCCL_INIT_TIMEOUT_MS");
  env.emplace_back(
      "EFCCL_INIT_TIMEOUT_MS",
      init.empty() ? std::to_string(std::max<int64_t>(init_budget.count(), 1000)) : init);
  return env;
}

std::shared_ptr<Communicator> Communicator::create(c10d::Store& store, const std::string& prefix,
                                                   const GroupIdentity& group,
                                                   const at::Device& device,
                                                   const CommunicatorSettings& settings) {
  const EfcclLibrary& lib = efccl_library();
  const Clock::time_point deadline = Clock::now() + settings.timeout;
  const std::string what = "creating the communicator on " + device.str();
  await_all_ranks(store, prefix, group, settings.timeout, what);

  c10::cuda::CUDAGuard guard(device);
  // efccl's budget for its own rendezvous once every rank has arrived (quick then; at least
  // 10 s so that a late arrival near the group's deadline does not starve it).
  auto init_budget = [&] {
    return std::max<std::chrono::milliseconds>(remaining(deadline), std::chrono::seconds(10));
  };
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string id_key = prefix + "/unique_id";
  if (group.rank == 0) {
    ncclResult_t r;
    {
      EnvironmentOverride env(creation_environment(settings, init_budget()));
      r = lib.GetUniqueId(&id);
    }
    if (r != ncclSuccess) throw_efccl(what + " on " + group.describe(), "ncclGetUniqueId", r);
    store.set(id_key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id),
                                           reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    try {
      store.wait({id_key}, remaining(deadline));
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, "efccl: " + what + " on " + group.describe() + ": " +
                                            group.describe_rank(0) +
                                            " published no unique id in time: " + e.what());
    }
    const std::vector<uint8_t> bytes = store.get(id_key);
    TORCH_CHECK(bytes.size() == sizeof(id), "efccl: ", what, " on ", group.describe(),
                ": the unique id in the store has ", bytes.size(), " bytes, expected ", sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclComm_t comm = nullptr;
  {
    EnvironmentOverride env(creation_environment(settings, init_budget()));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;  // every rank has arrived: efccl's rendezvous is quick
    const ncclResult_t r = lib.CommInitRankConfig(&comm, group.size, id, group.rank, &config);
    if (r != ncclSuccess) {
      const std::string text = describe_failure("ncclCommInitRankConfig", r);
      if (comm != nullptr) (void)lib.CommAbort(comm);
      C10_THROW_ERROR(DistBackendError, "efccl: " + what + " on " + group.describe() + ": " + text);
    }
  }
  c10::cuda::CUDAStream stream =
      c10::cuda::getStreamFromPool(settings.high_priority_stream, device.index());
  return std::make_shared<Communicator>(comm, device, stream, "init");
}

Communicator::Communicator(ncclComm_t comm, const at::Device& device, c10::cuda::CUDAStream stream,
                           std::string origin)
    : comm_(comm), device_(device), stream_(stream), origin_(std::move(origin)) {}

Communicator::~Communicator() {
  try {
    destroy(true);
  } catch (...) {  // nothing can be done about a failing abort in a destructor
  }
}

std::shared_ptr<Communicator> Communicator::split(c10d::Store& store, const std::string& prefix,
                                                  const GroupIdentity& group, int color, int key,
                                                  const CommunicatorSettings& settings) {
  const EfcclLibrary& lib = efccl_library();
  const Clock::time_point deadline = Clock::now() + settings.timeout;
  const std::string what = "ncclCommSplit (color " + std::to_string(color) + ")";
  await_all_ranks(store, prefix, group, settings.timeout, what);

  ncclComm_t child = nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    TORCH_CHECK(!destroyed_.load() && !revoked_.load(), "efccl: ", what, " on ", group.describe(),
                ": the parent communicator was aborted");
    EnvironmentOverride env(creation_environment(
        settings,
        std::max<std::chrono::milliseconds>(remaining(deadline), std::chrono::seconds(10))));
    c10::cuda::CUDAGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    const ncclResult_t r = lib.CommSplit(comm_, color, key, &child, &config);
    if (r != ncclSuccess) {
      const std::string text = describe_failure("ncclCommSplit", r);
      if (child != nullptr) (void)lib.CommAbort(child);
      C10_THROW_ERROR(DistBackendError, "efccl: " + what + " on " + group.describe() + ": " + text);
    }
  }
  if (child == nullptr) return nullptr;  // NCCL_SPLIT_NOCOLOR
  c10::cuda::CUDAStream stream =
      c10::cuda::getStreamFromPool(settings.high_priority_stream, device_.index());
  return std::make_shared<Communicator>(child, device_, stream, "split of " + group.name);
}

std::string Communicator::async_error() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (destroyed_.load() || revoked_.load()) return "";
  const EfcclLibrary& lib = efccl_library();
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = lib.CommGetAsyncError(comm_, &async);
  if (r != ncclSuccess) return describe_failure("ncclCommGetAsyncError", r);
  if (async == ncclSuccess || async == ncclInProgress) return "";
  std::string text = lib.GetErrorString(async);
  const char* last = lib.GetLastError(comm_);
  if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

void Communicator::revoke() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (destroyed_.load() || revoked_.exchange(true)) return;
  (void)efccl_library().CommRevoke(comm_, NCCL_REVOKE_DEFAULT);
}

void Communicator::destroy(bool abort) {
  std::lock_guard<std::mutex> calls(call_mutex_);
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (destroyed_.exchange(true)) return;
  const EfcclLibrary& lib = efccl_library();
  c10::cuda::CUDAGuard guard(device_);
  // Either frees the communicator, also when it reports an error: never call both.
  if (abort || revoked_.load())
    (void)lib.CommAbort(comm_);
  else
    (void)lib.CommDestroy(comm_);
}

}  // namespace efccl::torch_backend
