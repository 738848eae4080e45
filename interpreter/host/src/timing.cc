// The link-cost model's walk (docs/timing-model.md): the executor's state machines (iteration,
// op, unit per threadblock; bounded FIFO connections; dependencies per iteration), driven by
// an event queue ordered by the time each threadblock's next unit can start instead of a
// round-robin. Ports (a device's NVLink or PCIe egress and ingress, its memory) serve units in
// the order they become ready, so concurrent transfers share a port's bandwidth.
#include "efccl/host/timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <sstream>

#include "index_check.h"

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

/// A bounded FIFO of units between two threadblocks, carrying times instead of data.
struct TimedConnection {
  int32_t sender = 0, receiver = 0, channel = 0;
  const LinkCost* cost = nullptr;
  Port* egress = nullptr;       ///< the sender's port for the transport
  Port* ingress = nullptr;      ///< the receiver's port (the same port for kSameDevice)
  std::deque<double> arrivals;  ///< units pushed and not popped: when each reaches the receiver
  uint64_t pushed = 0, popped = 0;
  std::vector<double> pop_times;  ///< ring of `slots`: when unit k was popped, at k % slots
  std::vector<std::size_t> senders, receivers;  ///< threadblock indices (one each when valid)
};

struct TimedThreadblock {
  int32_t rank = 0, tb = 0;
  const ef::Threadblock* def = nullptr;
  std::size_t first_op = 0;       ///< index of its op 0 in Simulation::completed_
  std::size_t rank_first_tb = 0;  ///< index of the rank's tb 0 in Simulation::tbs_
  int send_connection = -1, recv_connection = -1;
  uint64_t iteration = 0;
  std::size_t op = 0;
  int64_t unit = 0;
  double free_at = 0;  ///< when its previous unit finished
  bool done = false;
  bool queued = false;                 ///< its next unit is in the event queue
  std::size_t waits_on_op = SIZE_MAX;  ///< registered in op_waiters_ of this op
};

class Simulation {
 public:
  Simulation(const ef::Program& p, const ExecOptions& o, const LinkCostModel& m,
             uint64_t chunk_elements)
      : program_(p), model_(m), chunk_elements_(chunk_elements) {
    const std::size_t slot_bytes =
        o.slot_bytes != 0 ? o.slot_bytes : default_slot_bytes(p.protocol);
    element_size_ = ef::size_of(o.dtype);
    stride_elements_ = std::max<uint64_t>(1, slot_bytes / element_size_);
    iterations_ =
        chunk_elements == 0 ? 0 : (chunk_elements + stride_elements_ - 1) / stride_elements_;
    slots_ = static_cast<uint64_t>(o.connection_slots);
  }

  void prepare();
  TimingResult run();

 private:
  Port& memory(int64_t device) { return memory_[device]; }
  /// Queues the threadblock's next unit when everything it waits for is known; otherwise
  /// leaves it to the event it waits for (a push, a pop or an op's iteration) to wake it.
  void schedule(std::size_t index);
  /// Runs the unit (or completes the empty op) that became ready at `ready`.
  void step(std::size_t index, double ready);
  std::string waits_for(const TimedThreadblock& t) const;

  const ef::Program& program_;
  const LinkCostModel& model_;
  uint64_t chunk_elements_;
  std::size_t element_size_ = 1;
  uint64_t stride_elements_ = 1;
  uint64_t iterations_ = 0;
  uint64_t slots_ = 1;

  std::vector<TimedThreadblock> tbs_;
  std::vector<TimedConnection> connections_;
  std::map<std::tuple<int64_t, Transport, bool>, Port> link_ports_;  ///< (device, transport, in)
  std::map<int64_t, Port> memory_;                                   ///< per device
  std::vector<uint64_t> completed_;  ///< per op of every threadblock: iterations completed
  /// Per op that is a dependency target: when each iteration completed (else empty).
  std::vector<std::vector<double>> completion_times_;
  std::vector<bool> is_target_;
  std::vector<std::vector<std::size_t>> op_waiters_;  ///< per op: threadblocks waiting on it
  using Event = std::pair<double, std::size_t>;       ///< (ready time, threadblock)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  std::vector<std::size_t> woken_;  ///< threadblocks to reschedule after a step
  double finish_ = 0;
  TimingResult result_;
};

void Simulation::prepare() {
  for (int32_t r = 0; r < program_.nranks; ++r) {
    const ef::Rank& rank = program_.ranks[static_cast<std::size_t>(r)];
    const std::size_t rank_first_tb = tbs_.size();
    for (std::size_t b = 0; b < rank.threadblocks.size(); ++b) {
      TimedThreadblock t;
      t.rank = r;
      t.tb = static_cast<int32_t>(b);
      t.def = &rank.threadblocks[b];
      t.first_op = completed_.size();
      t.rank_first_tb = rank_first_tb;
      t.done = iterations_ == 0 || t.def->ops.empty();
      completed_.resize(completed_.size() + t.def->ops.size(), 0);
      tbs_.push_back(t);
    }
  }
  is_target_.assign(completed_.size(), false);
  for (const TimedThreadblock& t : tbs_)
    for (const ef::Op& op : t.def->ops)
      for (const ef::Dependency& d : op.deps)
        is_target_[tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)].first_op +
                   static_cast<std::size_t>(d.op)] = true;
  completion_times_.resize(completed_.size());
  op_waiters_.resize(completed_.size());

  std::map<std::tuple<int32_t, int32_t, int32_t>, int> index;
  const auto connection_of = [&](int32_t sender, int32_t receiver, int32_t channel) {
    auto [it, inserted] =
        index.try_emplace({sender, receiver, channel}, static_cast<int>(connections_.size()));
    if (inserted) {
      TimedConnection c;
      c.sender = sender;
      c.receiver = receiver;
      c.channel = channel;
      const Transport transport = model_.transport(sender, receiver, channel);
      c.cost = &model_.cost(transport);
      if (transport == Transport::kSameDevice) {
        c.egress = c.ingress = &memory(model_.device_of(sender));
      } else {
        c.egress = &link_ports_[{model_.device_of(sender), transport, false}];
        c.ingress = &link_ports_[{model_.device_of(receiver), transport, true}];
      }
      c.pop_times.assign(static_cast<std::size_t>(slots_), 0.0);
      connections_.push_back(std::move(c));
    }
    return it->second;
  };
  for (std::size_t i = 0; i < tbs_.size(); ++i) {
    TimedThreadblock& t = tbs_[i];
    if (t.def->send_peer >= 0) {
      t.send_connection = connection_of(t.rank, t.def->send_peer, t.def->channel);
      connections_[static_cast<std::size_t>(t.send_connection)].senders.push_back(i);
    }
    if (t.def->recv_peer >= 0) {
      t.recv_connection = connection_of(t.def->recv_peer, t.rank, t.def->channel);
      connections_[static_cast<std::size_t>(t.recv_connection)].receivers.push_back(i);
    }
  }
}

void Simulation::schedule(std::size_t index) {
  TimedThreadblock& t = tbs_[index];
  if (t.done || t.queued) return;
  const ef::Op& op = t.def->ops[t.op];
  double ready = t.free_at;
  if (t.unit == 0) {
    for (const ef::Dependency& d : op.deps) {
      const std::size_t target = tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)].first_op +
                                 static_cast<std::size_t>(d.op);
      if (completed_[target] <= t.iteration) {
        if (t.waits_on_op != target) {
          op_waiters_[target].push_back(index);
          t.waits_on_op = target;
        }
        return;
      }
      ready = std::max(ready, completion_times_[target][t.iteration]);
    }
  }
  if (t.unit < op.count) {
    if (ef::op_receives(op.code)) {
      const TimedConnection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
      if (in.arrivals.empty()) return;  // the sender's push wakes it
      ready = std::max(ready, in.arrivals.front());
    }
    if (ef::op_sends(op.code)) {
      const TimedConnection& out = connections_[static_cast<std::size_t>(t.send_connection)];
      if (out.pushed - out.popped >= slots_) return;  // the receiver's pop wakes it
      // The slot this push takes was freed by the pop of unit pushed - slots; the sender
      // learns of it one link latency later.
      if (out.pushed >= slots_)
        ready =
            std::max(ready, out.pop_times[(out.pushed - slots_) % slots_] + out.cost->latency_us);
    }
  }
  t.queued = true;
  queue_.push({ready, index});
}

void Simulation::step(std::size_t index, double ready) {
  TimedThreadblock& t = tbs_[index];
  t.queued = false;
  const ef::Op& op = t.def->ops[t.op];
  double end = ready;
  if (t.unit < op.count) {
    const uint64_t tile_start = t.iteration * stride_elements_;
    const uint64_t bytes = std::min(stride_elements_, chunk_elements_ - tile_start) * element_size_;
    end = ready + transfer_us(bytes, model_.threadblock_bandwidth_gbps);
    if (const uint64_t local = local_tiles(op.code) * bytes; local > 0) {
      Port& m = memory(model_.device_of(t.rank));
      const double start = std::max(ready, m.free_at);
      const double busy = transfer_us(local, model_.local_bandwidth_gbps);
      m.free_at = start + busy;
      m.busy_us += busy;
      end = std::max(end, m.free_at);
      result_.local_bytes += local;
    }
    if (ef::op_sends(op.code)) {
      TimedConnection& out = connections_[static_cast<std::size_t>(t.send_connection)];
      const double start = std::max({ready, out.egress->free_at, out.ingress->free_at});
      const double busy = transfer_us(bytes, out.cost->bandwidth_gbps);
      out.egress->free_at = start + busy;
      out.egress->busy_us += busy;
      if (out.ingress != out.egress) {
        out.ingress->free_at = start + busy;
        out.ingress->busy_us += busy;
      }
      end = std::max(end, start + busy);
      result_.link_bytes += bytes;
      // The threadblock writes the tile while it runs; its last byte lands `latency` later.
      out.arrivals.push_back(end + out.cost->latency_us);
      ++out.pushed;
      woken_.insert(woken_.end(), out.receivers.begin(), out.receivers.end());
    }
    if (ef::op_receives(op.code)) {
      // The slot is free once the unit has been read out of it, i.e. when the unit ends.
      TimedConnection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
      in.arrivals.pop_front();
      in.pop_times[in.popped % slots_] = end;
      ++in.popped;
      woken_.insert(woken_.end(), in.senders.begin(), in.senders.end());
    }
    ++t.unit;
  }
  t.free_at = end;
  if (t.unit >= op.count) {
    const std::size_t g = t.first_op + t.op;
    completed_[g] = t.iteration + 1;
    if (is_target_[g]) completion_times_[g].push_back(end);
    woken_.insert(woken_.end(), op_waiters_[g].begin(), op_waiters_[g].end());
    for (const std::size_t w : op_waiters_[g]) tbs_[w].waits_on_op = SIZE_MAX;
    op_waiters_[g].clear();
    t.unit = 0;
    if (++t.op == t.def->ops.size()) {
      t.op = 0;
      t.done = ++t.iteration == iterations_;
      if (t.done) finish_ = std::max(finish_, end);
    }
  }
  woken_.push_back(index);
  for (const std::size_t w : woken_) schedule(w);  // schedule() never adds to woken_
  woken_.clear();
}

std::string Simulation::waits_for(const TimedThreadblock& t) const {
  const ef::Op& op = t.def->ops[t.op];
  std::ostringstream s;
  if (t.unit == 0) {
    for (const ef::Dependency& d : op.deps) {
      const std::size_t target = tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)].first_op +
                                 static_cast<std::size_t>(d.op);
      if (completed_[target] <= t.iteration) {
        s << "dependency tb " << d.tb << " op " << d.op << " to complete iteration " << t.iteration;
        return s.str();
      }
    }
  }
  if (ef::op_receives(op.code)) {
    const TimedConnection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
    if (in.arrivals.empty()) {
      s << "data from rank " << in.sender << " on channel " << in.channel << " (connection empty)";
      return s.str();
    }
  }
  const TimedConnection& out = connections_[static_cast<std::size_t>(t.send_connection)];
  s << "a free slot on connection " << out.sender << "->" << out.receiver << " channel "
    << out.channel << " (all " << slots_ << " slots full)";
  return s.str();
}

TimingResult Simulation::run() {
  result_.iterations = iterations_;
  if (iterations_ == 0) return result_;  // no data: nothing is launched
  for (std::size_t i = 0; i < tbs_.size(); ++i) schedule(i);
  while (!queue_.empty()) {
    const auto [ready, index] = queue_.top();
    queue_.pop();
    step(index, ready);
  }
  for (const TimedThreadblock& t : tbs_)
    if (!t.done)
      result_.blocked.push_back(
          BlockedThreadblock{t.rank, t.tb, static_cast<int>(t.op), t.iteration, waits_for(t)});
  if (!result_.blocked.empty()) {
    result_.deadlock = true;
    std::ostringstream report;
    for (const BlockedThreadblock& b : result_.blocked)
      report << "rank " << b.rank << " tb " << b.tb << " op " << b.op << " iteration "
             << b.iteration << ": waits for " << b.waits_for << '\n';
    result_.status = Status::error("deadlock: " + std::to_string(result_.blocked.size()) + " of " +
                                   std::to_string(tbs_.size()) +
                                   " threadblocks blocked and none can progress\n" + report.str());
    return result_;
  }
  for (const auto& [key, port] : link_ports_)
    result_.busiest_port_us = std::max(result_.busiest_port_us, port.busy_us);
  for (const auto& [device, port] : memory_)
    result_.busiest_port_us = std::max(result_.busiest_port_us, port.busy_us);
  result_.time_us = model_.launch_overhead_us + finish_;
  return result_;
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
  Simulation simulation(program, options, model, *ef::chunk_elements(program, options.count));
  simulation.prepare();
  return simulation.run();
}

}  // namespace efccl::host
