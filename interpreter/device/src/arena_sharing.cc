// Connection arenas shared between the processes of a multi-process executor (CUDA IPC, and
// POSIX shared memory for host arenas).
#include "arena_sharing.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "cuda_raii.h"
#include "cuda_status.h"
#include "peer_access.h"
#include "shared_host_segment.h"

namespace efccl::device {
namespace {

constexpr char kArenaBlobMagic[4] = {'E', 'F', 'A', '2'};

/// One process's arenas at one of its locations, as exchanged.
struct SharedArena {
  int64_t location = 0;
  uint64_t fifo_bytes = 0, counter_bytes = 0;
  char bus_id[32] = {};  ///< the owning GPU's PCI bus id
  cudaIpcMemHandle_t fifo{}, counter{};
};

/// One placed arena a process owns and another process's senders write, as exchanged.
struct SharedPlacedArena {
  int64_t receiver = 0, sender = 0;  ///< PlacedArenaKey
  int32_t slot_device = -1;
  uint32_t reserved = 0;
  uint64_t bytes = 0;
  char bus_id[32] = {};         ///< slot-device arenas: the slot device's PCI bus id
  cudaIpcMemHandle_t handle{};  ///< slot-device arenas
  char segment[SharedHostSegment::kMaxNameLength + 1] = {};  ///< host arenas: the segment
  PlacedArenaKey key() const { return {receiver, sender, slot_device}; }
};

/// One process's description.
struct Description {
  std::string fingerprint;
  std::vector<SharedArena> arenas;
  std::vector<SharedPlacedArena> placed;
};

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

/// Reads a T at `*pos`, advancing it; false when the blob is too short.
template <typename T>
bool take(const std::string& in, std::size_t* pos, T* v) {
  if (*pos > in.size() || in.size() - *pos < sizeof(T)) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

Status parse_description(const std::string& blob, Description* d) {
  std::size_t pos = 0;
  char magic[4];
  uint32_t fp_size = 0, count = 0;
  if (!take(blob, &pos, &magic) || std::memcmp(magic, kArenaBlobMagic, 4) != 0)
    return Status::error("not an efccl arena description (bad magic)");
  if (!take(blob, &pos, &fp_size) || blob.size() - pos < fp_size)
    return Status::error("truncated arena description (fingerprint)");
  d->fingerprint.assign(blob.data() + pos, fp_size);
  pos += fp_size;
  if (!take(blob, &pos, &count) || count > 4096)
    return Status::error("arena description lists a bad number of arenas");
  for (uint32_t i = 0; i < count; ++i) {
    SharedArena a;
    if (!take(blob, &pos, &a)) return Status::error("truncated arena description");
    a.bus_id[sizeof(a.bus_id) - 1] = '\0';
    d->arenas.push_back(a);
  }
  if (!take(blob, &pos, &count) || count > (1u << 16))
    return Status::error("arena description lists a bad number of placed arenas");
  for (uint32_t i = 0; i < count; ++i) {
    SharedPlacedArena a;
    if (!take(blob, &pos, &a)) return Status::error("truncated arena description (placed)");
    a.bus_id[sizeof(a.bus_id) - 1] = '\0';
    a.segment[sizeof(a.segment) - 1] = '\0';
    d->placed.push_back(a);
  }
  if (pos != blob.size()) return Status::error("arena description has trailing bytes");
  return Status::ok();
}

/// This process's description: its locations' arenas, and the placed arenas it owns whose
/// senders run elsewhere.
StatusOr<std::string> describe(const ConnectionArena& arena, const std::string& fingerprint) {
  const ConnectionLayout& layout = arena.layout();
  std::string mine(kArenaBlobMagic, 4);
  put(mine, static_cast<uint32_t>(fingerprint.size()));
  mine += fingerprint;
  put(mine, static_cast<uint32_t>(arena.locals().size()));
  std::set<int64_t> own;
  for (const ConnectionArena::Local& local : arena.locals()) {
    own.insert(local.location);
    SharedArena a;
    a.location = local.location;
    a.fifo_bytes = layout.fifo_bytes.at(a.location);
    a.counter_bytes = layout.counter_bytes.at(a.location);
    EFCCL_CUDA_RETURN(cudaDeviceGetPCIBusId(a.bus_id, sizeof(a.bus_id) - 1, local.device),
                      "cudaDeviceGetPCIBusId");
    DeviceScope scope(local.device);
    EFCCL_CUDA_RETURN(
        cudaIpcGetMemHandle(&a.fifo, local.fifo.get()),
        "cudaIpcGetMemHandle (FIFO arena, device " + std::to_string(local.device) + ")");
    EFCCL_CUDA_RETURN(cudaIpcGetMemHandle(&a.counter, local.counters.get()),
                      "cudaIpcGetMemHandle (counter arena)");
    put(mine, a);
  }
  std::vector<SharedPlacedArena> placed;
  for (const auto& p : arena.placed()) {
    if (own.count(p->key.sender)) continue;  // both ends here: nobody else maps it
    SharedPlacedArena a;
    a.receiver = p->key.receiver;
    a.sender = p->key.sender;
    a.slot_device = p->key.slot_device;
    a.bytes = p->bytes;
    if (p->device >= 0) {
      EFCCL_CUDA_RETURN(cudaDeviceGetPCIBusId(a.bus_id, sizeof(a.bus_id) - 1, p->device),
                        "cudaDeviceGetPCIBusId");
      DeviceScope scope(p->device);
      EFCCL_CUDA_RETURN(cudaIpcGetMemHandle(&a.handle, p->device_memory.get()),
                        "cudaIpcGetMemHandle (slot device " + std::to_string(p->key.slot_device) +
                            ", device " + std::to_string(p->device) + ")");
    } else {
      const std::string& name = p->segment->name();
      std::memcpy(a.segment, name.c_str(), std::min(name.size(), sizeof(a.segment) - 1));
    }
    placed.push_back(a);
  }
  put(mine, static_cast<uint32_t>(placed.size()));
  for (const SharedPlacedArena& a : placed) put(mine, a);
  return mine;
}

/// Maps another process's slot-device arena on local device `opener`: peer access to the slot
/// device where this process sees it, then CUDA IPC.
Status open_slot_device_arena(ConnectionArena& arena, const SharedPlacedArena& a, int opener,
                              int owner_rank) {
  const std::string slot = "slot device " + std::to_string(a.slot_device) + " (GPU " +
                           std::string(a.bus_id) + ", allocated by rank " +
                           std::to_string(owner_rank) + "'s process)";
  int device = -1;
  if (cudaDeviceGetByPCIBusId(&device, a.bus_id) != cudaSuccess) {
    (void)cudaGetLastError();  // not visible here (e.g. CUDA_VISIBLE_DEVICES): IPC may still map it
    device = -1;
  }
  if (device >= 0 && device != opener) {
    int can = 0;
    EFCCL_CUDA_RETURN(cudaDeviceCanAccessPeer(&can, opener, device), "cudaDeviceCanAccessPeer");
    if (can == 0)
      return Status::error("device " + std::to_string(opener) + " cannot access " + slot +
                           " (no peer access between them)");
    if (Status s = enable_peer_access(opener, device); !s) return s;
  }
  DeviceScope scope(opener);
  void* base = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&base, a.handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_error("cudaIpcOpenMemHandle of " + slot + " on device " + std::to_string(opener) +
                          (device < 0 ? " (that GPU is not visible in this process)" : ""),
                      e);
  }
  arena.add_remote_placed(a.key(), opener, static_cast<char*>(base));
  return Status::ok();
}

}  // namespace

Status share_arenas(ConnectionArena& arena, const ArenaSharing& sharing) {
  const ef::Program& program = *sharing.program;
  const std::vector<bool>& local_rank = *sharing.local;
  const std::vector<int64_t>& location = *sharing.location;
  const std::vector<int>& rank_devices = *sharing.rank_devices;
  const std::string& fingerprint = sharing.fingerprint;
  const ConnectionLayout& layout = arena.layout();
  auto mine = describe(arena, fingerprint);
  if (!mine) return mine.status();
  // The arenas are zero already (DeviceBuffer::allocate waits for that, host memory is zeroed
  // when allocated), before any peer can write into them. No device-wide sync here: it would
  // wait for this process's earlier, possibly still spinning, kernels.

  StatusOr<std::vector<std::string>> all = sharing.exchange(*mine);
  if (!all)
    return Status::error("exchanging connection memory with the other processes: " +
                         all.status().message());
  const int n = program.nranks;
  if (all->size() != static_cast<std::size_t>(n))
    return Status::error("the exchange returned " + std::to_string(all->size()) +
                         " descriptions for " + std::to_string(n) + " ranks");

  // What this process maps: per remote location, the local devices whose ranks have a
  // connection placed at the receiver with its ranks; the placed arenas of other processes
  // that local ranks send on; and whose descriptions it checks (every remote rank it talks to).
  std::map<int64_t, std::set<int>> needed;
  std::map<PlacedArenaKey, int> needed_placed;  ///< -> the local device that writes it
  std::set<int> talks;
  for (const ConnectionPlan& c : *sharing.connections) {
    const bool sends_here = local_rank[c.sender], receives_here = local_rank[c.receiver];
    if (sends_here == receives_here) continue;
    talks.insert(sends_here ? c.receiver : c.sender);  // network peers too: same program?
    if (c.network) continue;  // its memory is this host's own (connect_network)
    if (c.placed()) {
      if (sends_here) needed_placed[c.placed_arena(location)] = rank_devices[c.sender];
    } else if (sends_here) {
      needed[location[c.receiver]].insert(rank_devices[c.sender]);
    } else {
      needed[location[c.sender]].insert(rank_devices[c.receiver]);
    }
  }
  std::map<int64_t, Description> described;  ///< per remote location, its process's
  std::map<int64_t, int> described_by;       ///< a rank at that location
  for (int r : talks) {
    if (described.count(location[r])) continue;
    Description d;
    if (Status s = parse_description((*all)[r], &d); !s)
      return Status::error("rank " + std::to_string(r) +
                           "'s process sent a bad description: " + s.message());
    if (d.fingerprint != fingerprint)
      return Status::error("rank " + std::to_string(r) + " runs a different program or call (" +
                           d.fingerprint + ") than this process (" + fingerprint +
                           "): every rank must make the same collective calls in the same order, "
                           "with the same count, datatype, operator and root");
    described[location[r]] = std::move(d);
    described_by[location[r]] = r;
  }

  for (const auto& [loc, openers] : needed) {
    const int r = described_by.at(loc);
    const SharedArena* found = nullptr;
    for (const SharedArena& a : described.at(loc).arenas)
      if (a.location == loc) found = &a;
    if (found == nullptr)
      return Status::error("rank " + std::to_string(r) + "'s process did not describe its arena");
    const SharedArena& a = *found;
    if (a.fifo_bytes != layout.fifo_bytes.at(loc) ||
        a.counter_bytes != layout.counter_bytes.at(loc))
      return Status::error("rank " + std::to_string(r) + "'s process laid out its connection " +
                           "memory differently (" + std::to_string(a.fifo_bytes) + " FIFO bytes, " +
                           "expected " + std::to_string(layout.fifo_bytes.at(loc)) + ")");
    int owner = -1;
    if (cudaDeviceGetByPCIBusId(&owner, a.bus_id) != cudaSuccess) {
      (void)cudaGetLastError();  // not visible here (e.g. CUDA_VISIBLE_DEVICES): IPC still maps it
      owner = -1;
    }
    for (int opener : openers) {
      if (owner >= 0 && owner != opener)
        if (Status s = enable_peer_access(opener, owner); !s) return s;
      DeviceScope scope(opener);
      void* fifo = nullptr;
      void* counters = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&fifo, a.fifo, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        return cuda_error("cudaIpcOpenMemHandle of the FIFO memory of GPU " +
                              std::string(a.bus_id) + " (another process) on device " +
                              std::to_string(opener),
                          e);
      e = cudaIpcOpenMemHandle(&counters, a.counter, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaIpcCloseMemHandle(fifo);
        return cuda_error("cudaIpcOpenMemHandle of the counter memory of GPU " +
                              std::string(a.bus_id) + " on device " + std::to_string(opener),
                          e);
      }
      arena.add_remote(loc, opener, static_cast<char*>(fifo), static_cast<char*>(counters));
    }
  }

  for (const auto& [key, opener] : needed_placed) {
    const int r = described_by.at(key.receiver);
    const SharedPlacedArena* found = nullptr;
    for (const SharedPlacedArena& a : described.at(key.receiver).placed)
      if (a.key() == key) found = &a;
    const std::string what = key.slot_device < 0
                                 ? std::string("pinned host memory")
                                 : "memory on slot device " + std::to_string(key.slot_device);
    if (found == nullptr)
      return Status::error("rank " + std::to_string(r) + "'s process did not describe the " + what +
                           " of the connections it receives from this process");
    if (found->bytes != layout.placed_bytes.at(key))
      return Status::error("rank " + std::to_string(r) + "'s process laid out the " + what +
                           " of its connections differently (" + std::to_string(found->bytes) +
                           " bytes, expected " + std::to_string(layout.placed_bytes.at(key)) + ")");
    if (key.slot_device >= 0) {
      if (Status s = open_slot_device_arena(arena, *found, opener, r); !s) return s;
      continue;
    }
    auto segment = SharedHostSegment::open_and_unlink(found->segment, found->bytes);
    if (!segment)
      return Status::error("mapping the pinned host memory of rank " + std::to_string(r) +
                           "'s connections: " + segment.status().message());
    if (Status s = arena.add_remote_host(key, opener, std::move(*segment)); !s) return s;
  }
  return Status::ok();
}

}  // namespace efccl::device
