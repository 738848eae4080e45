// The NCCL ABI (nccl.h 2.28): every entry point checks its arguments, converts internal
// statuses at this boundary (report()), and is exported together with its pncclX alias.
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/api_status.h"
#include "launch/call.h"
#include "bootstrap.h"
#include "efccl/common/hash.h"
#include "enqueue/clique.h"
#include "comm/communicator.h"
#include "base/device_guard.h"
#include "efccl/host/numeric.h"
#include "fallback/nccl_fallback.h"
#include "enqueue/group.h"
#include "enqueue/group_simulation.h"
#include "comm/rendezvous.h"
#include "efccl/common/log.h"
#include "select/program_registry.h"

#define EFCCL_API __attribute__((visibility("default")))
/// pnccl<name>: the same function under NCCL's profiling name.
#define EFCCL_ALIAS(name) \
  extern "C" EFCCL_API decltype(name) p##name __attribute__((alias(#name)));

/// The handle of a no-op registration: ncclCommRegister's `void*` and ncclCommWindowRegister's
/// ncclWindow_t (opaque in nccl.h). Owned by the communicator's `registrations`.
struct ncclWindow_vidmem {
  bool window = false;  ///< from ncclCommWindowRegister
  void* buff = nullptr;
  size_t size = 0;
};

using efccl::runtime::ApiStatus;
using efccl::runtime::Call;
using efccl::runtime::CallKind;
using efccl::runtime::DeviceGuard;
using efccl::runtime::report;
namespace ef = efccl::ef;

namespace {


std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

ApiStatus check_datatype(ncclDataType_t t) {
  if (static_cast<int>(t) < 0 || static_cast<int>(t) >= ncclNumTypes)
    return ApiStatus::invalid_argument("invalid datatype " + std::to_string(static_cast<int>(t)) +
                                       " (valid: 0.." + std::to_string(ncclNumTypes - 1) + ")");
  return ApiStatus::ok();
}

/// A scalar of `dtype` at `p` (host memory) as a double.
double scalar_value(ef::DataType dtype, const void* p) {
  namespace h = efccl::host;
  switch (dtype) {
    case ef::DataType::kInt8: { int8_t v; std::memcpy(&v, p, 1); return v; }
    case ef::DataType::kUint8: { uint8_t v; std::memcpy(&v, p, 1); return v; }
    case ef::DataType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ef::DataType::kUint32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case ef::DataType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case ef::DataType::kUint64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case ef::DataType::kFloat16: { uint16_t v; std::memcpy(&v, p, 2); return h::half_to_float(v); }
    case ef::DataType::kFloat32: { float v; std::memcpy(&v, p, 4); return v; }
    case ef::DataType::kFloat64: { double v; std::memcpy(&v, p, 8); return v; }
    case ef::DataType::kBFloat16: { uint16_t v; std::memcpy(&v, p, 2); return h::bfloat16_to_float(v); }
    case ef::DataType::kFp8E4M3: { uint8_t v; std::memcpy(&v, p, 1); return h::fp8_e4m3_to_float(v); }
    case ef::DataType::kFp8E5M2: { uint8_t v; std::memcpy(&v, p, 1); return h::fp8_e5m2_to_float(v); }
  }
  return 1.0;
}

/// Resolves `op` for a call of `dtype` on `comm`: the built-in operator, or a premulsum op
/// with this rank's scalar (device-resident scalars are read now, outside any capture).
ApiStatus resolve_op(ncclComm* comm, ncclRedOp_t op, ncclDataType_t dtype, cudaStream_t stream,
                     ef::RedOp* out, double* scalar) {
  const int v = static_cast<int>(op);
  if (v >= 0 && v < ncclNumOps) {
    *out = static_cast<ef::RedOp>(v);
    return ApiStatus::ok();
  }
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  const int index = v - ncclNumOps;
  if (v < 0 || index >= static_cast<int>(comm->premul_ops.size()) ||
      !comm->premul_ops[static_cast<std::size_t>(index)].in_use)
    return ApiStatus::invalid_argument("invalid reduction operator " + std::to_string(v) +
                                       " (not built in, and not created on this communicator "
                                       "by ncclRedOpCreatePreMulSum)");
  const efccl::runtime::PreMulSumOp& p = comm->premul_ops[static_cast<std::size_t>(index)];
  if (static_cast<int>(p.dtype) != static_cast<int>(dtype))
    return ApiStatus::invalid_argument(
        "reduction operator " + std::to_string(v) + " was created for datatype " +
        std::string(ef::to_string(p.dtype)) + " but the call uses " +
        std::string(ef::to_string(static_cast<ef::DataType>(dtype))));
  *out = ef::RedOp::kPreMulSum;
  *scalar = p.host_value;
  if (p.device_resident) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone)
      return ApiStatus::invalid_usage(
          "a premulsum operator with a device-resident scalar cannot be used during CUDA graph "
          "capture yet (efccl reads the scalar when the call is enqueued)");
    DeviceGuard guard;
    unsigned char bytes[8] = {};
    cudaSetDevice(comm->device);
    // In the call's stream order, so that a kernel the caller queued to compute the scalar has
    // finished (the legacy default stream does not order against non-blocking streams).
    cudaError_t e = cudaMemcpyAsync(bytes, p.device_scalar, ef::size_of(p.dtype),
                                    cudaMemcpyDefault, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess)
      return ApiStatus::cuda(std::string("reading the premulsum scalar: ") + cudaGetErrorString(e));
    *scalar = scalar_value(p.dtype, bytes);
  }
  return ApiStatus::ok();
}

/// Checks one call as NCCL does and records it in the thread's group.
ApiStatus submit_call(CallKind kind, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                      cudaStream_t stream) {
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
  if (comm->revoked.load())
    return ApiStatus::invalid_usage("the communicator was revoked (ncclCommRevoke): only destroy, "
                                    "split and shrink are allowed");
  if (ApiStatus s = check_datatype(datatype); !s) return s;
  const int nranks = comm->clique->nranks();
  const bool p2p = efccl::runtime::is_p2p(kind);
  if ((efccl::runtime::is_rooted(kind) || p2p) && (root < 0 || root >= nranks))
    return ApiStatus::invalid_argument(std::string(p2p ? "peer " : "root ") + std::to_string(root) +
                                       " is out of range (the communicator has " +
                                       std::to_string(nranks) + " ranks)");
  // Element counts: total bytes of the largest API buffer must be addressable.
  const uint64_t size = ef::size_of(static_cast<ef::DataType>(datatype));
  const bool per_block = kind == CallKind::kAllGather || kind == CallKind::kReduceScatter ||
                         kind == CallKind::kAllToAll || kind == CallKind::kGather ||
                         kind == CallKind::kScatter;
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) /
                         size / (per_block ? static_cast<uint64_t>(nranks) : 1);
  if (count > limit)
    return ApiStatus::invalid_argument("count " + std::to_string(count) + " of " +
                                       std::string(ef::to_string(static_cast<ef::DataType>(datatype))) +
                                       " overflows the buffer size");
  if (count > 0) {
    const bool root_rank = comm->rank == root;
    bool need_send = true, need_recv = true;
    switch (kind) {
      case CallKind::kBroadcast: need_send = root_rank; break;
      case CallKind::kReduce: case CallKind::kGather: need_recv = root_rank; break;
      case CallKind::kScatter: need_send = root_rank; break;
      case CallKind::kSend: need_recv = false; break;
      case CallKind::kRecv: need_send = false; break;
      default: break;
    }
    if (need_send && sendbuff == nullptr) return ApiStatus::invalid_argument("sendbuff is NULL");
    if (need_recv && recvbuff == nullptr) return ApiStatus::invalid_argument("recvbuff is NULL");
  }
  Call call;
  call.kind = kind;
  call.clique = comm->clique;
  call.rank = comm->rank;
  call.sendbuff = sendbuff;
  call.recvbuff = recvbuff;
  call.count = count;
  call.dtype = static_cast<ef::DataType>(datatype);
  call.root = root;
  call.stream = stream;
  if (kind == CallKind::kAllReduce || kind == CallKind::kReduce || kind == CallKind::kReduceScatter) {
    if (ApiStatus s = resolve_op(comm, op, datatype, stream, &call.op, &call.premul_scalar); !s)
      return s;
  }
  DeviceGuard guard;
  return efccl::runtime::enqueue(std::move(call));
}

ncclResult_t finish(const char* function, const ApiStatus& s) {
  if (!s && s.code() != ncclInProgress) efccl::runtime::fail_group(s);
  return report(function, s);
}

void log_version_once() {
  static std::once_flag version_once;
  std::call_once(version_once, [] {
    EFCCL_LOG(efccl::LogLevel::kVersion, efccl::kLogInit, -1,
              "efccl (NCCL API " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                  "." + std::to_string(NCCL_PATCH) + "), every transfer an EF program");
  });
}

}  // namespace

// ---- Version and errors ----

EFCCL_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return report("ncclGetVersion", ApiStatus::invalid_argument("version is NULL"));
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
EFCCL_ALIAS(ncclGetVersion)

EFCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}
EFCCL_ALIAS(ncclGetErrorString)

EFCCL_API const char* ncclGetLastError(ncclComm_t /*comm*/) {
  return efccl::runtime::last_error_message();
}
EFCCL_ALIAS(ncclGetLastError)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
EFCCL_API void ncclResetDebugInit() { efccl::reload_log_config(); }
EFCCL_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop

// ---- Communicators ----

EFCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  // A random magic and the address of a root listener started here (or NCCL_COMM_ID's), which
  // the ranks of the communicator meet at (bootstrap.h).
  if (uniqueId == nullptr) return report("ncclGetUniqueId", ApiStatus::invalid_argument("uniqueId is NULL"));
  log_version_once();
  if (efccl::Status s = efccl::runtime::create_unique_id(uniqueId); !s)
    return report("ncclGetUniqueId", ApiStatus::system(s.message()));
  return ncclSuccess;
}
EFCCL_ALIAS(ncclGetUniqueId)

EFCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const char* fn = "ncclCommInitAll";
  if (comms == nullptr) return report(fn, ApiStatus::invalid_argument("comms is NULL"));
  if (ndev < 1) return report(fn, ApiStatus::invalid_argument("ndev " + std::to_string(ndev) + " must be >= 1"));
  DeviceGuard guard;
  int visible = 0;
  if (cudaError_t e = cudaGetDeviceCount(&visible); e != cudaSuccess) {
    (void)cudaGetLastError();
    return report(fn, ApiStatus::cuda(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)));
  }
  std::vector<int> devices(static_cast<std::size_t>(ndev));
  for (int r = 0; r < ndev; ++r) {
    devices[static_cast<std::size_t>(r)] = devlist != nullptr ? devlist[r] : r;
    const int d = devices[static_cast<std::size_t>(r)];
    if (d < 0 || d >= visible)
      return report(fn, ApiStatus::invalid_argument("devlist[" + std::to_string(r) + "] = " +
                                                    std::to_string(d) + " is not a CUDA device (" +
                                                    std::to_string(visible) + " visible)"));
  }
  log_version_once();
  auto clique = efccl::runtime::Clique::create(devices, efccl::runtime::Registry::from_environment());
  if (!clique) return report(fn, ApiStatus::cuda(clique.status().message()));
  std::shared_ptr<efccl::runtime::CliqueFallback> fallback;
  if (ApiStatus s = efccl::runtime::create_fallback(
          efccl::runtime::single_process_fallback_plan(devices), &fallback);
      !s)
    return report(fn, s);
  (*clique)->set_fallback(std::move(fallback));
  for (int r = 0; r < ndev; ++r) {
    (*clique)->set_driver(r, efccl::runtime::this_thread_token());  // this thread drives every rank
    auto* comm = new ncclComm();
    comm->rank = r;
    comm->device = devices[static_cast<std::size_t>(r)];
    comm->clique = *clique;
    efccl::runtime::register_comm(comm);
    comms[r] = comm;
    EFCCL_INFO(efccl::kLogInit, comm->device,
               "comm " + hex(comm) + " rank " + std::to_string(r) + " nRanks " +
                   std::to_string(ndev) + " nNodes 1 cudaDev " + std::to_string(comm->device) +
                   " - Init COMPLETE");
  }
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommInitAll)

namespace {

/// ncclCommInitRank* of one rank: checks the arguments, allocates the pending communicator
/// (*newcomm valid on return, as NCCL), joins the id's rendezvous and, outside a group, waits
/// for the clique (init_rank.h). `joined` (a grouped split): the rendezvous is handed there
/// instead, for the caller to complete.
ApiStatus init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank,
                    const ncclConfig_t* config, bool local_only = false,
                    std::shared_ptr<efccl::runtime::Rendezvous>* joined = nullptr,
                    uint64_t driver = 0) {
  if (newcomm == nullptr) return ApiStatus::invalid_argument("comm is NULL");
  *newcomm = nullptr;
  if (nranks < 1)
    return ApiStatus::invalid_argument("nranks " + std::to_string(nranks) + " must be >= 1");
  if (rank < 0 || rank >= nranks)
    return ApiStatus::invalid_argument("rank " + std::to_string(rank) + " is out of range (nranks " +
                                       std::to_string(nranks) + ")");
  efccl::runtime::CommConfig cfg;
  if (ApiStatus s = efccl::runtime::parse_config(config, &cfg); !s) return s;
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
  comm->init = efccl::runtime::CommInit::kPending;
  comm->blocking = cfg.blocking;
  comm->real_config = cfg.real;
  std::shared_ptr<efccl::runtime::Rendezvous> rendezvous;
  if (ApiStatus s = efccl::runtime::join_rendezvous(
          id, nranks, rank, device, device_error, comm, &rendezvous, local_only,
          driver != 0 ? driver : efccl::runtime::this_thread_token());
      !s) {
    delete comm;
    return s;
  }
  comm->rendezvous = rendezvous;
  efccl::runtime::register_comm(comm);
  *newcomm = comm;
  const bool grouped = joined != nullptr || efccl::runtime::in_group();
  EFCCL_INFO(efccl::kLogInit, device,
             "comm " + hex(comm) + " rank " + std::to_string(rank) + " nRanks " +
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
    efccl::runtime::defer_init(std::move(rendezvous));
    return ApiStatus::ok();
  }
  // Only the rendezvous from here on: another thread may destroy the communicator meanwhile.
  const auto timeout = efccl::runtime::init_timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!cfg.blocking) {
    // Non-blocking (ncclConfig_t::blocking = 0): a helper thread completes the rendezvous;
    // ncclCommGetAsyncError reports ncclInProgress until the clique formed (or the failure).
    std::thread([rendezvous, deadline, timeout] {
      (void)efccl::runtime::complete_rendezvous(rendezvous, deadline, timeout);
    }).detach();
    return ApiStatus(ncclInProgress, "");
  }
  return efccl::runtime::complete_rendezvous(rendezvous, deadline, timeout);
}

/// One rank's ncclCommSplit / ncclCommShrink, with what it needs from the parent copied out so
/// that a grouped one can finish at ncclGroupEnd. The `participants` (ascending parent ranks,
/// the caller among them) exchange (color, key); ranks of the caller's color, ordered by (key,
/// parent rank), form a new communicator, initialized like ncclCommInitRank with an id made by
/// its new rank 0 (multi-process: shared through the parent's bootstrap; single process: an
/// in-process id no root serves), on the parent's GPU.
struct Regroup {
  const char* fn = "";
  std::shared_ptr<efccl::runtime::Clique> clique;
  std::shared_ptr<efccl::runtime::Bootstrap> bootstrap;  ///< multi-process parents only
  std::string parent_name;                               ///< for the log
  int rank = 0;
  int device = 0;
  bool blocking = true;
  std::vector<int> participants;
  int color = 0;
  int key = 0;
  uint64_t seq = 0;  ///< which regroup of these participants (every participant counts alike)
  uint64_t set_hash = 0;
  uint64_t tag = 0;  ///< the exchange's tag
  /// The thread that called ncclCommSplit/Shrink (the one that ends its group): the child's
  /// driver, also when the split finishes on a helper thread.
  uint64_t driver = 0;
  ncclComm_t* newcomm = nullptr;
  bool has_config = false;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;  ///< a copy of the caller's (has_config)
};

/// Checks `config` and copies what the split needs from `parent` (counts the regroup).
ApiStatus start_regroup(const char* fn, ncclComm_t parent, std::vector<int> participants,
                        int color, int key, ncclComm_t* newcomm, const ncclConfig_t* config,
                        Regroup* out) {
  Regroup& g = *out;
  if (config != nullptr) {
    efccl::runtime::CommConfig checked;
    if (ApiStatus s = efccl::runtime::parse_config(config, &checked); !s) return s;
    std::size_t size = 0;
    std::memcpy(&size, config, sizeof(size));
    std::memcpy(static_cast<void*>(&g.config), config, std::min(size, sizeof(ncclConfig_t)));
    g.has_config = true;
  }
  g.fn = fn;
  g.clique = parent->clique;
  g.bootstrap = parent->bootstrap;
  g.parent_name = hex(parent);
  g.rank = parent->rank;
  g.device = parent->device;
  g.blocking = parent->blocking;
  g.participants = std::move(participants);
  g.color = color;
  g.key = key;
  g.newcomm = newcomm;
  g.driver = efccl::runtime::this_thread_token();
  {
    std::lock_guard<std::mutex> lock(parent->ops_mu);
    g.seq = parent->regroups[g.participants]++;
  }
  g.set_hash = efccl::kFnv1aOffset;
  for (int p : g.participants) g.set_hash = efccl::fnv1a_u64(static_cast<uint64_t>(p), g.set_hash);
  // Tags of the parent's bootstrap for its regroups (executors use other namespaces).
  g.tag = (uint64_t{3} << 62) | ((g.set_hash & 0xffffffffull) << 24) | ((g.seq & 0x7fffff) << 1);
  return ApiStatus::ok();
}

std::string color_and_key(const Regroup& g) {
  const int32_t ck[2] = {g.color, g.key};
  return std::string(reinterpret_cast<const char*>(ck), sizeof(ck));
}

/// The participants' contributions under tag `tag` (outside a group: waits for all).
efccl::StatusOr<std::vector<std::string>> gather(const Regroup& g, uint64_t tag, std::string mine,
                                                 std::chrono::steady_clock::time_point deadline) {
  if (g.bootstrap != nullptr)
    return g.bootstrap->allgather(g.participants, tag, std::move(mine), deadline, nullptr);
  return efccl::runtime::meet_in_process(g.clique.get(), tag, g.participants, g.rank,
                                         std::move(mine), deadline);
}

/// With every participant's (color, key): the new communicator of this rank, if any.
ApiStatus finish_regroup(const Regroup& g, const std::vector<std::string>& entries,
                         std::chrono::steady_clock::time_point deadline,
                         std::shared_ptr<efccl::runtime::Rendezvous>* joined) {
  const char* fn = g.fn;
  struct Member { int32_t key; int parent_rank; };
  std::vector<Member> group;
  for (std::size_t i = 0; i < g.participants.size(); ++i) {
    int32_t ck[2] = {0, 0};
    if (entries[i].size() != sizeof(ck))
      return ApiStatus::system(std::string(fn) + ": rank " + std::to_string(g.participants[i]) + " sent a malformed color");
    std::memcpy(ck, entries[i].data(), sizeof(ck));
    if (ck[0] == g.color && g.color != NCCL_SPLIT_NOCOLOR) group.push_back({ck[1], g.participants[i]});
  }
  std::sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.parent_rank < b.parent_rank;
  });
  int new_rank = -1;
  for (std::size_t i = 0; i < group.size(); ++i)
    if (group[i].parent_rank == g.rank) new_rank = static_cast<int>(i);

  // The new communicator's id: made by its rank 0, or derived in-process.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (g.bootstrap != nullptr) {
    std::string offer;
    if (new_rank == 0) {
      if (efccl::Status s = efccl::runtime::create_unique_id(&id); !s)
        return ApiStatus::system(std::string(fn) + ": " + s.message());
      offer.assign(id.internal, sizeof(id.internal));
    }
    auto offers = gather(g, g.tag | 1, offer, deadline);
    if (!offers) return ApiStatus::system(std::string(fn) + ": the ranks could not exchange ids: " + offers.status().message());
    if (new_rank >= 0) {
      const auto at = std::lower_bound(g.participants.begin(), g.participants.end(), group[0].parent_rank) - g.participants.begin();
      const std::string& theirs = (*offers)[static_cast<std::size_t>(at)];
      if (theirs.size() != sizeof(id.internal))
        return ApiStatus::system(std::string(fn) + ": the new communicator's rank 0 sent no id");
      std::memcpy(id.internal, theirs.data(), sizeof(id.internal));
    }
  } else if (new_rank >= 0) {
    const auto clique = reinterpret_cast<uintptr_t>(g.clique.get());
    std::memcpy(id.internal, "efccl-split", 11);
    std::memcpy(id.internal + 16, &clique, sizeof(clique));
    std::memcpy(id.internal + 24, &g.seq, sizeof(g.seq));
    std::memcpy(id.internal + 32, &g.color, sizeof(g.color));
    std::memcpy(id.internal + 40, &g.set_hash, sizeof(g.set_hash));
  }
  if (new_rank < 0) return ApiStatus::ok();  // NCCL_SPLIT_NOCOLOR (or excluded): no communicator

  ncclConfig_t inherited = NCCL_CONFIG_INITIALIZER;
  inherited.blocking = g.blocking ? 1 : 0;
  EFCCL_INFO(efccl::kLogInit, g.device,
             std::string(fn) + ": comm " + g.parent_name + " rank " + std::to_string(g.rank) +
                 " color " + std::to_string(g.color) + " key " + std::to_string(g.key) + " -> rank " +
                 std::to_string(new_rank) + " of " + std::to_string(group.size()));
  // The child lives on the parent's GPU, whichever device the calling thread has current.
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(g.device); e != cudaSuccess)
    return ApiStatus::cuda(std::string(fn) + ": cudaSetDevice(" + std::to_string(g.device) +
                           "): " + cudaGetErrorString(e));
  return init_rank(g.newcomm, static_cast<int>(group.size()), id, new_rank,
                   g.has_config ? &g.config : &inherited, g.bootstrap == nullptr, joined, g.driver);
}

/// Every participant's color (collected after offer_in_process when `offered`, else exchanged
/// now), then the new communicator, within EFCCL_INIT_TIMEOUT_MS.
ApiStatus exchange_and_finish(const Regroup& g, bool offered,
                              std::shared_ptr<efccl::runtime::Rendezvous>* joined) {
  const auto deadline = std::chrono::steady_clock::now() + efccl::runtime::init_timeout();
  auto entries =
      offered ? efccl::runtime::collect_in_process(g.clique.get(), g.tag, g.participants, deadline)
              : gather(g, g.tag, color_and_key(g), deadline);
  if (!entries)
    return ApiStatus::system(std::string(g.fn) + ": the ranks could not exchange colors: " +
                             entries.status().message());
  return finish_regroup(g, *entries, deadline, joined);
}

/// ncclCommSplit / ncclCommShrink of rank `parent`: at once outside a group; inside one, left
/// to the outermost ncclGroupEnd (group.h).
ApiStatus regroup(const char* fn, ncclComm_t parent, std::vector<int> participants, int color,
                  int key, ncclComm_t* newcomm, const ncclConfig_t* config) {
  const bool grouped = efccl::runtime::in_group();
  auto g = std::make_shared<Regroup>();
  if (ApiStatus s = start_regroup(fn, parent, std::move(participants), color, key, newcomm,
                                  config, g.get());
      !s)
    return s;
  if (!grouped) return exchange_and_finish(*g, false, nullptr);
  // Grouped: finished at the outermost ncclGroupEnd. An in-process parent offers its color
  // first and collects the others' there; a parent spanning processes exchanges colors over
  // its bootstrap, on a thread of its own alongside the other grouped splits (this thread may
  // hold several ranks of the parent, whose exchanges need each other).
  const bool across = g->bootstrap != nullptr;
  efccl::runtime::DeferredRegroup deferred;
  deferred.concurrent = across;
  deferred.offer = [g, across] {
    if (!across)
      efccl::runtime::offer_in_process(g->clique.get(), g->tag, g->participants, g->rank,
                                       color_and_key(*g));
    return ApiStatus::ok();
  };
  deferred.finish = [g, across](std::shared_ptr<efccl::runtime::Rendezvous>* joined) {
    return exchange_and_finish(*g, !across, joined);
  };
  efccl::runtime::defer_regroup(std::move(deferred));
  return ApiStatus::ok();
}

}  // namespace

EFCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return finish("ncclCommInitRank", init_rank(comm, nranks, commId, rank, nullptr));
}
EFCCL_ALIAS(ncclCommInitRank)

EFCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  return finish("ncclCommInitRankConfig", init_rank(comm, nranks, commId, rank, config));
}
EFCCL_ALIAS(ncclCommInitRankConfig)

EFCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                ncclUniqueId* commIds, ncclConfig_t* config) {
  // The ids only spread NCCL's bootstrap over several roots; in one process the first is the key.
  const char* fn = "ncclCommInitRankScalable";
  if (newcomm != nullptr) *newcomm = nullptr;
  if (commIds == nullptr) return finish(fn, ApiStatus::invalid_argument("commIds is NULL"));
  if (nId < 1 || nId > std::max(nranks, 1))
    return finish(fn, ApiStatus::invalid_argument("nId " + std::to_string(nId) + " must be in 1..nranks (" +
                                                  std::to_string(nranks) + ")"));
  return finish(fn, init_rank(newcomm, nranks, commIds[0], myrank, config));
}
EFCCL_ALIAS(ncclCommInitRankScalable)

namespace {
/// Destroy and abort: the handle dies at once; the clique (and its executors) when its last
/// communicator goes.
ncclResult_t release_comm(const char* fn, ncclComm_t comm, bool abort) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  efccl::runtime::CommInit init = efccl::runtime::CommInit::kReady;
  if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init); !s) return report(fn, s);
  if (!efccl::runtime::unregister_comm(comm))
    return report(fn, ApiStatus::invalid_argument("comm was released concurrently"));
  DeviceGuard guard;
  // After this no other thread touches the communicator; a pending one fails its rendezvous.
  efccl::runtime::leave_rendezvous(comm, abort);
  // Its queued collectives (and the other ranks' of the same sets) can no longer run: they
  // would use its buffers and stream after this returns.
  if (comm->clique != nullptr) comm->clique->release(comm->rank, abort);
  const ApiStatus real = efccl::runtime::release_fallback(comm, abort);
  {
    std::lock_guard<std::mutex> lock(comm->ops_mu);
    for (void* h : comm->registrations) delete static_cast<ncclWindow_vidmem*>(h);
    comm->registrations.clear();
  }
  EFCCL_INFO(efccl::kLogInit, comm->device,
             "comm " + hex(comm) + " rank " + std::to_string(comm->rank) +
                 (abort ? " - Abort COMPLETE" : " - Destroy COMPLETE"));
  comm->magic = efccl::runtime::kCommDeadMagic;
  delete comm;
  return report(fn, real);
}
}  // namespace

EFCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release_comm("ncclCommDestroy", comm, false); }
EFCCL_ALIAS(ncclCommDestroy)

EFCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) { return release_comm("ncclCommAbort", comm, true); }
EFCCL_ALIAS(ncclCommAbort)

EFCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report("ncclCommFinalize", s);
  ApiStatus s = comm->clique->finalize(comm->rank);
  if (s) s = efccl::runtime::finalize_fallback(comm);
  return report("ncclCommFinalize", s);
}
EFCCL_ALIAS(ncclCommFinalize)

EFCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const char* fn = "ncclCommGetAsyncError";
  efccl::runtime::CommInit init = efccl::runtime::CommInit::kReady;
  ApiStatus init_error;
  if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init, &init_error); !s)
    return report(fn, s);
  if (asyncError == nullptr) return report(fn, ApiStatus::invalid_argument("asyncError is NULL"));
  switch (init) {
    case efccl::runtime::CommInit::kPending: *asyncError = ncclInProgress; break;  // grouped init
    case efccl::runtime::CommInit::kFailed: *asyncError = init_error.code(); break;
    case efccl::runtime::CommInit::kReady:
      // Revoked: quiescent once ncclCommRevoke returned (it waits for the aborted kernels).
      if (comm->revoked.load()) {
        *asyncError = ncclSuccess;
      } else {
        ApiStatus async = comm->clique->async_error(comm->rank);
        if (async) async = efccl::runtime::fallback_async_error(comm);
        efccl::runtime::remember(fn, async);
        *asyncError = async.code();
      }
      break;
  }
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommGetAsyncError)

EFCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report("ncclCommCount", s);
  if (count == nullptr) return report("ncclCommCount", ApiStatus::invalid_argument("count is NULL"));
  *count = comm->clique->nranks();
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommCount)

EFCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  efccl::runtime::CommInit init;  // any state: the device is known from the start
  if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init); !s) return report("ncclCommCuDevice", s);
  if (device == nullptr) return report("ncclCommCuDevice", ApiStatus::invalid_argument("device is NULL"));
  *device = comm->device;
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommCuDevice)

EFCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  efccl::runtime::CommInit init;  // any state: the rank is known from the start
  if (ApiStatus s = efccl::runtime::check_comm_handle(comm, &init); !s) return report("ncclCommUserRank", s);
  if (rank == nullptr) return report("ncclCommUserRank", ApiStatus::invalid_argument("rank is NULL"));
  *rank = comm->rank;
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommUserRank)

// ---- Reduction operators ----

EFCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report(fn, s);
  if (op == nullptr) return report(fn, ApiStatus::invalid_argument("op is NULL"));
  if (scalar == nullptr) return report(fn, ApiStatus::invalid_argument("scalar is NULL"));
  if (ApiStatus s = check_datatype(datatype); !s) return report(fn, s);
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return report(fn, ApiStatus::invalid_argument("invalid scalar residence " +
                                                  std::to_string(static_cast<int>(residence))));
  efccl::runtime::PreMulSumOp created;
  created.in_use = true;
  created.dtype = static_cast<ef::DataType>(datatype);
  created.device_resident = residence == ncclScalarDevice;
  if (created.device_resident)
    created.device_scalar = scalar;
  else
    created.host_value = scalar_value(created.dtype, scalar);
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  std::size_t index = 0;
  while (index < comm->premul_ops.size() && comm->premul_ops[index].in_use) ++index;
  if (index >= static_cast<std::size_t>(ncclMaxRedOp - ncclNumOps))
    return report(fn, ApiStatus::internal("too many reduction operators on this communicator"));
  if (index == comm->premul_ops.size()) comm->premul_ops.push_back(created);
  else comm->premul_ops[index] = created;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(index));
  return ncclSuccess;
}
EFCCL_ALIAS(ncclRedOpCreatePreMulSum)

EFCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* fn = "ncclRedOpDestroy";
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report(fn, s);
  const int index = static_cast<int>(op) - ncclNumOps;
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  if (static_cast<int>(op) < ncclNumOps)
    return report(fn, ApiStatus::invalid_argument("operator " + std::to_string(static_cast<int>(op)) +
                                                  " is built in and cannot be destroyed"));
  if (index >= static_cast<int>(comm->premul_ops.size()) ||
      !comm->premul_ops[static_cast<std::size_t>(index)].in_use)
    return report(fn, ApiStatus::invalid_argument("operator " + std::to_string(static_cast<int>(op)) +
                                                  " was not created on this communicator"));
  comm->premul_ops[static_cast<std::size_t>(index)].in_use = false;
  return ncclSuccess;
}
EFCCL_ALIAS(ncclRedOpDestroy)

// ---- Collectives and point-to-point ----

EFCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) {
  return finish("ncclAllReduce", submit_call(CallKind::kAllReduce, sendbuff, recvbuff, count,
                                             datatype, op, 0, comm, stream));
}
EFCCL_ALIAS(ncclAllReduce)

EFCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return finish("ncclBroadcast", submit_call(CallKind::kBroadcast, sendbuff, recvbuff, count,
                                             datatype, ncclSum, root, comm, stream));
}
EFCCL_ALIAS(ncclBroadcast)

EFCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclBcast", submit_call(CallKind::kBroadcast, buff, buff, count, datatype,
                                         ncclSum, root, comm, stream));
}
EFCCL_ALIAS(ncclBcast)

EFCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclReduce", submit_call(CallKind::kReduce, sendbuff, recvbuff, count, datatype,
                                          op, root, comm, stream));
}
EFCCL_ALIAS(ncclReduce)

EFCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclAllGather", submit_call(CallKind::kAllGather, sendbuff, recvbuff, sendcount,
                                             datatype, ncclSum, 0, comm, stream));
}
EFCCL_ALIAS(ncclAllGather)

EFCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  return finish("ncclReduceScatter", submit_call(CallKind::kReduceScatter, sendbuff, recvbuff,
                                                 recvcount, datatype, op, 0, comm, stream));
}
EFCCL_ALIAS(ncclReduceScatter)

EFCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclAlltoAll", submit_call(CallKind::kAllToAll, sendbuff, recvbuff, count,
                                            datatype, ncclSum, 0, comm, stream));
}
EFCCL_ALIAS(ncclAlltoAll)

EFCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  return finish("ncclGather", submit_call(CallKind::kGather, sendbuff, recvbuff, count, datatype,
                                          ncclSum, root, comm, stream));
}
EFCCL_ALIAS(ncclGather)

EFCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  return finish("ncclScatter", submit_call(CallKind::kScatter, sendbuff, recvbuff, count, datatype,
                                           ncclSum, root, comm, stream));
}
EFCCL_ALIAS(ncclScatter)

EFCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclSend", submit_call(CallKind::kSend, sendbuff, nullptr, count, datatype,
                                        ncclSum, peer, comm, stream));
}
EFCCL_ALIAS(ncclSend)

EFCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  return finish("ncclRecv", submit_call(CallKind::kRecv, nullptr, recvbuff, count, datatype,
                                        ncclSum, peer, comm, stream));
}
EFCCL_ALIAS(ncclRecv)

// ---- Groups ----

EFCCL_API ncclResult_t ncclGroupStart() { return report("ncclGroupStart", efccl::runtime::group_start()); }
EFCCL_ALIAS(ncclGroupStart)

EFCCL_API ncclResult_t ncclGroupEnd() {
  DeviceGuard guard;
  return report("ncclGroupEnd", efccl::runtime::group_end());
}
EFCCL_ALIAS(ncclGroupEnd)

// ---- Memory ----

EFCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return report("ncclMemAlloc", ApiStatus::invalid_argument("ptr is NULL"));
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (cudaError_t e = cudaMalloc(ptr, size); e != cudaSuccess)
    return report("ncclMemAlloc", ApiStatus::cuda("cudaMalloc(" + std::to_string(size) +
                                                  "): " + cudaGetErrorString(e)));
  return ncclSuccess;
}
EFCCL_ALIAS(ncclMemAlloc)

EFCCL_API ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (cudaError_t e = cudaFree(ptr); e != cudaSuccess)
    return report("ncclMemFree", ApiStatus::cuda(std::string("cudaFree: ") + cudaGetErrorString(e)));
  return ncclSuccess;
}
EFCCL_ALIAS(ncclMemFree)

// ---- Registration (no-ops: every transfer copies through efccl's own FIFOs) ----

namespace {

void log_registration_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    EFCCL_INFO(efccl::kLogAlloc | efccl::kLogInit, -1,
               "ncclCommRegister / ncclCommWindowRegister are accepted as no-ops: efccl copies "
               "every transfer through its own FIFOs, so user buffers need no registration");
  });
}

ApiStatus add_registration(ncclComm_t comm, void* buff, size_t size, bool window, void** out) {
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
  log_registration_once();
  auto* h = new ncclWindow_vidmem();
  h->window = window;
  h->buff = buff;
  h->size = size;
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  comm->registrations.push_back(h);
  *out = h;
  return ApiStatus::ok();
}

ApiStatus remove_registration(ncclComm_t comm, void* handle, bool window) {
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
  const char* what = window ? "window" : "handle";
  if (handle == nullptr) return ApiStatus::invalid_argument(std::string(what) + " is NULL");
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  auto it = std::find(comm->registrations.begin(), comm->registrations.end(), handle);
  if (it == comm->registrations.end() || static_cast<ncclWindow_vidmem*>(*it)->window != window)
    return ApiStatus::invalid_argument(
        std::string(what) + " " + hex(handle) + " was not returned by " +
        (window ? "ncclCommWindowRegister" : "ncclCommRegister") +
        " on this communicator, or was deregistered already");
  delete static_cast<ncclWindow_vidmem*>(*it);
  comm->registrations.erase(it);
  return ApiStatus::ok();
}

}  // namespace

EFCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  const char* fn = "ncclCommRegister";
  if (handle == nullptr) return report(fn, ApiStatus::invalid_argument("handle is NULL"));
  *handle = nullptr;
  return report(fn, add_registration(comm, buff, size, false, handle));
}
EFCCL_ALIAS(ncclCommRegister)

EFCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return report("ncclCommDeregister", remove_registration(comm, handle, false));
}
EFCCL_ALIAS(ncclCommDeregister)

EFCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                              ncclWindow_t* win, int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  if (win == nullptr) return report(fn, ApiStatus::invalid_argument("win is NULL"));
  *win = nullptr;
  if ((winFlags & ~NCCL_WIN_COLL_SYMMETRIC) != 0)
    return report(fn, ApiStatus::invalid_argument("invalid winFlags " + std::to_string(winFlags) +
                                                  " (valid: NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC)"));
  void* h = nullptr;
  if (ApiStatus s = add_registration(comm, buff, size, true, &h); !s) return report(fn, s);
  *win = static_cast<ncclWindow_t>(h);
  return ncclSuccess;
}
EFCCL_ALIAS(ncclCommWindowRegister)

EFCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return report("ncclCommWindowDeregister", remove_registration(comm, win, true));
}
EFCCL_ALIAS(ncclCommWindowDeregister)

// ---- Split, shrink, revoke ----

EFCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  if (newcomm == nullptr) return report(fn, ApiStatus::invalid_argument("newcomm is NULL"));
  *newcomm = nullptr;
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report(fn, s);
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return report(fn, ApiStatus::invalid_argument("color " + std::to_string(color) +
                                                  " must be >= 0 or NCCL_SPLIT_NOCOLOR"));
  std::vector<int> all(static_cast<std::size_t>(comm->clique->nranks()));
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return finish(fn, regroup(fn, comm, all, color, key, newcomm, config));
}
EFCCL_ALIAS(ncclCommSplit)

EFCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  const char* fn = "ncclCommShrink";
  if (newcomm == nullptr) return report(fn, ApiStatus::invalid_argument("newcomm is NULL"));
  *newcomm = nullptr;
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report(fn, s);
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return report(fn, ApiStatus::invalid_argument("shrinkFlags " + std::to_string(shrinkFlags) +
                                                  " is not NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT"));
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
    return report(fn, ApiStatus::invalid_argument("excludeRanksList is NULL or excludeRanksCount < 0"));
  const int n = comm->clique->nranks();
  std::vector<bool> excluded(static_cast<std::size_t>(n), false);
  for (int i = 0; i < excludeRanksCount; ++i) {
    const int r = excludeRanksList[i];
    if (r < 0 || r >= n)
      return report(fn, ApiStatus::invalid_argument("excludeRanksList[" + std::to_string(i) + "] = " +
                                                    std::to_string(r) + " is not a rank of the communicator"));
    excluded[static_cast<std::size_t>(r)] = true;
  }
  if (excluded[static_cast<std::size_t>(comm->rank)])
    return report(fn, ApiStatus::invalid_argument("rank " + std::to_string(comm->rank) +
                                                  " excludes itself; excluded ranks do not call ncclCommShrink"));
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    // NCCL's stuck kernels would block the synchronization below too.
    if (ApiStatus s = efccl::runtime::revoke_fallback(comm); !s)
      EFCCL_WARN(comm->device, std::string(fn) + ": " + s.message());
    comm->clique->abort(comm->rank);
    DeviceGuard guard;
    cudaSetDevice(comm->device);
    (void)cudaDeviceSynchronize();  // the aborted kernels end within about a millisecond
  }
  std::vector<int> remaining;
  for (int r = 0; r < n; ++r)
    if (!excluded[static_cast<std::size_t>(r)]) remaining.push_back(r);
  return finish(fn, regroup(fn, comm, remaining, 0, comm->rank, newcomm, config));
}
EFCCL_ALIAS(ncclCommShrink)

EFCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  const char* fn = "ncclCommRevoke";
  if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return report(fn, s);
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return report(fn, ApiStatus::invalid_argument("revokeFlags must be NCCL_REVOKE_DEFAULT (0), got " +
                                                  std::to_string(revokeFlags)));
  // In-flight kernels give up; efccl waits for them here, so the communicator is quiescent
  // (ncclCommGetAsyncError: ncclSuccess) when this returns. Later operations are refused;
  // destroy, split and shrink remain allowed.
  comm->revoked.store(true);
  const ApiStatus real = efccl::runtime::revoke_fallback(comm);
  comm->clique->abort(comm->rank);
  DeviceGuard guard;
  cudaSetDevice(comm->device);
  (void)cudaDeviceSynchronize();
  (void)cudaGetLastError();
  return report(fn, real);
}
EFCCL_ALIAS(ncclCommRevoke)

EFCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  DeviceGuard guard;
  return report("ncclGroupSimulateEnd", efccl::runtime::group_simulate_end(simInfo));
}
EFCCL_ALIAS(ncclGroupSimulateEnd)
