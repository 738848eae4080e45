// Multi-process executors: connection arenas shared between processes, through CUDA IPC (GPU
// memory: the locations' arenas and slot-device arenas) and POSIX shared memory (host arenas).
//
// Why this lives in the device executor and not in the runtime's transports: the executor owns
// the layout (which arena holds which connection's slots and counters, computed from the
// program alone) and the memory (cudaMalloc'd arenas whose IPC handles are exported and opened
// here, host segments created, registered and mapped here); the runtime only carries opaque
// bytes between processes, through the exchange function of PeerProcesses
// (docs/device-executor.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "connection_arena.h"
#include "connection_layout.h"
#include "efccl/common/status.h"
#include "efccl/ef/program.h"

namespace efccl::device {

/// What arena sharing needs to know about the executor's processes.
struct ArenaSharing {
  const ef::Program* program = nullptr;
  const std::vector<ConnectionPlan>* connections = nullptr;  ///< laid out
  const std::vector<bool>* local = nullptr;                  ///< per rank: run by this process
  const std::vector<int64_t>* location = nullptr;            ///< per rank: its arena group
  const std::vector<int>* rank_devices = nullptr;            ///< per rank: its GPU (local ranks)
  std::string fingerprint;                                   ///< PeerProcesses::fingerprint
  /// PeerProcesses::exchange: this process's description out, every rank's process's in.
  std::function<StatusOr<std::vector<std::string>>(const std::string&)> exchange;
};

/// Describes this process's arenas (location, sizes, GPU, CUDA IPC handles; placed arenas with
/// their slot device's GPU and IPC handle, or their shared segment's name) to the other
/// processes, checks theirs (same program and call, same layout), and maps into `arena`, on
/// each local GPU that needs it, the arenas of every location a local rank has a connection
/// with, and the placed arenas of the connections local ranks send on. Called once, inside
/// DeviceExecutor::create, at the same point by every process: one exchange.
Status share_arenas(ConnectionArena& arena, const ArenaSharing& sharing);

}  // namespace efccl::device
