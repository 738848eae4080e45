// The memory behind a program's connections on this process's GPUs, and the device handles
// that the kernels use to reach it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "connection_device_handle.h"
#include "connection_layout.h"
#include "cuda_raii.h"
#include "efccl/common/status.h"

namespace efccl::device {

/// Owns, per GPU of this process, the FIFO arena and the counter arena of its location
/// (ConnectionLayout), and the mappings of other processes' arenas (CUDA IPC, see
/// arena_sharing.h); hands out the connection handles. Counters are never reset between calls,
/// only by zero() (DeviceExecutor::reset).
class ConnectionArena {
 public:
  /// One local GPU's arenas.
  struct Local {
    int device = 0;
    int64_t location = 0;
    DeviceBuffer fifo;      ///< tail, receiver's position, slots of connections received here
    DeviceBuffer counters;  ///< head, sender's position of connections sent from here
  };

  ConnectionArena() = default;
  ConnectionArena(const ConnectionArena&) = delete;
  ConnectionArena& operator=(const ConnectionArena&) = delete;
  /// Closes the mappings of other processes' arenas.
  ~ConnectionArena();

  /// Allocates the arenas of this process's GPUs, zeroed: `devices[i]` holds `locations[i]`.
  Status allocate(const ConnectionLayout& layout, const std::vector<int>& devices,
                  const std::vector<int64_t>& locations);
  /// Another process's arenas at `location`, as CUDA IPC mapped them on local `device`; closed
  /// with the arena.
  void add_remote(int64_t location, int device, char* fifo, char* counters);

  /// The sending end of `c` for a CTA on local `device`; `location[rank]` as in the layout.
  SendConnectionDeviceHandle send_handle(const ConnectionPlan& c,
                                         const std::vector<int64_t>& location, int device) const;
  /// The receiving end of `c` for a CTA on local `device`.
  RecvConnectionDeviceHandle recv_handle(const ConnectionPlan& c,
                                         const std::vector<int64_t>& location, int device) const;

  /// Writes `first` into every counter of the ends this process holds (`local[rank]`): tail and
  /// the pop position at receivers, head and the push position at senders. Tests only
  /// (ExecutorConfig::first_position); 0 writes nothing (the arenas start zeroed).
  Status write_first_positions(uint64_t first, const std::vector<ConnectionPlan>& connections,
                               const std::vector<int64_t>& location,
                               const std::vector<bool>& local);
  /// Zeroes this process's arenas (slots and counters), waiting for it.
  Status zero();

  const std::vector<Local>& locals() const { return locals_; }
  const ConnectionLayout& layout() const { return layout_; }
  /// Bytes of both arenas of the local GPU that holds the most.
  std::size_t most_bytes() const;

 private:
  /// Base of the FIFO (or counter) arena of `location` as local `device` reaches it.
  char* fifo_base(int64_t location, int device) const;
  char* counter_base(int64_t location, int device) const;

  ConnectionLayout layout_;
  std::vector<Local> locals_;
  std::map<int64_t, const Local*> own_;                                ///< this process's locations
  std::map<std::pair<int64_t, int>, std::pair<char*, char*>> remote_;  ///< (fifo, counters)
};

}  // namespace efccl::device
