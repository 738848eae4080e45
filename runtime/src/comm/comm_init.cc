#include "comm/comm_init.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/device_guard.h"
#include "base/pointer_text.h"
#include "base/settings.h"
#include "comm/buffer_registrations.h"
#include "comm/comm_config.h"
#include "comm/communicator.h"
#include "comm/grouped_init.h"
#include "comm/machine_graph.h"
#include "comm/rendezvous.h"
#include "efccl/common/log.h"
#include "efccl/net/deadline.h"
#include "enqueue/clique.h"
#include "enqueue/group.h"
#include "fallback/nccl_fallback.h"
#include "select/program_registry.h"

namespace efccl::runtime {
void log_version_once() {
  static std::once_flag version_once;
  std::call_once(version_once, [] {
    EFCCL_LOG(LogLevel::kVersion, kLogInit, -1,
              "efccl (NCCL API " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                  "." + std::to_string(NCCL_PATCH) + "), every transfer an EF program");
  });
}

ApiStatus init_all(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return ApiStatus::invalid_argument("comms is NULL");
  if (ndev < 1)
    return ApiStatus::invalid_argument("ndev " + std::to_string(ndev) + " must be >= 1");
  if (ndev > kMaxCommRanks)
    return ApiStatus::invalid_argument("ndev " + std::to_string(ndev) + " exceeds efccl's " +
                                       std::to_string(kMaxCommRanks) + " ranks per communicator");
  DeviceGuard guard;
  int visible = 0;
  if (cudaError_t e = cudaGetDeviceCount(&visible); e != cudaSuccess) {
    (void)cudaGetLastError();
    return ApiStatus::cuda(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e));
  }
  std::vector<int> devices(static_cast<std::size_t>(ndev));
  for (int r = 0; r < ndev; ++r) {
    devices[static_cast<std::size_t>(r)] = devlist != nullptr ? devlist[r] : r;
    const int d = devices[static_cast<std::size_t>(r)];
    if (d < 0 || d >= visible)
      return ApiStatus::invalid_argument("devlist[" + std::to_string(r) +
                                         "] = " + std::to_string(d) + " is not a CUDA device (" +
                                         std::to_string(visible) + " visible)");
  }
  log_version_once();
  std::shared_ptr<const topo::ClusterGraph> graph;
  if (ApiStatus s = local_machine_graph(devices, &graph); !s) return s;
  auto clique = Clique::create(devices, ProgramRegistry::from_environment());
  if (!clique) return ApiStatus::cuda(clique.status().message());
  (*clique)->set_machine_graph(graph);
  std::vector<int> ranks(static_cast<std::size_t>(ndev));
  for (int r = 0; r < ndev; ++r) ranks[static_cast<std::size_t>(r)] = r;
  log_machine_graph(*graph, ranks, devices);
  std::shared_ptr<NcclFallback> fallback;
  if (ApiStatus s = create_fallback(single_process_fallback_plan(devices), &fallback); !s) return s;
  (*clique)->set_fallback(std::move(fallback));
  for (int r = 0; r < ndev; ++r) {
    (*clique)->set_driver(r, this_thread_token());  // this thread drives every rank
    auto* comm = new ncclComm();
    comm->rank = r;
    comm->device = devices[static_cast<std::size_t>(r)];
    comm->clique = *clique;
    register_comm(comm);
    comms[r] = comm;
    EFCCL_INFO(kLogInit, comm->device,
               "comm " + pointer_text(comm) + " rank " + std::to_string(r) + " nRanks " +
                   std::to_string(ndev) + " nNodes 1 cudaDev " + std::to_string(comm->device) +
                   " - Init COMPLETE");
  }
  return ApiStatus::ok();
}

ApiStatus init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank,
                    const ncclConfig_t* config, bool local_only,
                    std::shared_ptr<Rendezvous>* joined, uint64_t driver) {
  // The deadline covers the whole init, from this call on.
  const auto timeout = init_timeout();
  const net::Deadline deadline = net::Deadline::after(timeout);
  if (newcomm == nullptr) return ApiStatus::invalid_argument("comm is NULL");
  *newcomm = nullptr;
  if (nranks < 1)
    return ApiStatus::invalid_argument("nranks " + std::to_string(nranks) + " must be >= 1");
  if (nranks > kMaxCommRanks)
    return ApiStatus::invalid_argument("nranks " + std::to_string(nranks) + " exceeds efccl's " +
                                       std::to_string(kMaxCommRanks) + " ranks per communicator");
  if (rank < 0 || rank >= nranks)
    return ApiStatus::invalid_argument("rank " + std::to_string(rank) +
                                       " is out of range (nranks " + std::to_string(nranks) + ")");
  CommConfig cfg;
  if (ApiStatus s = parse_config(config, &cfg); !s) return s;
  log_version_once();
  int device = -1;
  std::string device_error;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
    device_error = std::string("cudaGetDevice: ") + cudaGetErrorString(e);
  }
  auto* comm = new ncclComm();
  comm->rank = rank;
  comm->device = device;
  comm->init = CommInit::kPending;
  comm->blocking = cfg.blocking;
  comm->real_config = cfg.real;
  std::shared_ptr<Rendezvous> rendezvous;
  if (ApiStatus s =
          join_rendezvous(id, nranks, rank, device, device_error, comm, &rendezvous, deadline,
                          local_only, driver != 0 ? driver : this_thread_token());
      !s) {
    delete comm;
    return s;
  }
  comm->rendezvous = rendezvous;
  register_comm(comm);
  *newcomm = comm;
  const bool grouped = joined != nullptr || in_group();
  EFCCL_INFO(kLogInit, device,
             "comm " + pointer_text(comm) + " rank " + std::to_string(rank) + " nRanks " +
                 std::to_string(nranks) + " cudaDev " + std::to_string(device) +
                 (cfg.blocking ? "" : " (non-blocking)") +
                 (cfg.hints.empty() ? "" : " ignoring config hints:" + cfg.hints) +
                 (grouped ? " - joined; the clique forms at ncclGroupEnd"
                          : " - joined; waiting for the other ranks"));
  if (joined != nullptr) {
    *joined = std::move(rendezvous);
    return ApiStatus::ok();
  }
  if (grouped) {
    defer_init(std::move(rendezvous));
    return ApiStatus::ok();
  }
  // Only the rendezvous from here on: another thread may destroy the communicator meanwhile.
  if (!cfg.blocking) {
    // Non-blocking (ncclConfig_t::blocking = 0): a helper thread completes the rendezvous;
    // ncclCommGetAsyncError reports ncclInProgress until the clique formed (or the failure).
    try {
      std::thread([rendezvous, deadline, timeout] {
        try {
          (void)complete_rendezvous(rendezvous, deadline.when(), timeout);
        } catch (const std::exception& e) {
          cancel_rendezvous(rendezvous, ApiStatus::internal(
                                            std::string("completing the rendezvous: ") + e.what()));
        }
      }).detach();
    } catch (const std::system_error& e) {
      cancel_rendezvous(rendezvous, ApiStatus::system(std::string("starting the thread that "
                                                                  "completes a non-blocking "
                                                                  "init: ") +
                                                      e.what()));
      return ApiStatus::system(std::string("starting the thread that completes a non-blocking "
                                           "init: ") +
                               e.what());
    }
    return ApiStatus(ncclInProgress, "");
  }
  return complete_rendezvous(rendezvous, deadline.when(), timeout);
}

ApiStatus release_comm(ncclComm_t comm, bool abort) {
  if (comm == nullptr) return ApiStatus::ok();  // as NCCL
  CommInit init = CommInit::kReady;
  if (ApiStatus s = check_comm_handle(comm, &init); !s) return s;
  if (!unregister_comm(comm)) return ApiStatus::invalid_argument("comm was released concurrently");
  DeviceGuard guard;
  // After this no other thread touches the communicator; a pending one fails its rendezvous.
  leave_rendezvous(comm, abort);
  // Its queued collectives (and the other ranks' of the same sets) can no longer run: they
  // would use its buffers and stream after this returns.
  ApiStatus real;
  if (comm->clique != nullptr) {
    comm->clique->release(comm->rank, abort);
    if (CollectiveFallback* f = comm->clique->fallback(); f != nullptr)
      real = f->release(comm->rank, abort);
  }
  release_buffer_registrations(comm, abort);
  EFCCL_INFO(kLogInit, comm->device,
             "comm " + pointer_text(comm) + " rank " + std::to_string(comm->rank) +
                 (abort ? " - Abort COMPLETE" : " - Destroy COMPLETE"));
  comm->magic = kCommDeadMagic;
  delete comm;
  return real;
}

}  // namespace efccl::runtime
