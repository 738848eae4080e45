// DeviceExecutor: creation (validation, tables, connections), errors, abort and reset. Launches
// are in launch.cc, batches in batch.cc, executor-owned memory in owned_memory.cc.
#include "efccl/device/device_executor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "arena_sharing.h"
#include "cuda_status.h"
#include "efccl/common/log.h"
#include "device_executor_impl.h"
#include "efccl/ef/premul_analysis.h"
#include "peer_access.h"
#include "program_tables.h"
#include "resident_grid.h"
#include "wire_format_choice.h"

namespace efccl::device {
namespace {

static_assert(sizeof(KernelParams) <= 4096, "kernel parameters must fit the classic 4 KiB limit");
static_assert(std::is_trivially_copyable_v<SendConnectionDeviceHandle> &&
                  std::is_trivially_copyable_v<RecvConnectionDeviceHandle> &&
                  std::is_trivially_copyable_v<WaitBound>,
              "device handles are kernel arguments and table entries");

/// Error records start after the stop signals, each on its own cache line.
constexpr std::size_t kRecordsOffset = 64;
static_assert(sizeof(StopSignals) <= kRecordsOffset);

}  // namespace

StopSignals* DeviceExecutor::Impl::signals() const {
  return reinterpret_cast<StopSignals*>(host_mapped.get());
}

ErrorRecord* DeviceExecutor::Impl::record(std::size_t device_index) const {
  return reinterpret_cast<ErrorRecord*>(host_mapped.get() + kRecordsOffset) + device_index;
}

// ---------------------------------------------------------------------------------------------
// Construction

StatusOr<std::unique_ptr<DeviceExecutor>> DeviceExecutor::create(const ef::Program& program,
                                                                 std::vector<int> rank_devices,
                                                                 const ExecutorConfig& config,
                                                                 const PeerProcesses* peers) {
  // Creation may happen while the caller captures a graph (a call first seen in a capture);
  // also covers the cleanup of a failed creation, which runs before this guard goes.
  RelaxedCaptureMode relaxed;
  if (program.nranks <= 0 || static_cast<std::size_t>(program.nranks) != program.ranks.size())
    return Status::error("program has no ranks (nranks " + std::to_string(program.nranks) + ")");
  if (rank_devices.size() != program.ranks.size())
    return Status::error("rank_devices has " + std::to_string(rank_devices.size()) +
                         " entries; the program has " + std::to_string(program.nranks) + " ranks");
  if (config.slot_bytes > (std::size_t{1} << 30))
    return Status::error("slot_bytes must be at most 1 GiB (0: the protocol's default), got " +
                         std::to_string(config.slot_bytes));
  if (config.connection_slots < 1 || config.connection_slots > 1024)
    return Status::error("connection_slots must be in [1, 1024], got " +
                         std::to_string(config.connection_slots));
  if (config.slot_devices.size() != static_cast<std::size_t>(std::max(program.slot_devices, 0)))
    return Status::error("the program names " + std::to_string(program.slot_devices) +
                         " slot devices; ExecutorConfig::slot_devices gives " +
                         std::to_string(config.slot_devices.size()) + " CUDA devices");
  if (config.max_threads_per_block < 64 || config.max_threads_per_block > kMaxThreadsPerBlock ||
      config.max_threads_per_block % 32 != 0)
    return Status::error("max_threads_per_block must be a multiple of 32 in [64, " +
                         std::to_string(kMaxThreadsPerBlock) + "], got " +
                         std::to_string(config.max_threads_per_block));

  ef::ValidateOptions vo;
  vo.connection_slots = config.connection_slots;
  std::string problems;
  for (const auto& d : ef::validate(program, vo)) {
    if (config.allow_blocking_programs && (d.rule == "deadlock" || d.rule == "capacity")) continue;
    problems += "\n  " + d.to_string();
  }
  if (!problems.empty()) return Status::error("program is not valid:" + problems);

  const std::size_t n = rank_devices.size();
  if (peers != nullptr) {
    if (peers->local.size() != n || peers->location.size() != n)
      return Status::error("PeerProcesses needs one local flag and one location per rank (" +
                           std::to_string(n) + ")");
    if (std::none_of(peers->local.begin(), peers->local.end(), [](bool b) { return b; }))
      return Status::error("PeerProcesses: no rank of the program runs in this process");
    if (!peers->exchange) return Status::error("PeerProcesses: no exchange function");
    if (!peers->hosts.empty() && peers->hosts.size() != n)
      return Status::error("PeerProcesses needs no host or one host per rank (" +
                           std::to_string(n) + "), got " + std::to_string(peers->hosts.size()));
  }
  const auto is_local = [&](std::size_t r) { return peers == nullptr || peers->local[r]; };
  int ndevices = 0;
  EFCCL_CUDA_RETURN(cudaGetDeviceCount(&ndevices), "cudaGetDeviceCount");
  for (std::size_t r = 0; r < n; ++r)
    if (is_local(r) && (rank_devices[r] < 0 || rank_devices[r] >= ndevices))
      return Status::error("rank " + std::to_string(r) + " is mapped to device " +
                           std::to_string(rank_devices[r]) + "; " + std::to_string(ndevices) +
                           " CUDA devices are visible");

  auto impl = std::make_unique<Impl>();
  impl->program = program;
  impl->rank_devices = std::move(rank_devices);
  impl->config = config;
  impl->local_rank.assign(n, true);
  impl->location.assign(impl->rank_devices.begin(), impl->rank_devices.end());
  if (peers != nullptr) {
    impl->multiprocess = true;
    impl->local_rank = peers->local;
    impl->location = peers->location;
    impl->fingerprint = peers->fingerprint;
    impl->exchange = peers->exchange;
    impl->hosts = peers->hosts;
    impl->connect_network = peers->connect_network;
    if (peers->gpus.size() == n) impl->gpus = peers->gpus;
    impl->direct_between_processes = peers->direct;
    impl->translate = peers->translate;
    for (std::size_t r = 0; r < n; ++r)
      if (!impl->local_rank[r]) impl->rank_devices[r] = -1;
    // Two local ranks share a location exactly when they share a device.
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (impl->local_rank[a] && impl->local_rank[b] &&
            (impl->location[a] == impl->location[b]) !=
                (impl->rank_devices[a] == impl->rank_devices[b]))
          return Status::error("PeerProcesses: local ranks " + std::to_string(a) + " and " +
                               std::to_string(b) +
                               " must share a location exactly when they share a GPU");
    // A location belongs to one process: local and remote ranks never share one.
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (impl->local_rank[a] && !impl->local_rank[b] && impl->location[a] == impl->location[b])
          return Status::error("PeerProcesses: rank " + std::to_string(a) + " (this process) and " +
                               "rank " + std::to_string(b) + " (another) have the same location");
  }
  if (Status s = impl->build(); !s) return s;
  return std::unique_ptr<DeviceExecutor>(new DeviceExecutor(std::move(impl)));
}

DeviceExecutor::DeviceExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceExecutor::~DeviceExecutor() {
  // An executor may be destroyed (evicted) while this or another thread captures a CUDA graph
  // on an unrelated stream: as NCCL does around its frees, wait and free in relaxed capture
  // mode, and wait for this executor's own last launch per device (every earlier eager launch
  // is ordered before it) rather than the whole device, whose capturing streams must not be
  // synchronised. Graph replays are over before the graph's pin lets an executor go. A stuck
  // launch ends by its own timeout.
  RelaxedCaptureMode relaxed;
  for (LocalDevice& local : impl_->locals) {
    if (!local.launched_before) continue;
    DeviceScope scope(local.device);
    if (auto event = local.last_launch->get(local.device); event) cudaEventSynchronize(*event);
  }
  impl_.reset();  // the frees, still in relaxed mode
}

const std::vector<int>& DeviceExecutor::devices() const { return impl_->devices; }
const ef::Program& DeviceExecutor::program() const { return impl_->program; }

std::size_t default_slot_bytes(ef::Protocol protocol) {
  switch (protocol) {
    case ef::Protocol::kLL:
      return std::size_t{32} << 10;
    case ef::Protocol::kLL128:
      return std::size_t{120} << 10;
    case ef::Protocol::kSimple:
      break;
  }
  return std::size_t{512} << 10;
}

Status DeviceExecutor::Impl::build() {
  const ef::Program& p = program;
  const int n = p.nranks;
  for (int r = 0; r < n; ++r)
    if (local_rank[r]) devices.push_back(rank_devices[r]);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  locals.resize(devices.size());
  rank_local_device.assign(n, -1);  // -1: another process runs the rank
  rank_local_index.assign(n, -1);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    locals[i].device = devices[i];
    EFCCL_CUDA_RETURN(
        cudaDeviceGetAttribute(&locals[i].sm_count, cudaDevAttrMultiProcessorCount, devices[i]),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
    // Launched grids must be co-resident beside the resident grid, which never yields its SMs.
    locals[i].sm_count -= resident_reserved_sms(devices[i], locals[i].sm_count);
  }
  for (int r = 0; r < n; ++r) {
    if (!local_rank[r]) continue;
    const auto d =
        std::lower_bound(devices.begin(), devices.end(), rank_devices[r]) - devices.begin();
    rank_local_device[r] = static_cast<int>(d);
    rank_local_index[r] = static_cast<int>(locals[d].ranks.size());
    locals[d].ranks.push_back(r);
  }
  for (const auto& local : locals)
    if (local.ranks.size() > static_cast<std::size_t>(kMaxLocalRanks))
      return Status::error("device " + std::to_string(local.device) + " serves " +
                           std::to_string(local.ranks.size()) +
                           " ranks; one launch serves at most " + std::to_string(kMaxLocalRanks));

  auto planned = plan_connections(p);
  if (!planned) return planned.status();
  connections = std::move(*planned);
  if (Status s = mark_network_connections(connections, hosts, local_rank); !s) return s;
  for (const ConnectionPlan& c : connections) {
    if (!c.network || !(local_rank[c.sender] || local_rank[c.receiver])) continue;
    ++network_ends;
    if (!connect_network)
      return Status::error("connection " + std::to_string(c.sender) + "->" +
                           std::to_string(c.receiver) + " ch " + std::to_string(c.channel) +
                           " joins two hosts, and PeerProcesses has no connect_network");
  }
  if (network_ends > 0 && config.first_position != 0)
    return Status::error(
        "ExecutorConfig::first_position must be 0 with network connections "
        "(their proxies count from 0)");
  if (Status s = check_slot_devices(); !s) return s;
  if (Status s = enable_peer_access_between_connected_devices(); !s) return s;
  auto note = choose_wire_formats(p, local_rank, rank_devices, connections);
  if (!note) return note.status();
  protocol_note = std::move(*note);

  // Connection memory: every connection gets the same slot stride, so that every process of a
  // multi-process executor derives the same layout.
  slot_bytes = config.slot_bytes != 0 ? config.slot_bytes : default_slot_bytes(p.protocol);
  flagged = p.protocol != ef::Protocol::kSimple;
  auto layout = lay_out_connections(
      connections, location,
      connection_slot_stride(p.protocol, slot_bytes, connections, multiprocess),
      config.connection_slots);
  if (!layout) return layout.status();
  std::vector<int64_t> device_locations;
  for (const LocalDevice& local : locals) device_locations.push_back(location[local.ranks.front()]);
  if (Status s = arena.allocate(*layout, devices, device_locations, config.slot_devices); !s)
    return s;
  if (Status s = arena.write_first_positions(config.first_position, connections, location,
                                             local_rank);
      !s)
    return s;
  if (multiprocess) {
    ArenaSharing sharing;
    sharing.program = &program;
    sharing.connections = &connections;
    sharing.local = &local_rank;
    sharing.location = &location;
    sharing.rank_devices = &rank_devices;
    sharing.fingerprint = fingerprint;
    sharing.exchange = exchange;
    if (Status s = share_arenas(arena, sharing); !s) return s;
    if (Status s = connect_network_ends(); !s) return s;
    if (Status s = plan_meetings(); !s) return s;
  }

  // Host-mapped stop signals and error records.
  if (Status s = host_mapped.allocate(kRecordsOffset + locals.size() * sizeof(ErrorRecord)); !s)
    return s;

  // premul flags for the modes the program allows.
  std::optional<ef::PremulMap> outofplace_map, inplace_map;
  if (p.outofplace) outofplace_map = ef::analyze_premul(p, /*inplace=*/false);
  if (p.inplace) inplace_map = ef::analyze_premul(p, /*inplace=*/true);
  if (outofplace_map) premul_mixed[0] = ef::describe_mixed_operand(p, *outofplace_map, false);
  if (inplace_map) premul_mixed[1] = ef::describe_mixed_operand(p, *inplace_map, true);

  for (LocalDevice& local : locals) {
    if (Status s = build_device(local, outofplace_map ? &*outofplace_map : nullptr,
                                inplace_map ? &*inplace_map : nullptr);
        !s)
      return s;
    local.private_memory.resize(local.ranks.size());
  }
  return Status::ok();
}

/// The slot devices of the connections this process's ranks receive (their memory is allocated
/// here) must be GPUs this process sees.
Status DeviceExecutor::Impl::check_slot_devices() const {
  int ndevices = 0;
  EFCCL_CUDA_RETURN(cudaGetDeviceCount(&ndevices), "cudaGetDeviceCount");
  for (const ConnectionPlan& c : connections) {
    if (c.placement != ef::SlotLocation::kDevice || !local_rank[c.receiver]) continue;
    const int d = config.slot_devices[static_cast<std::size_t>(c.slot_device)];
    if (d < 0 || d >= ndevices)
      return Status::error(
          "slot device " + std::to_string(c.slot_device) + " is CUDA device " + std::to_string(d) +
          ", which this process does not see (" + std::to_string(ndevices) +
          " visible); it holds the slots of connection " + std::to_string(c.sender) + "->" +
          std::to_string(c.receiver) + " ch " + std::to_string(c.channel) +
          ", which the receiver's process allocates (ExecutorConfig::slot_devices)");
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::connect_network_ends() {
  if (network_ends == 0) return Status::ok();
  std::vector<NetworkEndRequest> requests;
  std::vector<const ConnectionPlan*> of;
  for (const ConnectionPlan& c : connections) {
    if (!c.network || !(local_rank[c.sender] || local_rank[c.receiver])) continue;
    NetworkEndRequest r;
    r.sender = c.sender;
    r.receiver = c.receiver;
    r.channel = c.channel;
    r.send = local_rank[c.sender];
    r.nslots = arena.layout().nslots;
    r.slot_bytes = arena.layout().slot_stride;
    requests.push_back(r);
    of.push_back(&c);
  }
  StatusOr<NetworkEnds> got = connect_network(requests);
  if (!got)
    return Status::error("connecting the " + std::to_string(requests.size()) +
                         " network connection end(s) of this process: " + got.status().message());
  if (got->ends.size() != requests.size())
    return Status::error("internal: the runtime returned " + std::to_string(got->ends.size()) +
                         " network ends for " + std::to_string(requests.size()) + " requests");
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (got->ends[i].device == nullptr)
      return Status::error("internal: the runtime returned no memory for network end " +
                           std::to_string(i));
    arena.add_network_end(*of[i], got->ends[i]);
  }
  network = std::move(got->owner);
  return Status::ok();
}

/// Peer access for the connections of this process's devices: both ways between the devices of
/// a connection at the receiver (the sender writes slots and tail into the receiver's memory,
/// the receiver writes head into the sender's); from each device of a connection on a slot
/// device to that device (both ends read and write its memory). Host memory needs none. (Other
/// processes' GPUs: share_arenas.)
Status DeviceExecutor::Impl::enable_peer_access_between_connected_devices() {
  // (from, to) -> why, for the error.
  std::map<std::pair<int, int>, std::string> accesses;
  for (const auto& c : connections) {
    const std::string name = "connection " + std::to_string(c.sender) + "->" +
                             std::to_string(c.receiver) + " ch " + std::to_string(c.channel);
    if (c.placement == ef::SlotLocation::kReceiver) {
      if (!local_rank[c.sender] || !local_rank[c.receiver]) continue;
      const int a = rank_devices[c.sender], b = rank_devices[c.receiver];
      if (a == b) continue;
      accesses.emplace(std::pair{a, b}, name + " (sender to receiver)");
      accesses.emplace(std::pair{b, a}, name + " (receiver to sender)");
    } else if (c.placement == ef::SlotLocation::kDevice && local_rank[c.receiver]) {
      // A remote sender maps the slot device's memory itself (share_arenas).
      const int slot = config.slot_devices[static_cast<std::size_t>(c.slot_device)];
      for (const int rank : {c.sender, c.receiver}) {
        if (!local_rank[rank] || rank_devices[rank] == slot) continue;
        accesses.emplace(std::pair{rank_devices[rank], slot},
                         name + " (rank " + std::to_string(rank) + " to slot device " +
                             std::to_string(c.slot_device) + ")");
      }
    }
  }
  for (const auto& [pair, why] : accesses) {
    const auto [from, to] = pair;
    int can = 0;
    EFCCL_CUDA_RETURN(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
    if (can == 0)
      return Status::error("device " + std::to_string(from) + " cannot access device " +
                           std::to_string(to) + " directly (no peer access), which " + why +
                           " needs; a connection between GPUs without peer access can be "
                           "placed in pinned host memory (ef::SlotLocation::kHost)");
    if (Status s = enable_peer_access(from, to); !s) return s;
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::plan_meetings() {
  if (!direct_between_processes || gpus.empty()) return Status::ok();
  for (LocalDevice& local : locals) {
    std::string why;
    XprocPlan plan = plan_xproc(program, local.ranks, location, gpus, connections, &why);
    if (!why.empty())
      EFCCL_INFO(kLogColl, local.device,
                 "program '" + program.name + "': ranks of other processes share GPU " +
                     std::to_string(local.device) + ", but they move data through the " +
                     "connections' slots: " + why);
    if (!plan.enabled) continue;
    const int64_t mine = location[static_cast<std::size_t>(local.ranks.front())];
    plan.mine = arena.board(mine, local.device);
    for (int64_t loc : plan.locations) plan.remote.push_back(arena.board(loc, local.device));
    if (plan.mine == nullptr ||
        std::find(plan.remote.begin(), plan.remote.end(), nullptr) != plan.remote.end())
      return Status::error("internal: a board of the processes sharing GPU " +
                           std::to_string(local.device) + " is not mapped");
    local.xproc = std::move(plan);
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::build_device(LocalDevice& local, const ef::PremulMap* outofplace,
                                          const ef::PremulMap* inplace) {
  const int index = static_cast<int>(&local - locals.data());
  // Connection handle tables, and each threadblock's entries in them.
  std::vector<SendConnectionDeviceHandle> sends;
  std::vector<RecvConnectionDeviceHandle> recvs;
  ConnectionIndex send_of, recv_of;  // (rank, tb) -> table index
  for (const auto& c : connections) {
    if (rank_local_device[c.sender] == index) {
      auto handle = arena.send_handle(c, location, local.device);
      if (!handle) return handle.status();
      send_of[{c.sender, c.send_tb}] = static_cast<int>(sends.size());
      sends.push_back(*handle);
    }
    if (rank_local_device[c.receiver] == index) {
      auto handle = arena.recv_handle(c, location, local.device);
      if (!handle) return handle.status();
      recv_of[{c.receiver, c.recv_tb}] = static_cast<int>(recvs.size());
      recvs.push_back(*handle);
    }
  }
  auto tables = build_program_tables(program, local.ranks, send_of, recv_of, outofplace, inplace,
                                     local.xproc.remote_ranks);
  if (!tables)
    return Status::error("device " + std::to_string(local.device) + ": " +
                         tables.status().message());
  local.nblocks = static_cast<uint32_t>(tables->threadblocks.size());
  local.gpu_nblocks = local.nblocks;
  if (!gpus.empty() && !gpus[static_cast<std::size_t>(local.ranks.front())].empty()) {
    // Ranks of other processes on this GPU run the same program in launches of their own.
    const std::string& gpu = gpus[static_cast<std::size_t>(local.ranks.front())];
    for (std::size_t r = 0; r < gpus.size(); ++r)
      if (!local_rank[r] && gpus[r] == gpu)
        local.gpu_nblocks += static_cast<uint32_t>(program.ranks[r].threadblocks.size());
  }
  local.ndivide_segments = static_cast<uint32_t>(tables->divide_segments.size());
  local.largest_divide_chunks = tables->largest_divide_chunks;
  local.multi_ops = !tables->operands.empty();
  for (const OpDesc& op : tables->ops) {
    if ((op.direct >> kDirectShiftOutOfPlace) & 15) ++local.direct_ops[0];
    if ((op.direct >> kDirectShiftInPlace) & 15) ++local.direct_ops[1];
  }

  const int d = local.device;
  if (Status s = local.divide_segments.upload(d, tables->divide_segments); !s) return s;
  if (Status s = local.threadblocks.upload(d, tables->threadblocks); !s) return s;
  if (Status s = local.ops.upload(d, tables->ops); !s) return s;
  if (Status s = local.deps.upload(d, tables->deps); !s) return s;
  if (Status s = local.operands.upload(d, tables->operands); !s) return s;
  if (Status s = local.sends.upload(d, sends); !s) return s;
  if (Status s = local.recvs.upload(d, recvs); !s) return s;
  if (Status s = local.flags.allocate(d, tables->nflags * sizeof(uint64_t)); !s) return s;
  if (Status s = local.state.allocate(d, sizeof(LaunchState)); !s) return s;
  if (Status s = local.epochs.allocate(d, tables->threadblocks.size() * sizeof(uint64_t)); !s)
    return s;
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Errors, abort, reset

std::string DeviceExecutor::Impl::describe(std::size_t device_index, const ErrorRecord& e) const {
  std::ostringstream o;
  std::string op_name = "?";
  if (e.rank >= 0 && e.rank < program.nranks) {
    const auto& tbs = program.ranks[e.rank].threadblocks;
    if (e.tb >= 0 && static_cast<std::size_t>(e.tb) < tbs.size() && e.op >= 0 &&
        static_cast<std::size_t>(e.op) < tbs[e.tb].ops.size())
      op_name = std::string(ef::to_string(tbs[e.tb].ops[e.op].code));
  }
  if (e.kind == kErrorSkipped) {
    o << "skipped: rank " << e.rank << " threadblock " << e.tb << " on device "
      << devices[device_index]
      << " did not run, because an earlier call of the same fused launch failed on its CTA";
    return o.str();
  }
  o << (e.kind == kErrorAborted ? "aborted" : "timed out") << ": rank " << e.rank << " threadblock "
    << e.tb << " op " << e.op << " (" << op_name << ") iteration " << e.iteration << " on device "
    << devices[device_index] << " waited " << e.waited_ns / 1000000 << " ms for ";
  switch (e.wait) {
    case kWaitData:
      o << "data on connection " << e.peer << "->" << e.rank << " ch " << e.channel;
      break;
    case kWaitSlot:
      o << "a free slot on connection " << e.rank << "->" << e.peer << " ch " << e.channel;
      break;
    case kWaitDependency:
      o << "dependency tb " << e.peer << " op " << e.channel;
      break;
    case kWaitProcessStart:
      o << "the launch of another process on its GPU (slot " << e.peer
        << ") to start this call (direct transfers between processes meet there; without MPS "
           "the processes' kernels take turns on the GPU)";
      break;
    case kWaitProcessEnd:
      o << "the launch of another process on its GPU (slot " << e.peer << ") to end this call";
      break;
    default:
      o << "nothing";
  }
  return o.str();
}

Status DeviceExecutor::error_status() const {
  const Impl& m = *impl_;
  const ErrorRecord* first = nullptr;
  std::size_t first_device = 0;
  for (std::size_t i = 0; i < m.locals.size(); ++i) {
    ErrorRecord* e = m.record(i);
    if (std::atomic_ref<uint32_t>(e->posted).load(std::memory_order_acquire) == 0) continue;
    if (first == nullptr || e->timestamp_ns < first->timestamp_ns) {
      first = e;
      first_device = i;
    }
  }
  if (first != nullptr) return Status::error(m.describe(first_device, *first));
  if (std::atomic_ref<uint32_t>(m.signals()->abort).load(std::memory_order_acquire) != 0)
    return Status::error("aborted");
  return Status::ok();
}

std::size_t DeviceExecutor::slot_bytes() const { return impl_->slot_bytes; }
std::size_t DeviceExecutor::connection_bytes() const { return impl_->arena.most_bytes(); }
const std::string& DeviceExecutor::protocol_note() const { return impl_->protocol_note; }
std::size_t DeviceExecutor::network_ends() const { return impl_->network_ends; }

std::size_t DeviceExecutor::direct_ops(bool inplace) const {
  std::size_t n = 0;
  for (const LocalDevice& local : impl_->locals) n += local.direct_ops[inplace ? 1 : 0];
  return n;
}

Status DeviceExecutor::wait_launches() {
  for (LocalDevice& local : impl_->locals) {
    if (!local.launched_before) continue;
    DeviceScope scope(local.device);
    auto event = local.last_launch->get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaEventSynchronize(*event),
                      "waiting for the launches on device " + std::to_string(local.device));
  }
  return Status::ok();
}

void DeviceExecutor::abort() {
  std::atomic_ref<uint32_t>(impl_->signals()->abort).store(1, std::memory_order_release);
}

Status DeviceExecutor::reset() {
  Impl& m = *impl_;
  if (m.multiprocess)
    return Status::error("reset() of a multi-process executor: its connection counters are "
                         "shared with other processes and cannot be cleared from one side");
  abort();  // a launch still waiting gives up now instead of at its timeout
  for (int d : m.devices) {
    DeviceScope scope(d);
    EFCCL_CUDA_RETURN(cudaDeviceSynchronize(),
                      "cudaDeviceSynchronize on device " + std::to_string(d));
  }
  for (LocalDevice& local : m.locals) {
    for (DeviceBuffer* b : {&local.flags, &local.state, &local.epochs})
      if (Status s = b->zero(); !s) return s;
  }
  if (Status s = m.arena.zero(); !s) return s;
  if (Status s = m.arena.write_first_positions(m.config.first_position, m.connections, m.location,
                                               m.local_rank);
      !s)
    return s;
  for (LocalDevice& local : m.locals) {
    DeviceScope scope(local.device);
    EFCCL_CUDA_RETURN(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::memset(m.host_mapped.get(), 0, m.host_mapped.bytes());
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return Status::ok();
}

}  // namespace efccl::device
