// The host's network ports from sysfs (detect.h): InfiniBand / RoCE devices from
// class/infiniband, then Ethernet interfaces from class/net that have a device (virtual ones,
// loopback and the net devices of an InfiniBand device already listed are skipped).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sysfs_pci.h"

namespace efccl::topo::sysfs {

/// At most this many NICs are listed; more is not a host we know.
inline constexpr std::size_t kMaxNics = 256;
/// What a port whose speed cannot be read is taken to run at, Gb/s (docs/topology-detect.md).
inline constexpr double kAssumedNicGbits = 10.0;

struct DetectedNic {
  std::string name;              ///< "mlx5_0", or the interface name "eth0"
  double gbps = 0;               ///< GB/s per direction (Gb/s / 8)
  std::optional<PciDevice> pci;  ///< nullopt when its PCI device could not be read
};

/// InfiniBand devices in natural name order, then Ethernet interfaces in natural name order.
/// What could not be read, or was skipped for a reason worth knowing, goes to `notes`.
std::vector<DetectedNic> list_nics(const SysfsTree& tree, std::vector<std::string>& notes);

}  // namespace efccl::topo::sysfs
