// The resident grids' host side: per device, the grid's memory and stream, the slots'
// contents and versions (resident_queue.h), posting, and the keeper thread that lets an idle grid
// leave the GPU (docs/device-executor.md, "The resident interpreter").
#include "resident_grid.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_raii.h"
#include "cuda_status.h"
#include "efccl/common/hash.h"
#include "efccl/common/log.h"
#include "resident_kernel.h"
#include "resident_queue.h"
#include "stream_memops.h"

namespace efccl::device {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a release waits for its grid to leave the GPU.
constexpr auto kStopWait = std::chrono::seconds(1);

/// The host's view of one slot.
struct Slot {
  bool valid = false;  ///< holds a content
  uint64_t hash = 0;
  uint32_t ncalls = 0, nranks = 0;
  uint32_t version = 0;  ///< of the content; what its doorbell writes
  uint32_t posted = 0;   ///< doorbells enqueued (compared with the grid's completions)
  uint64_t last_use = 0;
};

/// One device's grid.
struct Grid {
  int device = 0;
  bool checked = false;  ///< nctas and usable are known
  bool usable = false;
  uint32_t nctas = 0;
  bool allocated = false;
  DeviceBuffer state;                      ///< ResidentDeviceState
  std::unique_ptr<MappedHostBuffer> host;  ///< ResidentHostState
  cudaStream_t stream = nullptr;           ///< the grid's own (non-blocking)
  uint32_t generation = 0;
  bool running = false;  ///< launched and not told to stop
  uint32_t leases = 0;
  Clock::time_point last_post{};
  uint64_t tick = 0;
  Slot slots[kResidentSlots];

  ResidentDeviceState* device_state() const { return state.get<ResidentDeviceState>(); }
  ResidentHostState* host_state() const {
    return reinterpret_cast<ResidentHostState*>(host->get());
  }
  uint32_t completions(uint32_t s) const {
    return std::atomic_ref<uint32_t>(host_state()->completions[s]).load(std::memory_order_acquire);
  }
  /// Every doorbell enqueued so far has been run.
  bool drained() const {
    if (!allocated) return true;
    for (uint32_t s = 0; s < kResidentSlots; ++s)
      if (slots[s].posted != completions(s)) return false;
    return true;
  }
};

/// The process's grids. Never destroyed (a static destructor could run after the CUDA runtime's
/// own teardown); stop_at_exit, registered once CUDA is initialised, stops them instead.
struct Registry {
  std::mutex mu;
  std::atomic<bool> enabled{false};  ///< config.enabled, read without the lock
  ResidentConfig config;
  std::map<int, std::unique_ptr<Grid>> grids;
  ResidentStats stats;
  std::thread keeper;
  std::condition_variable wake;
  bool keeper_started = false;
  pid_t keeper_pid = 0;  ///< the process that started the keeper (a forked child has none)
  bool shutting_down = false;
  /// Whether the driver loads kernels lazily (asked once; see loads_lazily_locked).
  enum class Loading { kUnknown, kEager, kLazy } loading = Loading::kUnknown;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

Grid& grid_of(Registry& r, int device) {
  auto& g = r.grids[device];
  if (!g) {
    g = std::make_unique<Grid>();
    g->device = device;
  }
  return *g;
}

/// Tells a running grid to leave (it does within kStopCheckNs plus its current runs).
void stop_locked(Grid& g) {
  if (!g.running) return;
  std::atomic_ref<uint32_t>(g.host_state()->stop_generation)
      .store(g.generation, std::memory_order_release);
  g.running = false;
}

/// Waits until the grid's stream is idle (the grid left), at most `limit`.
bool wait_for_exit(int device, cudaStream_t stream, std::chrono::nanoseconds limit) {
  if (stream == nullptr) return true;
  DeviceScope scope(device);
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return e == cudaErrorCudartUnloading;  // the process is going: nothing left to wait for
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

/// Lets grids with nothing to do leave the GPU, so that cudaDeviceSynchronize and cudaFree
/// (which wait for every kernel) return.
void keep(Registry& r) {
  std::unique_lock<std::mutex> lock(r.mu);
  const auto any_running = [&r] {
    return std::any_of(r.grids.begin(), r.grids.end(),
                       [](const auto& entry) { return entry.second->running; });
  };
  while (!r.shutting_down) {
    if (!any_running()) {
      r.wake.wait(lock);  // until a launch (or the exit) notifies
      continue;
    }
    const auto period = std::clamp<std::chrono::microseconds>(
        r.config.idle / 2, std::chrono::microseconds(100), std::chrono::milliseconds(100));
    r.wake.wait_for(lock, period);
    const auto now = Clock::now();
    for (auto& [device, g] : r.grids)
      if (g->running && now - g->last_post >= r.config.idle && g->drained()) stop_locked(*g);
  }
}

/// At process exit (registered after CUDA's own teardown, so it runs first): stop every grid,
/// wait for them (bounded), end the keeper. Nothing is freed.
void stop_at_exit() {
  Registry& r = registry();
  if (getpid() != r.keeper_pid) return;  // a forked child: the grids and the keeper are not its
  std::vector<std::pair<int, cudaStream_t>> streams;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.shutting_down = true;
    for (auto& [device, g] : r.grids) {
      stop_locked(*g);
      if (g->allocated) streams.emplace_back(device, g->stream);
    }
  }
  r.wake.notify_all();
  if (r.keeper.joinable()) r.keeper.join();
  for (const auto& [device, stream] : streams) (void)wait_for_exit(device, stream, kStopWait);
}

/// Whether kernels load lazily in this process, asked once; warns once (naming the fix) when they
/// do. Under lazy loading the first use of any kernel, the application's included, may wait for
/// every kernel of the device to finish — and the grid finishes only once the doorbells already
/// enqueued have rung, which that wait can hold back: a hang (seen on H100 and H200 with CUDA
/// 13.0: a program's first cudaMemsetAsync never finished beside a running grid). The grid is
/// off then; CUDA_MODULE_LOADING=EAGER, set before CUDA starts, loads every kernel up front.
bool loads_lazily_locked(Registry& r) {
  if (r.loading == Registry::Loading::kUnknown) {
    auto lazy = lazy_module_loading();
    r.loading = lazy && !*lazy ? Registry::Loading::kEager : Registry::Loading::kLazy;
    if (!lazy)
      EFCCL_WARN(-1, "resident interpreter off (EFCCL_RESIDENT=1): cannot tell how CUDA loads "
                     "kernels (" + lazy.status().message() + "); calls are launched");
    else if (*lazy)
      EFCCL_WARN(-1, "resident interpreter off (EFCCL_RESIDENT=1): CUDA loads kernels lazily, and "
                     "loading one while the grid runs can wait for it forever; set "
                     "CUDA_MODULE_LOADING=EAGER in the environment before CUDA starts to use it; "
                     "calls are launched");
  }
  return r.loading != Registry::Loading::kEager;
}

/// Decides once (per grid, until it is next launched) how many CTAs it has.
void check_locked(Registry& r, Grid& g) {
  if (g.checked) return;
  g.checked = true;
  g.usable = false;
  if (loads_lazily_locked(r)) return;
  DeviceScope scope(g.device);
  int sm_count = 0, per_sm = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, g.device);
  // The grid's kernel is relocatable code without PTX: on a GPU of another architecture than
  // the build's (CMAKE_CUDA_ARCHITECTURES) it has no image (cudaErrorNoKernelImageForDevice).
  if (e == cudaSuccess) e = resident_blocks_per_sm(&per_sm);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    EFCCL_WARN(g.device, "resident interpreter: cannot use its kernel on device " +
                             std::to_string(g.device) + " (" + cudaGetErrorString(e) +
                             "); its calls are launched");
    return;
  }
  const auto fit = static_cast<uint32_t>(std::max(0, per_sm * sm_count));
  g.nctas = std::min({r.config.ctas, fit, kResidentMaxCtas});
  g.usable = g.nctas > 0;
}

Status allocate_locked(Grid& g) {
  if (g.allocated) return Status::ok();
  RelaxedCaptureMode relaxed;  // another thread may be capturing (global mode)
  DeviceScope scope(g.device);
  if (Status s = g.state.allocate(g.device, sizeof(ResidentDeviceState)); !s) return s;
  auto host = std::make_unique<MappedHostBuffer>();
  if (Status s = host->allocate(sizeof(ResidentHostState)); !s) return s;
  g.host = std::move(host);
  if (g.stream == nullptr)
    EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking),
                      "cudaStreamCreate (resident grid)");
  // Every CTA absent until it starts (ordered before the first launch on the same stream).
  EFCCL_CUDA_RETURN(
      cudaMemsetAsync(g.device_state()->inbox, 0xff, sizeof(g.device_state()->inbox), g.stream),
      "cudaMemsetAsync (resident inboxes)");
  for (Slot& s : g.slots) s = Slot{};
  g.allocated = true;
  return Status::ok();
}

Status launch_locked(Registry& r, Grid& g) {
  if (!r.keeper_started) {
    r.keeper_started = true;
    r.keeper_pid = getpid();
    std::atexit(stop_at_exit);
    r.keeper = std::thread([&r] { keep(r); });
  }
  DeviceScope scope(g.device);
  ResidentGridParams params{};
  params.device = g.device_state();
  params.host = g.host_state();
  params.generation = ++g.generation;
  if (params.generation == 0) params.generation = ++g.generation;  // 0 means "none"
  params.nctas = g.nctas;
  EFCCL_CUDA_RETURN(launch_resident_grid(params, g.stream),
                    "launching the resident grid on device " + std::to_string(g.device));
  if (r.stats.grid_launches == 0)
    EFCCL_INFO(kLogInit, g.device,
               "resident interpreter: grid of " + std::to_string(g.nctas) + " CTAs of " +
                   std::to_string(kResidentThreads) + " threads launched on device " +
                   std::to_string(g.device));
  ++r.stats.grid_launches;
  g.running = true;
  r.wake.notify_all();  // the keeper watches it from now on
  return Status::ok();
}

/// Whether any rank's input or output buffer is not memory of `device` (pinned or managed host
/// memory, another GPU's, or memory CUDA does not know): then the end of a run fences at system
/// scope (kDescriptorSystemFence). Asked once per new content.
bool buffers_beyond_device(int device, const RankCallArgs* ranks, uint32_t nranks) {
  for (uint32_t r = 0; r < nranks; ++r)
    for (const int b : {kBufferInput, kBufferOutput}) {
      const void* p = ranks[r].buffers[b];
      if (p == nullptr) continue;
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
      }
      if (attributes.type != cudaMemoryTypeDevice || attributes.device != device) return true;
    }
  return false;
}

/// The next content version: never idle (0) nor taken.
uint32_t next_version(uint32_t v) {
  ++v;
  if (v == kRequestIdle || v == kRequestTaken) v = 1;
  return v;
}

/// Gives up on the device's grid for good (logged once): its calls are launched from now on.
void disable_locked(Grid& g, const std::string& why) {
  if (g.usable)
    EFCCL_WARN(g.device, "resident interpreter off on device " + std::to_string(g.device) + ": " +
                             why + "; its calls are launched");
  g.usable = false;
}

/// Stops the device's grid once every doorbell it was given has run (its completion reaches
/// the host a moment after the stream goes on), waiting until `deadline`; an error, and nothing
/// stopped, if they have not run by then (stopping would leave their streams waiting forever).
/// `*stream`: the grid's stream, to wait for its exit.
Status stop_when_drained(Registry& r, int device, Clock::time_point deadline,
                         cudaStream_t* stream) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      Grid& g = grid_of(r, device);
      *stream = g.stream;
      if (!g.allocated) return Status::ok();
      if (!g.running || g.drained()) {
        stop_locked(g);
        g.checked = false;  // the next launch takes the CTA count configured then
        return Status::ok();
      }
    }
    if (Clock::now() >= deadline)
      return Status::error("the resident grid on device " + std::to_string(device) +
                           " still has posted calls to run after 1 s; it leaves once they have");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

void set_resident_config(const ResidentConfig& config) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.config = config;
  r.config.ctas = std::clamp<uint32_t>(config.ctas, 1, kResidentMaxCtas);
  if (r.config.idle.count() <= 0) r.config.idle = std::chrono::microseconds(1);
  r.enabled.store(config.enabled);
  for (auto& [device, g] : r.grids)
    if (!g->running) g->checked = false;  // the next launch takes the new CTA count
}

ResidentConfig resident_config() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.config;
}

void retain_resident(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ++grid_of(r, device).leases;
}

Status release_resident(int device) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    Grid& g = grid_of(r, device);
    if (g.leases > 0) --g.leases;
    if (g.leases > 0 || !g.allocated) return Status::ok();
  }
  const auto deadline = Clock::now() + kStopWait;
  cudaStream_t stream = nullptr;
  if (Status s = stop_when_drained(r, device, deadline, &stream); !s) return s;
  if (!wait_for_exit(device, stream, deadline - Clock::now())) {
    std::lock_guard<std::mutex> lock(r.mu);
    const Grid& g = grid_of(r, device);
    if (g.leases > 0 || g.running) return Status::ok();  // taken up again meanwhile
    return Status::error("the resident grid on device " + std::to_string(device) +
                         " did not leave the GPU within 1 s (a run it holds still waits; it "
                         "leaves when that run ends)");
  }
  // Free it unless it was taken up again meanwhile, or a posted call has not run yet. The
  // frees happen outside the lock (cudaFree waits for the device).
  DeviceBuffer state;
  std::unique_ptr<MappedHostBuffer> host;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    Grid& g = grid_of(r, device);
    if (g.leases > 0 || g.running || !g.allocated || !g.drained()) return Status::ok();
    state = std::move(g.state);
    host = std::move(g.host);
    g.allocated = false;
    g.checked = false;
  }
  return Status::ok();
}

Status quiesce_resident(int device) {
  Registry& r = registry();
  const auto deadline = Clock::now() + kStopWait;
  cudaStream_t stream = nullptr;
  if (Status s = stop_when_drained(r, device, deadline, &stream); !s) return s;
  if (!wait_for_exit(device, stream, deadline - Clock::now()))
    return Status::error("the resident grid on device " + std::to_string(device) +
                         " did not leave the GPU within 1 s");
  return Status::ok();
}

ResidentStats resident_stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.stats;
}

bool resident_running(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.grids.find(device);
  return it != r.grids.end() && it->second->running;
}

uint32_t resident_capacity(int device) {
  Registry& r = registry();
  if (!r.enabled.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.config.enabled) return 0;
  Grid& g = grid_of(r, device);
  if (!g.running) check_locked(r, g);
  return g.usable ? g.nctas : 0;
}

bool resident_loading_allows() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return !loads_lazily_locked(r);
}

int resident_reserved_sms(int device, int sm_count) {
  (void)device;
  Registry& r = registry();
  if (!r.enabled.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.config.enabled || loads_lazily_locked(r)) return 0;
  return std::clamp(static_cast<int>(r.config.ctas), 0, std::max(0, sm_count - 1));
}

StatusOr<bool> post_resident(int device, cudaStream_t stream, const FusedCall* calls,
                             uint32_t ncalls, const RankCallArgs* ranks, uint32_t nranks,
                             uint32_t nctas, int dtype, int reduction) {
  Registry& r = registry();
  if (!r.enabled.load(std::memory_order_relaxed)) return false;
  if (ncalls == 0 || ncalls > static_cast<uint32_t>(kMaxFusedCalls) ||
      nranks > static_cast<uint32_t>(kMaxFusedRanks) || nctas == 0)
    return false;
  // The content: header, calls, ranks (value-initialised structs, so no stray padding bytes).
  ResidentDescriptor header{};
  header.ncalls = ncalls;
  header.nranks = nranks;
  header.nctas = nctas;
  header.dtype = dtype;
  header.reduction = reduction;
  const std::string_view header_bytes(reinterpret_cast<const char*>(&header),
                                      kResidentHeaderKeyBytes);
  const std::string_view call_bytes(reinterpret_cast<const char*>(calls),
                                    ncalls * sizeof(FusedCall));
  const std::string_view rank_bytes(reinterpret_cast<const char*>(ranks),
                                    nranks * sizeof(RankCallArgs));
  const uint64_t hash = mix64(fnv1a(rank_bytes, fnv1a(call_bytes, fnv1a(header_bytes))));

  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.config.enabled || r.shutting_down) return false;
  Grid& g = grid_of(r, device);
  if (!g.running) check_locked(r, g);
  if (!g.usable || nctas > g.nctas) return false;
  if (Status s = allocate_locked(g); !s) {
    disable_locked(g, s.message());
    return false;
  }
  ResidentHostState* host = g.host_state();
  const auto same = [&](uint32_t s) {
    const Slot& slot = g.slots[s];
    if (!slot.valid || slot.hash != hash || slot.ncalls != ncalls || slot.nranks != nranks)
      return false;
    const ResidentDescriptor& d = host->descriptors[s];
    return std::memcmp(&d, header_bytes.data(), header_bytes.size()) == 0 &&
           std::memcmp(d.calls, calls, call_bytes.size()) == 0 &&
           std::memcmp(d.ranks, ranks, rank_bytes.size()) == 0;
  };
  uint32_t chosen = kResidentSlots;
  for (uint32_t s = 0; s < kResidentSlots && chosen == kResidentSlots; ++s)
    if (same(s)) chosen = s;
  if (chosen == kResidentSlots) {
    // A new content: an empty slot, else the least recently used one with no run in flight.
    for (uint32_t s = 0; s < kResidentSlots; ++s) {
      const Slot& slot = g.slots[s];
      if (!slot.valid) {
        chosen = s;
        break;
      }
      if (slot.posted != g.completions(s)) continue;
      if (chosen == kResidentSlots || slot.last_use < g.slots[chosen].last_use) chosen = s;
    }
    if (chosen == kResidentSlots) {
      ++r.stats.no_slot;
      return false;
    }
    ResidentDescriptor& d = host->descriptors[chosen];
    header.flags = buffers_beyond_device(device, ranks, nranks) ? kDescriptorSystemFence : 0;
    std::memcpy(&d, &header, kResidentCallsOffset);
    std::memcpy(d.calls, calls, call_bytes.size());
    std::memcpy(d.ranks, ranks, rank_bytes.size());
    std::atomic_thread_fence(std::memory_order_release);  // before the doorbell is enqueued
    Slot& slot = g.slots[chosen];
    slot.valid = true;
    slot.hash = hash;
    slot.ncalls = ncalls;
    slot.nranks = nranks;
    slot.version = next_version(slot.version);
    ++r.stats.new_contents;
  }
  if (!g.running) {
    if (Status s = launch_locked(r, g); !s) {
      disable_locked(g, s.message());
      return false;
    }
  }
  Slot& slot = g.slots[chosen];
  DeviceScope scope(device);
  if (Status s =
          write_then_wait(stream, &g.device_state()->request[chosen], slot.version, kRequestIdle);
      !s) {
    (void)cudaGetLastError();
    disable_locked(g, s.message());
    return false;
  }
  ++slot.posted;
  slot.last_use = ++g.tick;
  g.last_post = Clock::now();
  ++r.stats.posts;
  return true;
}

}  // namespace efccl::device
