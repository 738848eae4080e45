// Reading the PCI tree, the NUMA nodes and the GPUs from sysfs (detect.h), bounded: at most
// kMaxAttributeBytes per file and kMaxDirectoryEntries per directory, so an odd or hostile tree
// (a test's, a container's) costs little and never throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::topo::sysfs {

inline constexpr std::size_t kMaxAttributeBytes = 4096;
inline constexpr std::size_t kMaxDirectoryEntries = 4096;

/// The first kMaxAttributeBytes of a regular file, trailing whitespace removed; nullopt when it
/// cannot be opened or is not a regular file (a FIFO in a test tree must not block us).
std::optional<std::string> read_attribute(const std::filesystem::path& file);
/// Names in `dir` (not "." or ".."), sorted naturally ("mlx5_2" before "mlx5_10"), at most
/// kMaxDirectoryEntries; empty when it cannot be listed.
std::vector<std::string> list_directory(const std::filesystem::path& dir);
/// Natural order: runs of digits compare as numbers.
bool natural_less(std::string_view a, std::string_view b);

/// "0000:1b:00.0", "00000000:1B:00.0" (NVML), "1b:00.0" (domain 0) -> "0000:1b:00.0";
/// nullopt when `text` is not a PCI bus id.
std::optional<std::string> normalize_bus_id(std::string_view text);
/// "16.0 GT/s PCIe", "8 GT/s", "2.5 GT/s" -> GT/s; nullopt for "Unknown" or garbage.
std::optional<double> parse_link_speed(std::string_view text);
/// A decimal integer (optionally negative) and nothing else.
std::optional<long> parse_integer(std::string_view text);
/// "0x030200" (or without 0x) -> the number; nullopt for garbage.
std::optional<uint32_t> parse_hex(std::string_view text);
/// An InfiniBand port rate "400 Gb/sec (4X NDR)" -> Gb/s.
std::optional<double> parse_ib_rate(std::string_view text);

/// A PCIe link's capability as sysfs says (max_link_speed, max_link_width); 0 when unreadable.
struct PciLink {
  double gts = 0;
  int width = 0;
  bool known() const { return gts > 0 && width > 0; }
};

/// A PCI bridge on the way from the root complex down to a device.
struct PciBridge {
  std::string bus_id;
  PciLink link;
};

/// One PCI function and where it sits in the tree.
struct PciDevice {
  std::string bus_id;                  ///< normalised
  std::optional<uint32_t> class_code;  ///< 0x030200 for a 3D controller
  std::optional<uint32_t> vendor;      ///< 0x10de for NVIDIA
  int numa = -1;                       ///< numa_node; -1 when unknown
  PciLink link;                        ///< the device's own max link
  /// The bridges above it: the root port first, its nearest bridge last (empty: on a root bus).
  std::vector<PciBridge> bridges;
};

/// The sysfs tree at `root` ("/sys", or a test's directory).
class SysfsTree {
 public:
  explicit SysfsTree(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }

  /// The device behind `link` (bus/pci/devices/<id>, class/net/<if>/device, ...): the symlink
  /// resolved, its last PCI component the device, the PCI components above it its bridges.
  /// Errors say what could not be read.
  StatusOr<PciDevice> device_at(const std::filesystem::path& link) const;
  /// The device with bus id `bus_id` (normalised), from bus/pci/devices.
  StatusOr<PciDevice> device(const std::string& bus_id) const;
  /// Every NVIDIA display or 3D controller (vendor 0x10de, class 0x0300xx / 0x0302xx), in bus
  /// id order.
  std::vector<std::string> nvidia_gpus() const;
  /// Whether `bus_id` is an NVIDIA GPU this tree lists (visible to CUDA or not).
  bool is_nvidia_gpu(const std::string& bus_id) const;
  /// NUMA nodes that have CPUs (devices/system/node/node<N> with a non-empty cpulist, or one
  /// whose cpulist cannot be read), ascending; empty when none can be listed.
  std::vector<int> cpu_numa_nodes() const;

 private:
  std::filesystem::path root_;
};

}  // namespace efccl::topo::sysfs
