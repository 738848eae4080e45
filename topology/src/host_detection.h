// Detection's parts behind detect_host (detect.h), open to the tests: the assembly with any
// NVLink source (a fake in the tests), and NCCL_TOPO_FILE's overlay on a detected graph.
#pragma once

#include <string>
#include <vector>

#include "efccl/topology/detect.h"
#include "link_estimates.h"
#include "nvlink_source.h"

namespace efccl::topo {

// Estimates used where nothing is measured (docs/topology-detect.md). Latencies are the
// shared ones (link_estimates.h); capacities of host memory and between sockets are not
// readable from sysfs, so they are typical values, not this machine's.
inline constexpr double kDetectNvlinkLatencyUs = kNvlinkLatencyUs;
inline constexpr double kDetectPcieLatencyUs = kPcieLatencyUs;
inline constexpr double kDetectHostLatencyUs = kHostLatencyUs;
inline constexpr double kDetectSmpLatencyUs = kSmpLatencyUs;
/// One NUMA node's DRAM: 8 channels of DDR4-3200 (8 x 25.6 GB/s).
inline constexpr double kDetectMemoryGbps = 204.8;
/// Between two CPUs (UPI / xGMI), per direction: the presets' UPI estimate.
inline constexpr double kDetectSmpGbps = kSprUpiGbps;
/// A PCIe link that cannot be read: Gen4 x16.
inline constexpr double kAssumedPcieGts = 16.0;
inline constexpr int kAssumedPcieWidth = 16;
/// NVLink per-lane rate where the GPU generation is unknown (NVLink 2 to 4).
inline constexpr double kAssumedNvlinkLaneGbps = 25.0;
/// At most this many GPUs are taken from the caller or sysfs.
inline constexpr std::size_t kMaxDetectedGpus = 1024;

/// detect_host with `nvlinks` as the NVLink source (nullptr: no NVLink information; the
/// caller notes why). options.use_nvml is not looked at.
Detection detect_host_with(const DetectOptions& options, NvlinkSource* nvlinks);

/// NCCL_TOPO_FILE's graph `file` made the host's graph, matched to `detected`
/// (docs/topology-detect.md): GPUs matched by bus id take CUDA's ordinal, id ("h0.gpu<ordinal>"),
/// sm and name; GPUs of the file CUDA does not see are dropped; visible GPUs the file lacks, and
/// the detected NICs when the file has none, are added under the CPU of their NUMA node. When
/// `detected` has no GPU, the file's GPUs are kept as they are. What changed goes to `notes`.
StatusOr<Topology> overlay_topo_file(const Topology& file, const Topology& detected,
                                     std::vector<std::string>& notes);

/// Applies NCCL_TOPO_FILE `path` to `detection` (load_nccl_xml, then overlay_topo_file); a file
/// that cannot be read or parsed leaves the detected graph and says so in the notes.
void apply_nccl_topo_file(const std::string& path, Detection& detection);

}  // namespace efccl::topo
