#include "fallback/nccl_fallback.h"

#include <cstring>
#include <map>
#include <thread>

#include "base/device_guard.h"
#include "base/settings.h"
#include "efccl/common/log.h"
#include "efccl/host/numeric.h"
#include "efccl/net/bootstrap.h"

namespace efccl::runtime {
namespace {

/// The bootstrap tag of the real unique id's exchange (the runtime's other tags set one of the
/// top two bits; a bootstrap serves one communicator, whose init exchanges this once).
constexpr uint64_t kRealIdTag = 0x0efcc1fa11bac000ull;

}  // namespace

// ---------------------------------------------------------------------------------------------
// A clique's real communicators

NcclFallback::NcclFallback(std::shared_ptr<const NcclLibrary> library, std::vector<ncclComm_t> real,
                           std::vector<int> devices)
    : library_(std::move(library)), real_(std::move(real)), devices_(std::move(devices)) {}

NcclFallback::NcclFallback(std::shared_ptr<const NcclLibrary> library, std::string unavailable)
    : library_(std::move(library)), unavailable_(std::move(unavailable)) {}

NcclFallback::~NcclFallback() {
  DeviceGuard guard;
  RealNcclCall inside("ncclCommAbort");
  if (!inside.status()) return;
  for (ncclComm_t c : real_)
    if (c != nullptr) (void)library_->comm_abort(c);
}

ncclComm_t NcclFallback::real(int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return rank >= 0 && static_cast<std::size_t>(rank) < real_.size()
             ? real_[static_cast<std::size_t>(rank)]
             : nullptr;
}

ApiStatus NcclFallback::run(const std::vector<Call>& set, const std::string& why,
                            std::chrono::nanoseconds timeout) {
  const Call& ref = set.front();
  const std::string api = api_name(ref.kind);
  if (!unavailable_.empty())
    return ApiStatus::invalid_usage(api + ": " + why +
                                    "; EFCCL_FALLBACK=nccl cannot run it on "
                                    "this communicator: " +
                                    unavailable_);
  const NcclLibrary& lib = *library_;
  EFCCL_INFO(
      kLogColl | kLogTuning, -1,
      describe(ref) + ": no program covers it (" + why + "); running it on " + lib.describe());
  RealNcclCall inside(api.c_str());
  if (!inside.status()) return inside.status();
  DeviceGuard guard;

  std::vector<ncclComm_t> comms;
  for (const Call& c : set) {
    ncclComm_t comm = real(c.rank);
    if (comm == nullptr)
      return ApiStatus::invalid_usage(api + ": rank " + std::to_string(c.rank) +
                                      "'s NCCL communicator is gone (destroyed or aborted)");
    comms.push_back(comm);
  }
  // A premulsum operator exists per real communicator: one per call, destroyed once the group
  // has been enqueued.
  std::vector<ncclRedOp_t> ops(set.size(), static_cast<ncclRedOp_t>(ref.op));
  std::size_t created = 0;
  ApiStatus status;
  if (ref.op == ef::RedOp::kPreMulSum) {
    for (; created < set.size(); ++created) {
      unsigned char scalar[8] = {};
      // The scalar was read from one element of the datatype: converting back is exact.
      host::double_to_element(set[created].dtype, set[created].premul_scalar, scalar);
      const ncclResult_t r = lib.red_op_create_pre_mul_sum(
          &ops[created], scalar, static_cast<ncclDataType_t>(set[created].dtype),
          ncclScalarHostImmediate, comms[created]);
      if (r != ncclSuccess) {
        status = real_failure(lib, "ncclRedOpCreatePreMulSum", r);
        break;
      }
    }
  }
  if (status) {
    if (const ncclResult_t r = lib.group_start(); r != ncclSuccess)
      status = real_failure(lib, "ncclGroupStart", r);
  }
  if (status) {
    for (std::size_t i = 0; i < set.size() && status; ++i) {
      const Call& c = set[i];
      const auto dtype = static_cast<ncclDataType_t>(c.dtype);
      if (c.rank >= 0 && static_cast<std::size_t>(c.rank) < devices_.size())
        cudaSetDevice(devices_[static_cast<std::size_t>(c.rank)]);
      ncclResult_t r = ncclSuccess;
      switch (c.kind) {
        case CallKind::kAllReduce:
          r = lib.all_reduce(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], comms[i], c.stream);
          break;
        case CallKind::kBroadcast:
          r = lib.broadcast(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kReduce:
          r = lib.reduce(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], c.root, comms[i],
                         c.stream);
          break;
        case CallKind::kAllGather:
          r = lib.all_gather(c.sendbuff, c.recvbuff, c.count, dtype, comms[i], c.stream);
          break;
        case CallKind::kReduceScatter:
          r = lib.reduce_scatter(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], comms[i],
                                 c.stream);
          break;
        case CallKind::kAllToAll:
          r = lib.all_to_all(c.sendbuff, c.recvbuff, c.count, dtype, comms[i], c.stream);
          break;
        case CallKind::kGather:
          r = lib.gather(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kScatter:
          r = lib.scatter(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kSend:
        case CallKind::kRecv:
          status = ApiStatus::internal("send/receive never falls back to NCCL");
          continue;
      }
      if (r != ncclSuccess && r != ncclInProgress)
        status = real_failure(lib, api + " of rank " + std::to_string(c.rank), r);
    }
    // The group is closed even after a failed call (NCCL then drops the group's calls).
    const ncclResult_t r = lib.group_end();
    if (r == ncclInProgress) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      ApiStatus s = wait_real(lib, comms, "ncclGroupEnd (" + api + ")", deadline, timeout, nullptr);
      if (!s && status) status = s;
    } else if (r != ncclSuccess && status) {
      status = real_failure(lib, "ncclGroupEnd (" + api + ")", r);
    }
  }
  for (std::size_t i = 0; i < created; ++i) (void)lib.red_op_destroy(ops[i], comms[i]);
  return status;
}

ApiStatus NcclFallback::release(int32_t rank, bool abort) {
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= real_.size()) return ApiStatus::ok();
    std::swap(comm, real_[static_cast<std::size_t>(rank)]);
  }
  if (comm == nullptr) return ApiStatus::ok();
  const char* what = abort ? "ncclCommAbort" : "ncclCommDestroy";
  RealNcclCall inside(what);
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = abort ? library_->comm_abort(comm) : library_->comm_destroy(comm);
  return r == ncclSuccess
             ? ApiStatus::ok()
             : real_failure(*library_, std::string(what) + " of rank " + std::to_string(rank), r);
}

ApiStatus NcclFallback::finalize(int32_t rank, std::chrono::nanoseconds timeout) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommFinalize");
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = library_->comm_finalize(comm);
  if (r != ncclSuccess && r != ncclInProgress)
    return real_failure(*library_, "ncclCommFinalize", r);
  return wait_real(*library_, {comm}, "ncclCommFinalize",
                   std::chrono::steady_clock::now() + timeout, timeout, nullptr);
}

ApiStatus NcclFallback::revoke(int32_t rank, std::chrono::nanoseconds timeout) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommRevoke");
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = library_->comm_revoke(comm, NCCL_REVOKE_DEFAULT);
  if (r != ncclSuccess && r != ncclInProgress) return real_failure(*library_, "ncclCommRevoke", r);
  return wait_real(*library_, {comm}, "ncclCommRevoke", std::chrono::steady_clock::now() + timeout,
                   timeout, nullptr);
}

ApiStatus NcclFallback::async_error(int32_t rank) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommGetAsyncError");
  if (!inside.status()) return inside.status();
  ncclResult_t state = ncclSuccess;
  if (const ncclResult_t r = library_->comm_get_async_error(comm, &state); r != ncclSuccess)
    return real_failure(*library_, "ncclCommGetAsyncError", r);
  if (state == ncclSuccess || state == ncclInProgress) return ApiStatus::ok();
  return real_failure(*library_, "the NCCL communicator of rank " + std::to_string(rank), state);
}

// ---------------------------------------------------------------------------------------------
// Creation

FallbackPlan single_process_fallback_plan(const std::vector<int>& devices) {
  FallbackPlan plan;
  plan.nranks = static_cast<int>(devices.size());
  std::map<int, int32_t> first_rank_on;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    const auto rank = static_cast<int32_t>(r);
    plan.ranks.push_back(rank);
    plan.devices.push_back(devices[r]);
    auto [it, fresh] = first_rank_on.emplace(devices[r], rank);
    if (!fresh && plan.shared_gpu.empty())
      plan.shared_gpu = "ranks " + std::to_string(it->second) + " and " + std::to_string(rank) +
                        " share CUDA device " + std::to_string(devices[r]);
  }
  return plan;
}

namespace {

/// Creates the real communicators of the plan's ranks from `id` (non-blocking, polled), and
/// hands out blocking children of them.
ApiStatus create_real_comms(const NcclLibrary& lib, const FallbackPlan& plan,
                            const ncclUniqueId& id, std::vector<ncclComm_t>* out) {
  const std::chrono::nanoseconds timeout = init_timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  DeviceGuard guard;
  std::vector<ncclComm_t> comms(plan.ranks.size(), nullptr);
  ApiStatus status;
  if (const ncclResult_t r = lib.group_start(); r != ncclSuccess)
    return real_failure(lib, "ncclGroupStart", r);
  for (std::size_t i = 0; i < plan.ranks.size() && status; ++i) {
    // Non-blocking, whatever the user asked for: polling keeps a deadline and an abort path.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (i < plan.configs.size()) config = plan.configs[i].get();
    config.blocking = 0;
    if (cudaError_t e = cudaSetDevice(plan.devices[i]); e != cudaSuccess) {
      status = ApiStatus::cuda("cudaSetDevice(" + std::to_string(plan.devices[i]) +
                               "): " + cudaGetErrorString(e));
      break;
    }
    const ncclResult_t r =
        lib.comm_init_rank_config(&comms[i], plan.nranks, id, plan.ranks[i], &config);
    if (r != ncclSuccess && r != ncclInProgress)
      status =
          real_failure(lib, "ncclCommInitRankConfig of rank " + std::to_string(plan.ranks[i]), r);
  }
  const ncclResult_t r = lib.group_end();
  if (status && r != ncclSuccess && r != ncclInProgress)
    status = real_failure(lib, "ncclGroupEnd (ncclCommInitRankConfig)", r);
  if (status)
    status = wait_real(lib, comms, "ncclCommInitRankConfig", deadline, timeout, plan.abort);
  if (!status) {
    for (ncclComm_t c : comms)
      if (c != nullptr) (void)lib.comm_abort(c);
    return status;
  }
  // A non-blocking communicator ends every group on a thread of NCCL's, which the caller must
  // then poll: 50-150 us per call measured. The collectives therefore run on a blocking child,
  // split from the non-blocking parent: the split itself runs as the parent's (non-blocking)
  // job, so it keeps the deadline above, and the child's groups end on the calling thread.
  std::vector<ncclComm_t> children(comms.size(), nullptr);
  if (const ncclResult_t g = lib.group_start(); g != ncclSuccess)
    status = real_failure(lib, "ncclGroupStart", g);
  for (std::size_t i = 0; i < comms.size() && status; ++i) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (i < plan.configs.size()) config = plan.configs[i].get();
    config.blocking = 1;
    if (cudaError_t e = cudaSetDevice(plan.devices[i]); e != cudaSuccess) {
      status = ApiStatus::cuda("cudaSetDevice(" + std::to_string(plan.devices[i]) +
                               "): " + cudaGetErrorString(e));
      break;
    }
    const ncclResult_t s = lib.comm_split(comms[i], 0, plan.ranks[i], &children[i], &config);
    if (s != ncclSuccess && s != ncclInProgress)
      status = real_failure(lib, "ncclCommSplit of rank " + std::to_string(plan.ranks[i]), s);
  }
  if (const ncclResult_t g = lib.group_end(); status && g != ncclSuccess && g != ncclInProgress)
    status = real_failure(lib, "ncclGroupEnd (ncclCommSplit)", g);
  if (status) {
    std::vector<ncclComm_t> both = comms;
    both.insert(both.end(), children.begin(), children.end());
    status = wait_real(lib, both, "ncclCommSplit", deadline, timeout, plan.abort);
  }
  // The parents are not needed any more: finalize (non-blocking, polled) and free them.
  if (status) {
    if (const ncclResult_t g = lib.group_start(); g != ncclSuccess)
      status = real_failure(lib, "ncclGroupStart", g);
    for (std::size_t i = 0; i < comms.size() && status; ++i) {
      const ncclResult_t f = lib.comm_finalize(comms[i]);
      if (f != ncclSuccess && f != ncclInProgress)
        status = real_failure(lib, "ncclCommFinalize of rank " + std::to_string(plan.ranks[i]), f);
    }
    if (const ncclResult_t g = lib.group_end(); status && g != ncclSuccess && g != ncclInProgress)
      status = real_failure(lib, "ncclGroupEnd (ncclCommFinalize)", g);
    if (status) status = wait_real(lib, comms, "ncclCommFinalize", deadline, timeout, plan.abort);
  }
  for (ncclComm_t c : comms)
    if (c != nullptr) (void)(status ? lib.comm_destroy(c) : lib.comm_abort(c));
  if (!status) {
    for (ncclComm_t c : children)
      if (c != nullptr) (void)lib.comm_abort(c);
    return status;
  }
  *out = std::move(children);
  return ApiStatus::ok();
}

}  // namespace

ApiStatus create_fallback(const FallbackPlan& plan, std::shared_ptr<NcclFallback>* out) {
  out->reset();
  StatusOr<FallbackMode> mode = fallback_mode_from_environment();
  if (!mode) return ApiStatus::invalid_usage(mode.status().message());
  if (*mode == FallbackMode::kOff) return ApiStatus::ok();
  RealNcclCall inside("ncclCommInitRankConfig");
  if (!inside.status()) return inside.status();

  StatusOr<std::shared_ptr<const NcclLibrary>> lib = nccl_library_from_environment();
  ApiStatus status =
      lib ? ApiStatus::ok() : ApiStatus::system("EFCCL_FALLBACK=nccl: " + lib.status().message());
  if (status && !plan.shared_gpu.empty()) {
    // Decided alike in every process (from the table of all ranks): no exchange, no NCCL init.
    EFCCL_WARN(plan.devices.empty() ? -1 : plan.devices.front(),
               "EFCCL_FALLBACK=nccl: this communicator of " + std::to_string(plan.nranks) +
                   " ranks has no NCCL fallback: " + plan.shared_gpu +
                   ", which NCCL refuses; calls that no program covers fail on it");
    *out = std::make_shared<NcclFallback>(*lib, plan.shared_gpu +
                                                    " (NCCL refuses several "
                                                    "ranks on one GPU)");
    return ApiStatus::ok();
  }
  if (!status && plan.leader == nullptr) return status;

  const bool holds_rank0 = std::find(plan.ranks.begin(), plan.ranks.end(), 0) != plan.ranks.end();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (status && holds_rank0) {
    if (const ncclResult_t r = (*lib)->get_unique_id(&id); r != ncclSuccess)
      status = real_failure(**lib, "ncclGetUniqueId", r);
  }
  if (plan.leader != nullptr) {
    // Every process learns the id from rank 0's, and whether any process failed to get ready
    // (so that none waits for a real init another will never start).
    std::string mine = !status       ? "E" + status.message()
                       : holds_rank0 ? "I" + std::string(id.internal, sizeof(id.internal))
                                     : std::string("K");
    const auto deadline = std::chrono::steady_clock::now() + init_timeout();
    auto all =
        plan.leader->allgather(plan.leaders, kRealIdTag, std::move(mine), deadline, plan.abort);
    if (!all)
      return ApiStatus::system(
          "EFCCL_FALLBACK=nccl: exchanging NCCL's unique id between the "
          "processes (does every process set EFCCL_FALLBACK=nccl?): " +
          all.status().message());
    if (!status) return status;
    bool found = false;
    for (std::size_t i = 0; i < all->size(); ++i) {
      const std::string& e = (*all)[i];
      if (!e.empty() && e[0] == 'E')
        return ApiStatus::invalid_usage("EFCCL_FALLBACK=nccl: the process of rank " +
                                        std::to_string(plan.leaders[i]) +
                                        " could not set up NCCL: " + e.substr(1));
      if (e.size() == 1 + sizeof(id.internal) && e[0] == 'I') {
        std::memcpy(id.internal, e.data() + 1, sizeof(id.internal));
        found = true;
      }
    }
    if (!found) return ApiStatus::internal("EFCCL_FALLBACK=nccl: no process sent NCCL's unique id");
  }
  if (!status) return status;

  std::vector<ncclComm_t> local;
  if (ApiStatus s = create_real_comms(**lib, plan, id, &local); !s) return s;
  std::vector<ncclComm_t> by_rank(static_cast<std::size_t>(plan.nranks), nullptr);
  std::vector<int> devices(static_cast<std::size_t>(plan.nranks), -1);
  for (std::size_t i = 0; i < plan.ranks.size(); ++i) {
    by_rank[static_cast<std::size_t>(plan.ranks[i])] = local[i];
    devices[static_cast<std::size_t>(plan.ranks[i])] = plan.devices[i];
  }
  EFCCL_INFO(kLogInit, plan.devices.empty() ? -1 : plan.devices.front(),
             "EFCCL_FALLBACK=nccl: NCCL communicators of rank(s) " + rank_list(plan.ranks) +
                 " (of " + std::to_string(plan.nranks) + ") created on " + (*lib)->describe());
  *out = std::make_shared<NcclFallback>(*lib, std::move(by_rank), std::move(devices));
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
