// The memory behind a program's connections on this process's GPUs, in pinned host memory, on
// slot devices and (network connections) in the blocks the runtime joins through its proxies,
// and the device handles that the kernels use to reach it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "connection_device_handle.h"
#include "connection_layout.h"
#include "cuda_raii.h"
#include "efccl/common/status.h"
#include "efccl/device/device_executor.h"
#include "kernel_params.h"
#include "shared_host_segment.h"

namespace efccl::device {

/// Owns, per GPU of this process, the FIFO arena and the counter arena of its location
/// (ConnectionLayout), the placed arenas of the connections its ranks receive (pinned host
/// memory, or memory on a slot device), and the mappings of other processes' arenas (CUDA IPC
/// or shared host memory, see arena_sharing.h); hands out the connection handles. Counters are
/// never reset between calls, only by zero() (DeviceExecutor::reset).
class ConnectionArena {
 public:
  /// One local GPU's arenas.
  struct Local {
    int device = 0;
    int64_t location = 0;
    DeviceBuffer fifo;      ///< tail, receiver's position, slots of connections received here
    DeviceBuffer counters;  ///< the ends of connections sent (and placed ones received) here
  };
  /// One placed arena this process owns (its receivers' location is here).
  struct Placed {
    PlacedArenaKey key;
    std::size_t bytes = 0;
    int device = -1;               ///< the slot device's CUDA device; -1: pinned host memory
    DeviceBuffer device_memory;    ///< on the slot device
    MappedHostBuffer host_memory;  ///< host memory whose senders run in this process
    /// Host memory whose senders run in another process: a shared segment, registered.
    std::optional<SharedHostSegment> segment;
    HostRegistration registration;  ///< of `segment` (declared after it: unregistered first)
    char* host = nullptr;           ///< host memory: its address in this process
  };

  ConnectionArena() = default;
  ConnectionArena(const ConnectionArena&) = delete;
  ConnectionArena& operator=(const ConnectionArena&) = delete;
  /// Closes the mappings of other processes' arenas.
  ~ConnectionArena();

  /// Allocates, zeroed, the arenas of this process's GPUs (`devices[i]` holds `locations[i]`)
  /// and the placed arenas of the connections received at those locations: slot device k's on
  /// CUDA device `slot_devices[k]`, host arenas with cudaHostAlloc, or, when their senders'
  /// location is not one of `locations` (another process), in a shared segment.
  Status allocate(const ConnectionLayout& layout, const std::vector<int>& devices,
                  const std::vector<int64_t>& locations, const std::vector<int>& slot_devices);
  /// Another process's arenas at `location`, as CUDA IPC mapped them on local `device`; closed
  /// with the arena.
  void add_remote(int64_t location, int device, char* fifo, char* counters);
  /// Another process's placed arena on a slot device, as CUDA IPC mapped it on local `device`;
  /// closed with the arena.
  void add_remote_placed(const PlacedArenaKey& key, int device, char* base);
  /// Another process's host arena, mapped here (`segment`), reached by local `device`: pins it
  /// and keeps it until the arena goes.
  Status add_remote_host(const PlacedArenaKey& key, int device, SharedHostSegment segment);

  /// The block of one end of network connection `c` that this process runs (the sending end,
  /// or the receiving end), as the runtime made it (PeerProcesses::connect_network): its slots
  /// and counters at the given offsets, reached from every local device at `memory.device`.
  void add_network_end(const ConnectionPlan& c, const NetworkEndMemory& memory);

  /// The sending end of `c` for a CTA on local `device`; `location[rank]` as in the layout. An
  /// error when a piece of memory it needs is not mapped there (a bug, not an input error).
  StatusOr<SendConnectionDeviceHandle> send_handle(const ConnectionPlan& c,
                                                   const std::vector<int64_t>& location,
                                                   int device) const;
  /// The receiving end of `c` for a CTA on local `device`.
  StatusOr<RecvConnectionDeviceHandle> recv_handle(const ConnectionPlan& c,
                                                   const std::vector<int64_t>& location,
                                                   int device) const;

  /// Writes `first` into every counter of the ends this process holds (`local[rank]`): tail and
  /// the pop position at receivers (and head, where it lies with the slots), head and the push
  /// position at senders. Tests only (ExecutorConfig::first_position); 0 writes nothing (the
  /// arenas start zeroed).
  Status write_first_positions(uint64_t first, const std::vector<ConnectionPlan>& connections,
                               const std::vector<int64_t>& location,
                               const std::vector<bool>& local);
  /// The board of `location` (XprocBoard, at the end of its counter arena) as local `device`
  /// reaches it; null when that arena is not mapped there.
  XprocBoard* board(int64_t location, int device) const;
  /// Zeroes this process's arenas (slots and counters, placed arenas too), waiting for it.
  Status zero();

  const std::vector<Local>& locals() const { return locals_; }
  const std::vector<std::unique_ptr<Placed>>& placed() const { return placed_; }
  const ConnectionLayout& layout() const { return layout_; }
  /// Bytes of the arenas on the GPU that holds the most (its own, and slot-device arenas).
  std::size_t most_bytes() const;

 private:
  /// Base of the FIFO (or counter) arena of `location` as local `device` reaches it; null when
  /// it is not mapped there.
  char* fifo_base(int64_t location, int device) const;
  char* counter_base(int64_t location, int device) const;
  /// Base of a placed arena as local `device` reaches it; null when not mapped there.
  char* placed_base(const PlacedArenaKey& key, int device) const;
  /// `c`'s FIFO entry as local `device` reaches it; null when not mapped there.
  char* fifo_entry(const ConnectionPlan& c, const std::vector<int64_t>& location, int device) const;

  ConnectionLayout layout_;
  std::vector<Local> locals_;
  std::vector<std::unique_ptr<Placed>> placed_;
  std::map<int64_t, const Local*> own_;                                ///< this process's locations
  std::map<std::pair<int64_t, int>, std::pair<char*, char*>> remote_;  ///< (fifo, counters)
  /// Every placed arena as a local device reaches it (owned or another process's).
  std::map<std::pair<PlacedArenaKey, int>, char*> placed_reach_;
  std::vector<std::pair<int, char*>> remote_ipc_placed_;  ///< (device, base): to close
  /// Other processes' host arenas, mapped and pinned here.
  struct RemoteHost {
    SharedHostSegment segment;
    HostRegistration registration;
  };
  std::vector<std::unique_ptr<RemoteHost>> remote_hosts_;
  /// This process's ends of network connections, by (sender, receiver, channel): one end per
  /// connection (its other end is on another host).
  std::map<std::tuple<int, int, int>, NetworkEndMemory> network_ends_;
};

}  // namespace efccl::device
