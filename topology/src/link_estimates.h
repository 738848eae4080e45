// Figures the graph uses where its source gives none: the presets (presets.cc) and NCCL's XML
// (nccl_xml.cc) share them, and docs/topology.md lists where each comes from.
#pragma once

namespace efccl::topo {

// Latencies per link, one way. Estimates: they order routes and add to the timing model's
// per-transfer latency; capacities are what the numbers below are about.
inline constexpr double kNvlinkLatencyUs = 0.5;
inline constexpr double kPcieLatencyUs = 0.6;
inline constexpr double kHostLatencyUs = 0.1;
inline constexpr double kSmpLatencyUs = 0.3;
inline constexpr double kC2cLatencyUs = 0.3;

// Sapphire Rapids (Xeon 8480C in DGX H100): 8 DDR5-4800 channels x 8 bytes = 307.2 GB/s per
// socket; UPI between the sockets, an estimate. Sources that name no CPU get these too.
inline constexpr double kSprMemoryGbps = 307.2;
inline constexpr double kSprUpiGbps = 62.0;
// NDR400 InfiniBand: 400 Gb/s = 50 GB/s per direction.
inline constexpr double kNdr400Gbps = 50.0;

}  // namespace efccl::topo
