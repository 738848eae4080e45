// Machines we do not have, as graphs (docs/topology.md lists the source of every number).
//
//   auto t = topo::preset("dgx-h100", 2);   // two DGX H100 joined by 8 rail switches
#pragma once

#include <string_view>
#include <vector>

#include "efccl/topology/topology.h"

namespace efccl::topo {

/// The preset names: "nimble-h100", "dgx-h100", "hgx-h200", "h200-nv18-x2".
std::vector<std::string_view> preset_names();
/// Preset `name` as a cluster of `nodes` such hosts (1 ... kMaxHosts) with rail-matched
/// switches; an error naming the known presets for an unknown name.
StatusOr<Topology> preset(std::string_view name, int nodes = 1);

/// Per-lane, per-direction NVLink rate of the GPU generation with compute capability `sm`
/// (x10: 90 = Hopper), GB/s: NVLink 1 (sm 60) 20, NVLink 2 (70) and 3 (80) and 4 (90) 25,
/// NVLink 5 (100) 50; 0 for an unknown generation.
double nvlink_lane_gbps(int sm);
/// PCIe capacity per direction, GB/s, of `width` lanes at `gts` GT/s (the encoding's overhead
/// taken out: 8b/10b up to 5 GT/s, 128b/130b from 8 GT/s).
double pcie_gbps(double gts, int width);

}  // namespace efccl::topo
