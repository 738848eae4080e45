// The link-cost model (docs/timing-model.md): the executor's walk (program_walk.h) with a cost
// function that prices each unit instead of moving its data. Ports (a device's NVLink or PCIe
// egress and ingress, its memory) serve units in the order they become ready, so concurrent
// transfers share a port's bandwidth.
#include "efccl/host/timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <new>
#include <tuple>
#include <vector>

#include "index_check.h"
#include "program_walk.h"

namespace efccl::host {
namespace {

using ef::OpCode;

/// Microseconds to move `bytes` at `gbps` GB/s (1 GB/s = 1e3 bytes per microsecond).
double transfer_us(uint64_t bytes, double gbps) {
  return static_cast<double>(bytes) / (gbps * 1e3);
}

/// Device-memory traffic of one unit, in tiles: what the op reads and writes locally. A
/// received tile is read from the slot in the receiver's memory; a sent one is written into
/// the peer's slot by the link, so only its local read counts here.
uint64_t local_tiles(OpCode code) {
  switch (code) {
    case OpCode::kSend:
      return 1;  // read src
    case OpCode::kRecv:
    case OpCode::kCopy:
    case OpCode::kRecvCopySend:
    case OpCode::kRecvReduceSend:
      return 2;  // read slot (or src) + write dst; rrs: read slot + read src
    case OpCode::kReduce:
    case OpCode::kRecvReduceCopy:
    case OpCode::kRecvReduceCopySend:
      return 3;  // two reads + one write
    case OpCode::kNop:
      return 0;
  }
  return 0;
}

/// A resource that serves one unit at a time: a link direction of a device, or its memory.
struct Port {
  double free_at = 0;
  double busy_us = 0;
};

/// The link-cost model as the walk's cost function: a unit keeps its threadblock, the device's
/// memory and (when it sends) the connection's ports busy, and ends when the slowest is done.
class LinkCosts final : public UnitCost {
 public:
  LinkCosts(const LinkCostModel& model, const TileGeometry& tiles) : model_(model), tiles_(tiles) {}

  /// Assigns each connection of the walk its transport's cost and ports.
  void prepare(const ProgramWalk& walk);
  double run(const WalkUnit& unit) override;
  double latency(std::size_t connection) const override {
    return connection_ports_[connection].cost->latency_us;
  }
  /// Fills the traffic counters and the busiest port of `result`.
  void report(TimingResult& result) const;

 private:
  struct ConnectionPorts {
    const LinkCost* cost = nullptr;
    Port* egress = nullptr;   ///< the sender's port for the transport
    Port* ingress = nullptr;  ///< the receiver's port (the same port for kSameDevice)
  };
  Port& memory(int64_t device) { return memory_[device]; }

  const LinkCostModel& model_;
  TileGeometry tiles_;
  std::vector<ConnectionPorts> connection_ports_;
  std::map<std::tuple<int64_t, Transport, bool>, Port> link_ports_;  ///< (device, transport, in)
  std::map<int64_t, Port> memory_;                                   ///< per device
  uint64_t link_bytes_ = 0;
  uint64_t local_bytes_ = 0;
};

void LinkCosts::prepare(const ProgramWalk& walk) {
  for (const WalkConnection& c : walk.connections()) {
    ConnectionPorts ports;
    const Transport transport = model_.transport(c.sender, c.receiver, c.channel);
    ports.cost = &model_.cost(transport);
    if (transport == Transport::kSameDevice) {
      ports.egress = ports.ingress = &memory(model_.device_of(c.sender));
    } else {
      ports.egress = &link_ports_[{model_.device_of(c.sender), transport, false}];
      ports.ingress = &link_ports_[{model_.device_of(c.receiver), transport, true}];
    }
    connection_ports_.push_back(ports);
  }
}

double LinkCosts::run(const WalkUnit& unit) {
  const WalkThreadblock& t = unit.tb;
  const uint64_t bytes = unit.tile_elements * tiles_.element_size;
  const double ready = unit.ready;
  double end = ready + transfer_us(bytes, model_.threadblock_bandwidth_gbps);
  if (const uint64_t local = local_tiles(unit.op.code) * bytes; local > 0) {
    Port& m = memory(model_.device_of(t.rank));
    const double start = std::max(ready, m.free_at);
    const double busy = transfer_us(local, model_.local_bandwidth_gbps);
    m.free_at = start + busy;
    m.busy_us += busy;
    end = std::max(end, m.free_at);
    local_bytes_ += local;
  }
  if (ef::op_sends(unit.op.code)) {
    const ConnectionPorts& out = connection_ports_[static_cast<std::size_t>(t.send_connection)];
    const double start = std::max({ready, out.egress->free_at, out.ingress->free_at});
    const double busy = transfer_us(bytes, out.cost->bandwidth_gbps);
    out.egress->free_at = start + busy;
    out.egress->busy_us += busy;
    if (out.ingress != out.egress) {
      out.ingress->free_at = start + busy;
      out.ingress->busy_us += busy;
    }
    // The threadblock writes the tile while it runs; its last byte lands `latency` later.
    end = std::max(end, start + busy);
    link_bytes_ += bytes;
  }
  return end;
}

void LinkCosts::report(TimingResult& result) const {
  result.link_bytes = link_bytes_;
  result.local_bytes = local_bytes_;
  for (const auto& [key, port] : link_ports_)
    result.busiest_port_us = std::max(result.busiest_port_us, port.busy_us);
  for (const auto& [device, port] : memory_)
    result.busiest_port_us = std::max(result.busiest_port_us, port.busy_us);
}

Status check_link(const LinkCost& c, const char* name) {
  if (!std::isfinite(c.latency_us) || c.latency_us < 0)
    return Status::error(std::string(name) + " latency must be a finite number >= 0 us, got " +
                         std::to_string(c.latency_us));
  if (!std::isfinite(c.bandwidth_gbps) || c.bandwidth_gbps <= 0)
    return Status::error(std::string(name) + " bandwidth must be a finite number > 0 GB/s, got " +
                         std::to_string(c.bandwidth_gbps));
  return Status::ok();
}

}  // namespace

std::string_view to_string(Transport t) {
  switch (t) {
    case Transport::kNvlink:
      return "nvlink";
    case Transport::kPcieHostStaged:
      return "pcie_host_staged";
    case Transport::kSameDevice:
      return "same_device";
  }
  return "unknown";
}

int64_t LinkCostModel::device_of(int32_t rank) const {
  if (rank >= 0 && static_cast<std::size_t>(rank) < rank_devices.size())
    return rank_devices[static_cast<std::size_t>(rank)];
  return rank;
}

Transport LinkCostModel::transport(int32_t sender, int32_t receiver, int32_t channel) const {
  if (device_of(sender) == device_of(receiver)) return Transport::kSameDevice;
  if (auto it = connection_transport.find({sender, receiver, channel});
      it != connection_transport.end())
    return it->second;
  if (auto it = pair_transport.find({sender, receiver}); it != pair_transport.end())
    return it->second;
  return default_transport;
}

const LinkCost& LinkCostModel::cost(Transport t) const {
  switch (t) {
    case Transport::kNvlink:
      return nvlink;
    case Transport::kPcieHostStaged:
      return pcie_host_staged;
    case Transport::kSameDevice:
      return same_device;
  }
  return nvlink;
}

Status check_model(const LinkCostModel& m) {
  if (Status s = check_link(m.nvlink, "nvlink"); !s) return s;
  if (Status s = check_link(m.pcie_host_staged, "pcie_host_staged"); !s) return s;
  if (Status s = check_link(m.same_device, "same_device"); !s) return s;
  if (!std::isfinite(m.local_bandwidth_gbps) || m.local_bandwidth_gbps <= 0)
    return Status::error("local bandwidth must be a finite number > 0 GB/s, got " +
                         std::to_string(m.local_bandwidth_gbps));
  if (!std::isfinite(m.threadblock_bandwidth_gbps) || m.threadblock_bandwidth_gbps <= 0)
    return Status::error("threadblock bandwidth must be a finite number > 0 GB/s, got " +
                         std::to_string(m.threadblock_bandwidth_gbps));
  if (!std::isfinite(m.launch_overhead_us) || m.launch_overhead_us < 0)
    return Status::error("launch overhead must be a finite number >= 0 us, got " +
                         std::to_string(m.launch_overhead_us));
  const auto known = [](Transport t) {
    return t == Transport::kNvlink || t == Transport::kPcieHostStaged ||
           t == Transport::kSameDevice;
  };
  if (!known(m.default_transport)) return Status::error("unknown default transport");
  for (const auto& [pair, t] : m.pair_transport)
    if (!known(t)) return Status::error("unknown transport for a rank pair");
  for (const auto& [connection, t] : m.connection_transport)
    if (!known(t)) return Status::error("unknown transport for a connection");
  return Status::ok();
}

TimingResult predict_time(const ef::Program& program, const ExecOptions& options,
                          const LinkCostModel& model) {
  TimingResult result;
  const auto fail = [&](Status s) {
    result.status = std::move(s);
    return result;
  };
  if (Status s = check_indices(program); !s) return fail(std::move(s));
  if (Status s = ef::check_call(program, options.count, options.dtype, options.op, options.inplace,
                                options.premul_scalars.size());
      !s)
    return fail(std::move(s));
  if (options.connection_slots < 1)
    return fail(Status::error("connection_slots must be at least 1, got " +
                              std::to_string(options.connection_slots)));
  if (Status s = check_model(model); !s) return fail(std::move(s));
  if (!model.rank_devices.empty() &&
      model.rank_devices.size() != static_cast<std::size_t>(program.nranks))
    return fail(Status::error("the model places " + std::to_string(model.rank_devices.size()) +
                              " ranks on devices; the program has " +
                              std::to_string(program.nranks)));
  const TileGeometry tiles =
      TileGeometry::of(program, options, *ef::chunk_elements(program, options.count));
  result.iterations = tiles.iterations;
  if (tiles.iterations == 0) return result;  // no data: nothing is launched
  try {
    ProgramWalk walk(program, tiles, options.connection_slots, /*timed=*/true);
    walk.prepare();
    LinkCosts costs(model, tiles);
    costs.prepare(walk);
    result.blocked = walk.run(costs);
    if (!result.blocked.empty()) {
      result.deadlock = true;
      result.status = deadlock_status(result.blocked, walk.threadblocks().size());
      return result;
    }
    costs.report(result);
    result.time_us = model.launch_overhead_us + walk.finish_time();
  } catch (const std::bad_alloc&) {
    return fail(Status::error("cannot allocate the timing model's state for count " +
                              std::to_string(options.count)));
  }
  return result;
}

}  // namespace efccl::host
