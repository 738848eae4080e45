// Connection arenas shared between the processes of a multi-process executor (CUDA IPC).
#include "arena_sharing.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "cuda_raii.h"
#include "cuda_status.h"
#include "peer_access.h"

namespace efccl::device {
namespace {

constexpr char kArenaBlobMagic[4] = {'E', 'F', 'A', '1'};

/// One process's arenas, as exchanged.
struct SharedArena {
  int64_t location = 0;
  uint64_t fifo_bytes = 0, counter_bytes = 0;
  char bus_id[32] = {};  ///< the owning GPU's PCI bus id
  cudaIpcMemHandle_t fifo{}, counter{};
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

Status parse_arenas(const std::string& blob, std::string* fingerprint,
                    std::vector<SharedArena>* arenas) {
  std::size_t pos = 0;
  char magic[4];
  uint32_t fp_size = 0, count = 0;
  if (!take(blob, &pos, &magic) || std::memcmp(magic, kArenaBlobMagic, 4) != 0)
    return Status::error("not an efccl arena description (bad magic)");
  if (!take(blob, &pos, &fp_size) || blob.size() - pos < fp_size)
    return Status::error("truncated arena description (fingerprint)");
  fingerprint->assign(blob.data() + pos, fp_size);
  pos += fp_size;
  if (!take(blob, &pos, &count) || count > 4096)
    return Status::error("arena description lists a bad number of arenas");
  for (uint32_t i = 0; i < count; ++i) {
    SharedArena a;
    if (!take(blob, &pos, &a)) return Status::error("truncated arena description");
    a.bus_id[sizeof(a.bus_id) - 1] = '\0';
    arenas->push_back(a);
  }
  if (pos != blob.size()) return Status::error("arena description has trailing bytes");
  return Status::ok();
}

}  // namespace

Status share_arenas(ConnectionArena& arena, const ArenaSharing& sharing) {
  const ef::Program& program = *sharing.program;
  const std::vector<bool>& local_rank = *sharing.local;
  const std::vector<int64_t>& location = *sharing.location;
  const std::vector<int>& rank_devices = *sharing.rank_devices;
  const std::string& fingerprint = sharing.fingerprint;
  const std::map<int64_t, std::size_t>& fifo_size = arena.layout().fifo_bytes;
  const std::map<int64_t, std::size_t>& counter_size = arena.layout().counter_bytes;
  std::string mine(kArenaBlobMagic, 4);
  put(mine, static_cast<uint32_t>(fingerprint.size()));
  mine += fingerprint;
  put(mine, static_cast<uint32_t>(arena.locals().size()));
  for (const ConnectionArena::Local& local : arena.locals()) {
    SharedArena a;
    a.location = local.location;
    a.fifo_bytes = fifo_size.at(a.location);
    a.counter_bytes = counter_size.at(a.location);
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
  // The arenas are zero already (DeviceBuffer::allocate waits for that), before any peer can
  // write into them. No device-wide sync here: it would wait for this process's earlier,
  // possibly still spinning, kernels.

  StatusOr<std::vector<std::string>> all = sharing.exchange(mine);
  if (!all)
    return Status::error("exchanging connection memory with the other processes: " +
                         all.status().message());
  const int n = program.nranks;
  if (all->size() != static_cast<std::size_t>(n))
    return Status::error("the exchange returned " + std::to_string(all->size()) +
                         " descriptions for " + std::to_string(n) + " ranks");

  // Remote locations this process talks to, and the local devices that talk to each.
  std::map<int64_t, std::set<int>> needed;
  for (int r = 0; r < n; ++r) {
    if (!local_rank[r]) continue;
    for (const auto& tb : program.ranks[r].threadblocks)
      for (int peer : {tb.send_peer, tb.recv_peer})
        if (peer >= 0 && !local_rank[peer]) needed[location[peer]].insert(rank_devices[r]);
  }
  std::map<int64_t, SharedArena> remote;
  for (int r = 0; r < n; ++r) {
    if (local_rank[r] || !needed.count(location[r]) || remote.count(location[r])) continue;
    std::string theirs;
    std::vector<SharedArena> arenas;
    if (Status s = parse_arenas((*all)[r], &theirs, &arenas); !s)
      return Status::error("rank " + std::to_string(r) +
                           "'s process sent a bad description: " + s.message());
    if (theirs != fingerprint)
      return Status::error("rank " + std::to_string(r) + " runs a different program or call (" +
                           theirs + ") than this process (" + fingerprint +
                           "): every rank must make the same collective calls in the same order, "
                           "with the same count, datatype, operator and root");
    for (const SharedArena& a : arenas) {
      if (a.location != location[r]) continue;
      if (a.fifo_bytes != fifo_size.at(a.location) ||
          a.counter_bytes != counter_size.at(a.location))
        return Status::error("rank " + std::to_string(r) + "'s process laid out its connection " +
                             "memory differently (" + std::to_string(a.fifo_bytes) +
                             " FIFO bytes, " + "expected " +
                             std::to_string(fifo_size.at(a.location)) + ")");
      remote[a.location] = a;
    }
    if (!remote.count(location[r]))
      return Status::error("rank " + std::to_string(r) + "'s process did not describe its arena");
  }
  for (auto& [loc, a] : remote) {
    int owner = -1;
    if (cudaDeviceGetByPCIBusId(&owner, a.bus_id) != cudaSuccess) {
      (void)cudaGetLastError();  // not visible here (e.g. CUDA_VISIBLE_DEVICES): IPC still maps it
      owner = -1;
    }
    for (int opener : needed[loc]) {
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
  return Status::ok();
}

}  // namespace efccl::device
