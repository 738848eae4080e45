// Wire formats per connection.
#include "wire_format_choice.h"

#include <cuda_runtime_api.h>

#include <map>
#include <utility>

#include "cuda_status.h"

namespace efccl::device {
namespace {

/// Empty when a connection from device `from` to device `to` (this process's) may carry LL128
/// lines, else why not. LL128 relies on a warp's 128-byte store reaching the receiver's memory
/// as a unit, which NVIDIA's own LL128 relies on for NVLink on compute capability 9.0 (Hopper)
/// and later, and which PCIe does not promise. Native peer atomics stand for NVLink here:
/// CUDA offers them between NVLink peers and not over PCIe.
StatusOr<std::string> ll128_obstacle(int from, int to) {
  for (int d : {from, to}) {
    int major = 0;
    EFCCL_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d),
                      "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    if (major < 9)
      return "device " + std::to_string(d) + " has compute capability " + std::to_string(major) +
             ".x (LL128 needs 9.0 or later)";
  }
  if (from == to) return std::string();
  int atomics = 0;
  EFCCL_CUDA_RETURN(
      cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, from, to),
      "cudaDeviceGetP2PAttribute(NativeAtomicSupported)");
  if (atomics == 0)
    return "devices " + std::to_string(from) + " and " + std::to_string(to) +
           " are not NVLink peers (no native peer atomics)";
  return std::string();
}

}  // namespace

StatusOr<std::string> choose_wire_formats(const ef::Program& program,
                                          const std::vector<bool>& local,
                                          const std::vector<int>& rank_devices,
                                          std::vector<ConnectionPlan>& connections) {
  const ef::Protocol protocol = program.protocol;
  std::map<std::pair<int, int>, std::string> obstacles;  // (from, to) device pair -> why not
  std::size_t fallbacks = 0;
  std::string first_reason;
  for (ConnectionPlan& c : connections) {
    if (protocol == ef::Protocol::kSimple) {
      c.wire = kWireSimple;
      continue;
    }
    c.wire = kWireLL;
    if (protocol == ef::Protocol::kLL) continue;
    std::string why;
    if (c.network) {
      why = "it joins two hosts (a network connection: its slots are in pinned host memory)";
    } else if (c.placement == ef::SlotLocation::kHost) {
      why = "its slots are in pinned host memory (PCIe does not deliver a 128-byte store whole)";
    } else if (c.placement == ef::SlotLocation::kDevice) {
      why = "its slots are on slot device " + std::to_string(c.slot_device) +
            " (LL128 lines are read only from the receiver's own memory)";
    } else if (!local[c.sender] || !local[c.receiver]) {
      why = "rank " + std::to_string(local[c.sender] ? c.receiver : c.sender) +
            " runs in another process";
    } else {
      const std::pair<int, int> pair{rank_devices[c.sender], rank_devices[c.receiver]};
      auto it = obstacles.find(pair);
      if (it == obstacles.end()) {
        StatusOr<std::string> o = ll128_obstacle(pair.first, pair.second);
        if (!o) return o.status();
        it = obstacles.emplace(pair, *o).first;
      }
      why = it->second;
    }
    if (why.empty()) {
      c.wire = kWireLL128;
    } else if (fallbacks++ == 0) {
      first_reason = "connection " + std::to_string(c.sender) + "->" + std::to_string(c.receiver) +
                     " ch " + std::to_string(c.channel) + ": " + why;
    }
  }
  if (fallbacks == 0) return std::string();
  return "LL128 program '" + program.name + "': " + std::to_string(fallbacks) + " of " +
         std::to_string(connections.size()) +
         " connections run over LL (the first: " + first_reason + ")";
}

}  // namespace efccl::device
