// The link-cost model (docs/timing-model.md): the executor's walk (program_walk.h) with a cost
// function that prices each unit instead of moving its data. Ports (a device's NVLink or PCIe
// egress and ingress, or with a topology every link of the graph; a device's memory) serve
// units in the order they become ready, so concurrent transfers share a port's bandwidth.
#include "efccl/host/timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "efccl/host/topology_model.h"
#include "efccl/topology/topology.h"
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
/// the peer's slot by the link, so only its local read counts here. An mrc reads and writes
/// buffers of ranks on the same GPU (it runs only there): each of its operands once.
uint64_t local_tiles(const ef::Op& op) {
  switch (op.code) {
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
    case OpCode::kMultiReduceCopy:
      return op.sources.size() + op.targets.size();
  }
  return 0;
}

/// A resource that serves one unit at a time: a link direction of a device, or its memory.
struct Port {
  double free_at = 0;
  double busy_us = 0;
};

/// The link-cost model as the walk's cost function: a unit keeps its threadblock, the device's
/// memory and (when it sends) every port of the connection's path busy, and ends when the
/// slowest is done.
class LinkCosts final : public UnitCost {
 public:
  LinkCosts(const ef::Program& program, const LinkCostModel& model, const TileGeometry& tiles)
      : program_(program), model_(model), tiles_(tiles) {}

  /// Assigns each connection of the walk its path: ports, capacities, latency. Fails when a
  /// topology has no route for a connection.
  Status prepare(const ProgramWalk& walk);
  double run(const WalkUnit& unit) override;
  double latency(std::size_t connection) const override {
    return connection_paths_[connection].latency_us;
  }
  /// Fills the traffic counters and the busiest port of `result`.
  void report(TimingResult& result) const;

 private:
  /// A port a transfer occupies, at the capacity it has there.
  struct Hop {
    Port* port = nullptr;
    double gbps = 1;
  };
  /// What one connection's transfers occupy.
  struct ConnectionPath {
    std::vector<Hop> forward;  ///< busy bytes / gbps each; a transfer starts when all are free
    std::vector<Hop> reverse;  ///< take reverse_fraction of the bytes (responses)
    double reverse_fraction = 0;
    double latency_us = 0;
    /// Slots away from the receiver (placement): `forward` is the sender's write into them,
    /// this the receiver's read out of them, which its receiving unit pays (store and forward:
    /// the tile waits in the slot in between). Empty for slots at the receiver.
    std::vector<Hop> read;
    std::vector<Hop> read_reverse;
    double read_latency_us = 0;
  };
  /// Carries `bytes` over `hops`, each link serving it in its own order from `ready` on,
  /// charges `reverse_fraction` of them on `reverse`, and returns when the last link is done
  /// (`ready` for no hops).
  double occupy(const std::vector<Hop>& hops, const std::vector<Hop>& reverse,
                double reverse_fraction, uint64_t bytes, double ready);
  Port& memory(int64_t device) { return memory_[device]; }
  /// The per-device ports of `transport` (no topology): the sender's egress and the receiver's
  /// ingress carry the data, the receiver's egress and the sender's ingress the responses.
  ConnectionPath device_ports(int64_t sender, int64_t receiver, Transport transport);
  StatusOr<ConnectionPath> topology_links(int64_t sender, int64_t receiver, Transport transport);
  /// A connection whose slots are not at the receiver: sender -> host memory -> receiver, or
  /// sender -> slot device -> receiver (one handoff: the receiver polls the slot's tail).
  StatusOr<ConnectionPath> placed_path(int64_t sender, int64_t receiver,
                                       const ef::ConnectionPlacement& placed);

  const ef::Program& program_;
  const LinkCostModel& model_;
  TileGeometry tiles_;
  std::vector<ConnectionPath> connection_paths_;
  std::map<std::tuple<int64_t, Transport, bool>, Port> link_ports_;  ///< (device, transport, in)
  std::map<topo::LinkIndex, Port> topology_ports_;                   ///< per link of the graph
  std::map<int64_t, Port> memory_;                                   ///< per device
  uint64_t link_bytes_ = 0;
  uint64_t local_bytes_ = 0;
};

LinkCosts::ConnectionPath LinkCosts::device_ports(int64_t sender, int64_t receiver,
                                                  Transport transport) {
  const LinkCost& cost = model_.cost(transport);
  ConnectionPath path;
  path.latency_us = cost.latency_us;
  path.reverse_fraction = cost.reverse_fraction;
  path.forward = {{&link_ports_[{sender, transport, false}], cost.bandwidth_gbps},
                  {&link_ports_[{receiver, transport, true}], cost.bandwidth_gbps}};
  if (cost.reverse_fraction > 0)
    path.reverse = {{&link_ports_[{receiver, transport, false}], cost.bandwidth_gbps},
                    {&link_ports_[{sender, transport, true}], cost.bandwidth_gbps}};
  return path;
}

StatusOr<LinkCosts::ConnectionPath> LinkCosts::topology_links(int64_t sender, int64_t receiver,
                                                              Transport transport) {
  const topo::Topology& t = *model_.topology;
  for (const int64_t device : {sender, receiver})
    if (device < 0 || static_cast<std::size_t>(device) >= t.nodes().size() ||
        t.node(static_cast<topo::NodeIndex>(device)).kind != topo::NodeKind::kGpu)
      return Status::error("rank device " + std::to_string(device) +
                           " is not a GPU node of the model's topology");
  StatusOr<topo::Path> route = transfer_route(t, static_cast<topo::NodeIndex>(sender),
                                              static_cast<topo::NodeIndex>(receiver), transport);
  if (!route) return route.status();
  const LinkCost& cost = model_.cost(transport);
  ConnectionPath path;
  path.latency_us = cost.latency_us + route->latency_us;
  path.reverse_fraction = cost.reverse_fraction;
  for (const topo::LinkIndex l : route->links) {
    path.forward.push_back({&topology_ports_[l], t.link(l).gbps});
    if (cost.reverse_fraction <= 0) continue;
    if (const auto back = reverse_link(t, l))
      path.reverse.push_back({&topology_ports_[*back], t.link(*back).gbps});
  }
  return path;
}

StatusOr<LinkCosts::ConnectionPath> LinkCosts::placed_path(int64_t sender, int64_t receiver,
                                                           const ef::ConnectionPlacement& placed) {
  const bool host = placed.location == ef::SlotLocation::kHost;
  const Transport transport = host ? Transport::kPcieHostStaged : Transport::kNvlink;
  const LinkCost& cost = model_.cost(transport);
  ConnectionPath path;
  path.reverse_fraction = cost.reverse_fraction;
  path.latency_us = cost.latency_us;
  if (!model_.topology) {  // sender's egress (slot device's ingress; its egress) receiver's ingress
    const auto port = [&](int64_t device, bool in) {
      return Hop{&link_ports_[{device, transport, in}], cost.bandwidth_gbps};
    };
    path.forward = {port(sender, false)};
    path.read = {port(receiver, true)};
    if (!host) {
      const int64_t slots = model_.slot_device_gpus[static_cast<std::size_t>(placed.device)];
      path.forward.push_back(port(slots, true));
      path.read.insert(path.read.begin(), port(slots, false));
    }
    if (cost.reverse_fraction > 0) {  // responses: into the sender, out of the receiver
      path.reverse = {port(sender, true)};
      path.read_reverse = {port(receiver, false)};
    }
    return path;
  }
  const topo::Topology& t = *model_.topology;
  // The links up to the slots and on from them: the host-staged walk cut at host memory, or
  // the routes to and from the slot device's GPU.
  std::vector<topo::LinkIndex> write, read;
  if (host) {
    StatusOr<topo::Path> walk = transfer_route(t, static_cast<topo::NodeIndex>(sender),
                                               static_cast<topo::NodeIndex>(receiver), transport);
    if (!walk) return walk.status();
    std::size_t cut = walk->links.size();
    for (std::size_t i = 0; i < walk->links.size(); ++i)
      if (t.node(t.link(walk->links[i]).to).kind == topo::NodeKind::kHostMemory) cut = i + 1;
    write.assign(walk->links.begin(), walk->links.begin() + static_cast<std::ptrdiff_t>(cut));
    read.assign(walk->links.begin() + static_cast<std::ptrdiff_t>(cut), walk->links.end());
  } else {
    const int64_t slots = model_.slot_device_gpus[static_cast<std::size_t>(placed.device)];
    for (const auto& [from, to, links] :
         {std::tuple{sender, slots, &write}, std::tuple{slots, receiver, &read}}) {
      if (from == to) continue;  // the slots are on the sender's or the receiver's own GPU
      StatusOr<topo::Path> route = transfer_route(t, static_cast<topo::NodeIndex>(from),
                                                  static_cast<topo::NodeIndex>(to), transport);
      if (!route) return route.status();
      *links = route->links;
    }
  }
  const auto fill = [&](const std::vector<topo::LinkIndex>& links, std::vector<Hop>& hops,
                        std::vector<Hop>& reverse, double& latency) {
    latency += t.path_of(links).latency_us;
    for (const topo::LinkIndex l : links) {
      hops.push_back({&topology_ports_[l], t.link(l).gbps});
      if (cost.reverse_fraction <= 0) continue;
      if (const auto back = reverse_link(t, l))
        reverse.push_back({&topology_ports_[*back], t.link(*back).gbps});
    }
  };
  fill(write, path.forward, path.reverse, path.latency_us);
  fill(read, path.read, path.read_reverse, path.read_latency_us);
  return path;
}

Status LinkCosts::prepare(const ProgramWalk& walk) {
  // Placed connections by (sender, receiver, channel); the rest have their slots at the receiver.
  std::map<std::tuple<int32_t, int32_t, int32_t>, ef::ConnectionPlacement> placed;
  for (const ef::ConnectionPlacement& p : program_.placements) {
    if (p.location == ef::SlotLocation::kReceiver) continue;
    if (p.location == ef::SlotLocation::kDevice &&
        (p.device < 0 || static_cast<std::size_t>(p.device) >= model_.slot_device_gpus.size()))
      return Status::error("connection rank " + std::to_string(p.sender) + " -> rank " +
                           std::to_string(p.receiver) + " channel " + std::to_string(p.channel) +
                           " has its slots on slot device " + std::to_string(p.device) +
                           "; the model binds " + std::to_string(model_.slot_device_gpus.size()) +
                           " slot devices (slot_device_gpus)");
    if (p.location != ef::SlotLocation::kHost && p.location != ef::SlotLocation::kDevice)
      return Status::error("connection rank " + std::to_string(p.sender) + " -> rank " +
                           std::to_string(p.receiver) + " has an unknown slot location");
    placed.emplace(std::make_tuple(p.sender, p.receiver, p.channel), p);
  }
  // Routes per (sender device, receiver device, transport): many connections share one.
  std::map<std::tuple<int64_t, int64_t, Transport>, ConnectionPath> paths;
  // Placed ones per (sender device, receiver device, location, slot device's GPU).
  std::map<std::tuple<int64_t, int64_t, ef::SlotLocation, int64_t>, ConnectionPath> placed_paths;
  for (const WalkConnection& c : walk.connections()) {
    const Transport transport = model_.transport(c.sender, c.receiver, c.channel);
    const int64_t sender = model_.device_of(c.sender);
    const int64_t receiver = model_.device_of(c.receiver);
    if (auto p = placed.find({c.sender, c.receiver, c.channel}); p != placed.end()) {
      const ef::ConnectionPlacement& where = p->second;
      const int64_t slots = where.location == ef::SlotLocation::kDevice
                                ? model_.slot_device_gpus[static_cast<std::size_t>(where.device)]
                                : -1;
      const auto key = std::make_tuple(sender, receiver, where.location, slots);
      auto it = placed_paths.find(key);
      if (it == placed_paths.end()) {
        StatusOr<ConnectionPath> path = placed_path(sender, receiver, where);
        if (!path) return path.status();
        it = placed_paths.emplace(key, std::move(*path)).first;
      }
      connection_paths_.push_back(it->second);
      continue;
    }
    if (transport == Transport::kSameDevice) {
      // A copy through the device's memory, shared with its local work.
      ConnectionPath path;
      path.forward = {{&memory(sender), model_.same_device.bandwidth_gbps}};
      path.latency_us = model_.same_device.latency_us;
      connection_paths_.push_back(std::move(path));
      continue;
    }
    auto it = paths.find({sender, receiver, transport});
    if (it == paths.end()) {
      ConnectionPath path;
      if (model_.topology) {
        StatusOr<ConnectionPath> links = topology_links(sender, receiver, transport);
        if (!links) return links.status();
        path = std::move(*links);
      } else {
        path = device_ports(sender, receiver, transport);
      }
      it = paths.emplace(std::make_tuple(sender, receiver, transport), std::move(path)).first;
    }
    connection_paths_.push_back(it->second);
  }
  return Status::ok();
}

double LinkCosts::run(const WalkUnit& unit) {
  const WalkThreadblock& t = unit.tb;
  const uint64_t bytes = unit.tile_elements * tiles_.element_size;
  const double ready = unit.ready;
  double end = ready + transfer_us(bytes, model_.threadblock_bandwidth_gbps);
  if (const uint64_t local = local_tiles(unit.op) * bytes; local > 0) {
    Port& m = memory(model_.device_of(t.rank));
    const double start = std::max(ready, m.free_at);
    const double busy = transfer_us(local, model_.local_bandwidth_gbps);
    m.free_at = start + busy;
    m.busy_us += busy;
    end = std::max(end, m.free_at);
    local_bytes_ += local;
  }
  if (ef::op_receives(unit.op.code) && t.recv_connection >= 0) {
    // Slots away from the receiver: it reads the tile out of them.
    const ConnectionPath& path = connection_paths_[static_cast<std::size_t>(t.recv_connection)];
    if (!path.read.empty())
      end =
          std::max(end, occupy(path.read, path.read_reverse, path.reverse_fraction, bytes, ready) +
                            path.read_latency_us);
  }
  if (ef::op_sends(unit.op.code)) {
    const ConnectionPath& path = connection_paths_[static_cast<std::size_t>(t.send_connection)];
    // The threadblock writes the tile while it runs; its last byte lands `latency` later.
    end = std::max(end, occupy(path.forward, path.reverse, path.reverse_fraction, bytes, ready));
    link_bytes_ += bytes;
  }
  return end;
}

double LinkCosts::occupy(const std::vector<Hop>& hops, const std::vector<Hop>& reverse,
                         double reverse_fraction, uint64_t bytes, double ready) {
  // Each link serves the unit when it is free (a fluid picture of packet-switched links):
  // waiting until all are free at once would leave a link idle while another is busy.
  double end = ready;
  for (const Hop& hop : hops) {
    const double busy = transfer_us(bytes, hop.gbps);
    hop.port->free_at = std::max(ready, hop.port->free_at) + busy;
    hop.port->busy_us += busy;
    end = std::max(end, hop.port->free_at);
  }
  // Responses flow back while the data streams: they take their share of the opposite
  // direction without holding the transfer up. Charged from `ready` (the walk's clock), not
  // from a later `start`: a reservation in the future would leave the port idle before it.
  for (const Hop& hop : reverse) {
    const double busy = reverse_fraction * transfer_us(bytes, hop.gbps);
    hop.port->free_at = std::max(hop.port->free_at, ready) + busy;
    hop.port->busy_us += busy;
  }
  return end;
}

void LinkCosts::report(TimingResult& result) const {
  result.link_bytes = link_bytes_;
  result.local_bytes = local_bytes_;
  for (const auto& [key, port] : link_ports_)
    result.busiest_port_us = std::max(result.busiest_port_us, port.busy_us);
  if (model_.topology) result.link_busy_us.assign(model_.topology->links().size(), 0.0);
  for (const auto& [link, port] : topology_ports_) {
    result.busiest_port_us = std::max(result.busiest_port_us, port.busy_us);
    result.link_busy_us[link] = port.busy_us;
  }
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
  if (!std::isfinite(c.reverse_fraction) || c.reverse_fraction < 0)
    return Status::error(std::string(name) +
                         " reverse fraction must be a finite number >= 0, got " +
                         std::to_string(c.reverse_fraction));
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
  if (model.topology && model.rank_devices.empty())
    return fail(Status::error("a model with a topology needs rank_devices (model_for_topology)"));
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
    LinkCosts costs(program, model, tiles);
    if (Status s = costs.prepare(walk); !s) return fail(std::move(s));
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
