// The host executor's link-cost model (DESIGN.md "Host reference executor"): a deterministic
// discrete-event walk of a Program that moves no data and predicts how long a call takes.
// Every threadblock runs its ops in the executor's order (iterations, tiles, units), each unit
// waiting for its dependencies, its connection's data and a free slot of the same bounded
// connections. A unit keeps its threadblock busy for at least bytes / threadblock bandwidth,
// a transfer costs bytes / bandwidth of the connection's transport (shared by every transfer
// through the same port) plus its latency, and local work costs its memory traffic / the
// device's memory bandwidth. With a topology (model_for_topology, topology_model.h) a transfer
// occupies every link of its route instead. docs/timing-model.md describes the model and its
// numbers.
//
//   host::LinkCostModel model;                      // H200 NVLink defaults
//   host::ExecOptions call{.count = 1 << 28, .dtype = ef::DataType::kFloat32};
//   host::TimingResult t = host::predict_time(program, call, model);  // t.time_us
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/host/executor.h"

namespace efccl::topo {
class Topology;
}  // namespace efccl::topo

namespace efccl::host {

/// How a connection's data travels between two ranks.
enum class Transport : uint8_t {
  kNvlink,          ///< peer-to-peer over NVLink (NVSwitch): the GPU's NVLink port
  kPcieHostStaged,  ///< staged through pinned host memory over PCIe: the GPU's PCIe port
  kSameDevice,      ///< both ranks on one GPU: a copy through its memory
};
std::string_view to_string(Transport t);

/// The cost of one transfer of `bytes`: latency_us + bytes / bandwidth. Bandwidth is in GB/s
/// (1e9 bytes per second), per direction.
struct LinkCost {
  double latency_us = 0;
  double bandwidth_gbps = 1;
  /// Link-level responses a transfer sends back the opposite way, as a fraction of its
  /// payload: they take that share of the reverse direction's time, which data going the
  /// other way then waits for (docs/timing-model.md, "Both directions").
  double reverse_fraction = 0;
};

/// Costs of the machine a program runs on. The defaults describe H200s on NVSwitch: they are
/// parameters, not constants, so that other machines (and what-ifs) are one struct away.
struct LinkCostModel {
  /// NVLink copy bandwidth measured on H200 (395 GB/s per direction) and the per-hop latency
  /// of a slot handoff (flag write, remote poll; about 2-3 us). Responses: 0.1 of the payload,
  /// from 395 GB/s one way against the ~360 GB/s per direction measured with both directions
  /// busy (send/recv at 1 GB, NCCL and efccl; docs/timing-model.md).
  LinkCost nvlink{2.5, 395.0, 0.1};
  /// Host-staged PCIe path: 55 GB/s per direction; the latency (two PCIe crossings and a
  /// host-memory flag) is an estimate, not a measurement.
  LinkCost pcie_host_staged{5.0, 55.0};
  /// Ranks sharing a GPU: a device-memory copy (half of local_bandwidth_gbps: read + write).
  LinkCost same_device{1.0, 1500.0};
  /// Device-memory traffic (reads + writes) per second for local work: copies, reductions,
  /// reading a received slot. HBM3e of an H200 sustains about 3000 GB/s of copy traffic.
  double local_bandwidth_gbps = 3000.0;
  /// The most payload one threadblock moves per second: a unit of `b` bytes keeps its
  /// threadblock busy for at least b / this. A one-threadblock ring allreduce over two H200s
  /// measured 12.6 GB/s busbw with 128 KiB slots (docs/performance.md), which this model
  /// reproduces with 25 GB/s; it is why programs need many threadblocks to fill a link.
  double threadblock_bandwidth_gbps = 25.0;
  /// Added once per program launch (kernel launch and the first flag round trip).
  double launch_overhead_us = 6.0;

  /// The transport of connections between different devices unless overridden below.
  Transport default_transport = Transport::kNvlink;
  /// Overrides per (sender, receiver) rank pair ...
  std::map<std::pair<int32_t, int32_t>, Transport> pair_transport;
  /// ... and per connection (sender, receiver, channel), which wins over the pair's.
  std::map<std::tuple<int32_t, int32_t, int32_t>, Transport> connection_transport;
  /// Per program rank: its device. Ranks with equal entries share one GPU (its ports and
  /// memory) and talk through kSameDevice. Empty: every rank has a GPU of its own. With a
  /// topology: the GPU node (topo::NodeIndex) of each rank, one entry per rank.
  std::vector<int64_t> rank_devices;
  /// Per slot device of the program (connections placed with ef::SlotLocation::kDevice): the
  /// device whose memory holds its slots; with a topology, its GPU node (the engine's binding
  /// at run time). A program naming a slot device beyond this list cannot be timed.
  std::vector<int64_t> slot_device_gpus;
  /// The machine as a graph, or null (the per-device ports above). With one, a transfer
  /// occupies every link of its route, each at its own capacity, and its latency is the
  /// transport's plus the route's; the transports' bandwidths are not used (kSameDevice's is).
  /// Built by model_for_topology (efccl/host/topology_model.h).
  std::shared_ptr<const topo::Topology> topology;

  /// The transport of connection (sender, receiver, channel).
  Transport transport(int32_t sender, int32_t receiver, int32_t channel) const;
  /// The cost parameters of `t`.
  const LinkCost& cost(Transport t) const;
  /// Rank `rank`'s device (rank_devices, or the rank itself when that is empty or short).
  int64_t device_of(int32_t rank) const;
};

/// A model's parameters are usable: positive bandwidths, non-negative latencies and overhead.
Status check_model(const LinkCostModel& model);

/// A predicted execution.
struct TimingResult {
  Status status;  ///< not ok on deadlock or on an invalid call, program or model
  bool deadlock = false;
  std::vector<BlockedThreadblock> blocked;  ///< filled on deadlock, as ExecResult's
  /// Predicted completion in microseconds: the launch overhead plus the time the last
  /// threadblock finishes. 0 for a call with no data (nothing is launched).
  double time_us = 0;
  uint64_t iterations = 0;     ///< tiles per chunk
  uint64_t link_bytes = 0;     ///< bytes carried over connections, all ranks together
  uint64_t local_bytes = 0;    ///< device-memory traffic of local work, all ranks together
  double busiest_port_us = 0;  ///< the most time any one port (or memory) was busy
  /// With a topology: per link of the graph, the time it was busy (data and responses); empty
  /// without one.
  std::vector<double> link_busy_us;
};

/// Predicts the time of one call of `program` (options.count elements of options.dtype; the
/// operator, premul scalars and in-place data do not change the time) under `model`, with the
/// executor's tiles and slots (options.slot_bytes, options.connection_slots). A connection the
/// program places (Program::placements) crosses sender -> its slots -> receiver: pinned host
/// memory is the pcie_host_staged transport (with a topology, Topology::host_route), a slot
/// device the sender's route to model.slot_device_gpus[k] and on from there to the receiver,
/// priced as NVLink (docs/timing-model.md, "Connection placement"). Deterministic: equal
/// inputs give equal results. Moves no data and allocates no buffers.
TimingResult predict_time(const ef::Program& program, const ExecOptions& options,
                          const LinkCostModel& model = {});

}  // namespace efccl::host
