#include "init_rank.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "clique.h"
#include "communicator.h"
#include "logger.h"
#include "registry.h"

namespace efccl::runtime {

/// The ranks that joined with one unique id, until their clique forms or fails.
/// Lock order: the registry mutex, then `mu`, then the live-communicator lock.
class Rendezvous {
 public:
  using Key = std::array<char, NCCL_UNIQUE_ID_BYTES>;
  enum class State { kCollecting, kBuilding, kFormed, kFailed };
  struct Member {
    int device = -1;
    std::string device_error;
    ncclComm* comm = nullptr;  ///< null once destroyed/aborted while building
  };

  Rendezvous(const Key& k, int n) : key(k), nranks(n) {}

  const Key key;
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  State state = State::kCollecting;  // below: under mu
  std::map<int, Member> members;     ///< by rank
  ApiStatus error;                   ///< kFailed: why
  ApiStatus cancelled;               ///< set while kBuilding: fail instead of attaching

  bool complete() const { return static_cast<int>(members.size()) == nranks; }
};

namespace {

constexpr uint64_t kDefaultInitTimeoutMs = 120000;
constexpr unsigned int kConfigMagic = 0xcafebeef;

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<Rendezvous::Key, std::shared_ptr<Rendezvous>>& registry() {
  static auto* m = new std::map<Rendezvous::Key, std::shared_ptr<Rendezvous>>();  // never destroyed
  return *m;
}

void erase_from_registry(const std::shared_ptr<Rendezvous>& r) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(r->key);
  if (it != registry().end() && it->second == r) registry().erase(it);
}

/// Fails the rendezvous and its communicators; `r->mu` held.
void fail_locked(Rendezvous& r, const ApiStatus& why) {
  r.state = Rendezvous::State::kFailed;
  r.error = why;
  for (auto& [rank, m] : r.members)
    if (m.comm != nullptr) fail_init(m.comm, why);
  r.cv.notify_all();
}

std::string missing_ranks(const Rendezvous& r) {
  std::ostringstream m;
  int shown = 0, missing = 0;
  for (int rank = 0; rank < r.nranks; ++rank) {
    if (r.members.count(rank) != 0) continue;
    ++missing;
    if (shown < 8) m << (shown++ == 0 ? "" : ", ") << rank;
  }
  if (missing > shown) m << ", ... (" << missing << " in all)";
  return m.str();
}

std::string pointer(const void* p) {
  std::ostringstream m;
  m << p;
  return m.str();
}

/// Builds the clique of a complete rendezvous (`lock` holds `r.mu`; released while CUDA works).
void build_locked(Rendezvous& r, std::unique_lock<std::mutex>& lock) {
  r.state = Rendezvous::State::kBuilding;
  std::vector<int> devices;
  ApiStatus status;
  for (const auto& [rank, m] : r.members) {
    devices.push_back(m.device);
    if (m.device < 0 && status)
      status = ApiStatus::cuda("rank " + std::to_string(rank) +
                               " had no current CUDA device when it called ncclCommInitRank (" +
                               m.device_error + ")");
  }
  std::shared_ptr<Clique> clique;
  if (status) {
    lock.unlock();
    auto created = Clique::create(devices, Registry::from_environment());
    lock.lock();
    if (created)
      clique = *created;
    else
      status = ApiStatus::cuda(created.status().message());
  }
  if (!r.cancelled) status = r.cancelled;
  if (!status) {
    fail_locked(r, status);
  } else {
    r.state = Rendezvous::State::kFormed;
    for (const auto& [rank, m] : r.members) {
      if (m.comm == nullptr) continue;
      attach_clique(m.comm, clique);
      EFCCL_INFO(kLogInit, m.device,
                 "comm " + pointer(m.comm) + " rank " + std::to_string(rank) + " nRanks " +
                     std::to_string(r.nranks) + " nNodes 1 cudaDev " + std::to_string(m.device) +
                     " - Init COMPLETE");
    }
    r.cv.notify_all();
  }
  lock.unlock();
  clique.reset();  // a clique nobody took is destroyed outside the lock
  lock.lock();
}

std::string describe_int(int v) {
  return v == NCCL_CONFIG_UNDEF_INT ? std::string("undefined") : std::to_string(v);
}

}  // namespace

std::chrono::milliseconds init_timeout() {
  uint64_t ms = kDefaultInitTimeoutMs;
  if (const char* v = std::getenv("EFCCL_INIT_TIMEOUT_MS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0' && parsed > 0 && parsed < (1ull << 40))
      ms = parsed;
    else
      EFCCL_WARN(-1, "EFCCL_INIT_TIMEOUT_MS=" + std::string(v) + " is not a positive number of "
                     "milliseconds; using " + std::to_string(kDefaultInitTimeoutMs));
  }
  return std::chrono::milliseconds(ms);
}

ApiStatus parse_config(const ncclConfig_t* config, CommConfig* out) {
  *out = CommConfig();
  if (config == nullptr) return ApiStatus::ok();
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0;
  c.version = 0;
  std::size_t size = 0;
  std::memcpy(&size, config, sizeof(size));
  std::memcpy(static_cast<void*>(&c), config, std::min(size, sizeof(ncclConfig_t)));
  if (c.magic != kConfigMagic) {
    std::ostringstream m;
    m << "ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x" << std::hex
      << c.magic << ", expected 0x" << kConfigMagic << ", from the first " << std::dec
      << std::min(size, sizeof(ncclConfig_t)) << " bytes its size field gives)";
    return ApiStatus::invalid_argument(m.str());
  }
  if (c.version < NCCL_VERSION(2, 14, 0))
    return ApiStatus::invalid_argument(
        "ncclConfig_t version " + std::to_string(c.version) +
        " is older than 2.14.0, the first NCCL with ncclConfig_t (initialize it with "
        "NCCL_CONFIG_INITIALIZER)");
  if (c.version < NCCL_VERSION(2, 17, 0)) {
    c.cgaClusterSize = defaults.cgaClusterSize;
    c.minCTAs = defaults.minCTAs;
    c.maxCTAs = defaults.maxCTAs;
    c.netName = defaults.netName;
  }
  if (c.version < NCCL_VERSION(2, 25, 0)) c.trafficClass = defaults.trafficClass;
  if (c.version < NCCL_VERSION(2, 27, 0)) {
    c.collnetEnable = defaults.collnetEnable;
    c.CTAPolicy = defaults.CTAPolicy;
    c.shrinkShare = defaults.shrinkShare;
    c.nvlsCTAs = defaults.nvlsCTAs;
  }
  if (c.version < NCCL_VERSION(2, 28, 0)) {
    c.nChannelsPerNetPeer = defaults.nChannelsPerNetPeer;
    c.nvlinkCentricSched = defaults.nvlinkCentricSched;
  }

  constexpr int kUndef = NCCL_CONFIG_UNDEF_INT;
  constexpr int kMaxChannels = 64;  // NCCL's MAXCHANNELS
  const auto bad = [](const char* field, int v, const char* valid) {
    return ApiStatus::invalid_argument("invalid ncclConfig_t " + std::string(field) + " " +
                                       std::to_string(v) + " (valid: " + valid +
                                       ", or NCCL_CONFIG_UNDEF_INT)");
  };
  const auto bool_ok = [](int v) { return v == kUndef || v == 0 || v == 1; };
  if (!bool_ok(c.blocking)) return bad("blocking", c.blocking, "0 or 1");
  if (c.cgaClusterSize != kUndef && c.cgaClusterSize < 0)
    return bad("cgaClusterSize", c.cgaClusterSize, ">= 0");
  if (c.minCTAs != kUndef && c.minCTAs <= 0) return bad("minCTAs", c.minCTAs, ">= 1");
  if (c.maxCTAs != kUndef && c.maxCTAs <= 0) return bad("maxCTAs", c.maxCTAs, ">= 1");
  if (c.minCTAs != kUndef && c.maxCTAs != kUndef && c.minCTAs > c.maxCTAs)
    return ApiStatus::invalid_argument("invalid ncclConfig_t minCTAs " + std::to_string(c.minCTAs) +
                                       " > maxCTAs " + std::to_string(c.maxCTAs));
  if (!bool_ok(c.splitShare)) return bad("splitShare", c.splitShare, "0 or 1");
  if (!bool_ok(c.collnetEnable)) return bad("collnetEnable", c.collnetEnable, "0 or 1");
  constexpr int kAllPolicies =
      NCCL_CTA_POLICY_DEFAULT | NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (c.CTAPolicy != kUndef && (c.CTAPolicy < 0 || c.CTAPolicy > kAllPolicies))
    return bad("CTAPolicy", c.CTAPolicy, "NCCL_CTA_POLICY_* flags");
  if (!bool_ok(c.shrinkShare)) return bad("shrinkShare", c.shrinkShare, "0 or 1");
  if (c.nvlsCTAs != kUndef && c.nvlsCTAs <= 0) return bad("nvlsCTAs", c.nvlsCTAs, ">= 1");
  if (c.nChannelsPerNetPeer != kUndef && (c.nChannelsPerNetPeer <= 0 || c.nChannelsPerNetPeer > kMaxChannels))
    return bad("nChannelsPerNetPeer", c.nChannelsPerNetPeer, "1..64");
  if (!bool_ok(c.nvlinkCentricSched)) return bad("nvlinkCentricSched", c.nvlinkCentricSched, "0 or 1");

  out->blocking = c.blocking != 0;  // undefined: blocking, as NCCL
  std::ostringstream hints;
  const auto hint = [&](const char* name, int v) {
    if (v != kUndef) hints << ' ' << name << '=' << describe_int(v);
  };
  hint("cgaClusterSize", c.cgaClusterSize);
  hint("minCTAs", c.minCTAs);
  hint("maxCTAs", c.maxCTAs);
  if (c.netName != nullptr) hints << " netName=" << c.netName;
  hint("splitShare", c.splitShare);
  hint("trafficClass", c.trafficClass);
  hint("collnetEnable", c.collnetEnable);
  hint("CTAPolicy", c.CTAPolicy);
  hint("shrinkShare", c.shrinkShare);
  hint("nvlsCTAs", c.nvlsCTAs);
  hint("nChannelsPerNetPeer", c.nChannelsPerNetPeer);
  hint("nvlinkCentricSched", c.nvlinkCentricSched);
  out->hints = hints.str();
  return ApiStatus::ok();
}

ApiStatus join_rendezvous(const ncclUniqueId& id, int nranks, int rank, int device,
                          const std::string& device_error, ncclComm* comm,
                          std::shared_ptr<Rendezvous>* out) {
  Rendezvous::Key key;
  std::memcpy(key.data(), id.internal, key.size());
  std::lock_guard<std::mutex> registry_lock(registry_mutex());
  std::shared_ptr<Rendezvous> r;
  if (auto it = registry().find(key); it != registry().end()) {
    std::lock_guard<std::mutex> lock(it->second->mu);
    if (it->second->state == Rendezvous::State::kCollecting && !it->second->complete())
      r = it->second;  // otherwise stale (failed): a new communicator with a reused id
  }
  if (r == nullptr) {
    r = std::make_shared<Rendezvous>(key, nranks);
    registry()[key] = r;
  }
  std::lock_guard<std::mutex> lock(r->mu);
  if (r->nranks != nranks)
    return ApiStatus::invalid_argument(
        "nranks " + std::to_string(nranks) + " differs from the nranks " +
        std::to_string(r->nranks) + " of the ranks that already joined with this unique id");
  if (r->members.count(rank) != 0)
    return ApiStatus::invalid_argument(
        "rank " + std::to_string(rank) + " already joined with this unique id (each rank of a "
        "communicator is initialized exactly once)");
  Rendezvous::Member m;
  m.device = device;
  m.device_error = device_error;
  m.comm = comm;
  r->members.emplace(rank, std::move(m));
  if (r->complete()) {
    registry().erase(key);  // nobody else may join it
    r->cv.notify_all();     // a waiting rank builds the clique
  }
  *out = r;
  return ApiStatus::ok();
}

ApiStatus complete_rendezvous(const std::shared_ptr<Rendezvous>& r,
                              std::chrono::steady_clock::time_point deadline,
                              std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(r->mu);
  for (;;) {
    switch (r->state) {
      case Rendezvous::State::kFormed:
        return ApiStatus::ok();
      case Rendezvous::State::kFailed:
        return r->error;
      case Rendezvous::State::kBuilding:
        // The builder only creates CUDA events; it waits on nobody, so this ends.
        r->cv.wait(lock);
        continue;
      case Rendezvous::State::kCollecting:
        break;
    }
    if (r->complete()) {
      build_locked(*r, lock);
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fail_locked(*r, ApiStatus::invalid_usage(
                          "only " + std::to_string(r->members.size()) + " of " +
                          std::to_string(r->nranks) +
                          " ranks of this unique id joined in this process within " +
                          std::to_string(timeout.count()) + " ms (EFCCL_INIT_TIMEOUT_MS; missing rank(s) " +
                          missing_ranks(*r) +
                          "); multi-process communicators are not supported yet (efccl issue 5)"));
      const ApiStatus error = r->error;
      lock.unlock();
      erase_from_registry(r);
      return error;
    }
    r->cv.wait_until(lock, deadline);
  }
}

void cancel_rendezvous(const std::shared_ptr<Rendezvous>& r, const ApiStatus& why) {
  std::unique_lock<std::mutex> lock(r->mu);
  if (r->state == Rendezvous::State::kCollecting) {
    fail_locked(*r, why);
    lock.unlock();
    erase_from_registry(r);
  } else if (r->state == Rendezvous::State::kBuilding && r->cancelled) {
    r->cancelled = why;
  }
}

void leave_rendezvous(ncclComm* comm, bool abort) {
  const std::shared_ptr<Rendezvous> r = comm->rendezvous;
  if (r == nullptr) return;
  std::unique_lock<std::mutex> lock(r->mu);
  auto it = r->members.find(comm->rank);
  if (it == r->members.end() || it->second.comm != comm) return;
  it->second.comm = nullptr;
  if (r->state != Rendezvous::State::kCollecting && r->state != Rendezvous::State::kBuilding)
    return;
  const ApiStatus why = ApiStatus::invalid_usage(
      "rank " + std::to_string(comm->rank) + "'s communicator was " +
      (abort ? "aborted" : "destroyed") + " before its clique formed");
  if (r->state == Rendezvous::State::kBuilding) {
    if (r->cancelled) r->cancelled = why;
    return;
  }
  fail_locked(*r, why);
  lock.unlock();
  erase_from_registry(r);
}

int joined_ranks(const ncclUniqueId& id) {
  Rendezvous::Key key;
  std::memcpy(key.data(), id.internal, key.size());
  std::lock_guard<std::mutex> registry_lock(registry_mutex());
  auto it = registry().find(key);
  if (it == registry().end()) return 0;
  std::lock_guard<std::mutex> lock(it->second->mu);
  return it->second->state == Rendezvous::State::kCollecting
             ? static_cast<int>(it->second->members.size())
             : 0;
}

}  // namespace efccl::runtime
