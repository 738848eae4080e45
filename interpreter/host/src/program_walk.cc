#include "program_walk.h"

#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace efccl::host {

TileGeometry TileGeometry::of(const ef::Program& program, const ExecOptions& options,
                              uint64_t chunk_elements) {
  TileGeometry g;
  const std::size_t slot_bytes =
      options.slot_bytes != 0 ? options.slot_bytes : default_slot_bytes(program.protocol);
  g.chunk_elements = chunk_elements;
  g.element_size = ef::size_of(options.dtype);
  g.stride_elements = std::max<uint64_t>(1, slot_bytes / g.element_size);
  g.iterations =
      chunk_elements == 0 ? 0 : (chunk_elements + g.stride_elements - 1) / g.stride_elements;
  return g;
}

ProgramWalk::ProgramWalk(const ef::Program& program, const TileGeometry& tiles, int slots,
                         bool timed)
    : program_(program),
      tiles_(tiles),
      slots_(static_cast<uint64_t>(std::max(slots, 1))),
      timed_(timed) {}

void ProgramWalk::prepare() {
  for (int32_t r = 0; r < program_.nranks; ++r) {
    const ef::Rank& rank = program_.ranks[static_cast<std::size_t>(r)];
    const std::size_t rank_first_tb = tbs_.size();
    for (std::size_t b = 0; b < rank.threadblocks.size(); ++b) {
      WalkThreadblock t;
      t.rank = r;
      t.tb = static_cast<int32_t>(b);
      t.def = &rank.threadblocks[b];
      t.first_op = completed_.size();
      t.rank_first_tb = rank_first_tb;
      t.done = tiles_.iterations == 0 || t.def->ops.empty();
      completed_.resize(completed_.size() + t.def->ops.size(), 0);
      tbs_.push_back(t);
    }
  }
  is_target_.assign(completed_.size(), false);
  for (const WalkThreadblock& t : tbs_)
    for (const ef::Op& op : t.def->ops)
      for (const ef::Dependency& d : op.deps) is_target_[target_of(t, d)] = true;
  if (timed_) completion_times_.resize(completed_.size());
  op_waiters_.resize(completed_.size());

  std::map<std::tuple<int32_t, int32_t, int32_t>, int> index;
  const auto connection_of = [&](int32_t sender, int32_t receiver, int32_t channel) {
    auto [it, inserted] =
        index.try_emplace({sender, receiver, channel}, static_cast<int>(connections_.size()));
    if (inserted) {
      connections_.emplace_back();
      connections_.back().sender = sender;
      connections_.back().receiver = receiver;
      connections_.back().channel = channel;
    }
    return it->second;
  };
  for (std::size_t i = 0; i < tbs_.size(); ++i) {
    WalkThreadblock& t = tbs_[i];
    if (t.def->send_peer >= 0) {
      t.send_connection = connection_of(t.rank, t.def->send_peer, t.def->channel);
      connections_[static_cast<std::size_t>(t.send_connection)].senders.push_back(i);
    }
    if (t.def->recv_peer >= 0) {
      t.recv_connection = connection_of(t.def->recv_peer, t.rank, t.def->channel);
      connections_[static_cast<std::size_t>(t.recv_connection)].receivers.push_back(i);
    }
  }
  // No connection ever holds more units than are pushed into it: with generous `slots` this,
  // not the slot count, bounds what a connection's slots take.
  std::vector<uint64_t> units_pushed(connections_.size(), 0);
  for (const WalkThreadblock& t : tbs_) {
    if (t.send_connection < 0) continue;
    uint64_t per_iteration = 0;
    for (const ef::Op& op : t.def->ops)
      if (ef::op_sends(op.code) &&
          __builtin_add_overflow(per_iteration, static_cast<uint64_t>(op.count), &per_iteration))
        per_iteration = std::numeric_limits<uint64_t>::max();
    uint64_t& units = units_pushed[static_cast<std::size_t>(t.send_connection)];
    uint64_t total = 0;
    if (__builtin_mul_overflow(per_iteration, tiles_.iterations, &total) ||
        __builtin_add_overflow(units, total, &units))
      units = std::numeric_limits<uint64_t>::max();
  }
  for (std::size_t c = 0; c < connections_.size(); ++c) {
    WalkConnection& conn = connections_[c];
    conn.capacity = static_cast<std::size_t>(std::max<uint64_t>(1, std::min(slots_, units_pushed[c])));
    if (timed_) conn.slot_free_at.assign(conn.capacity, 0.0);
  }
}

void ProgramWalk::schedule(std::size_t index) {
  WalkThreadblock& t = tbs_[index];
  if (t.done || t.queued) return;
  const ef::Op& op = t.def->ops[t.op];
  if (t.unit == 0) {
    for (; t.deps_met < op.deps.size(); ++t.deps_met) {
      const std::size_t target = target_of(t, op.deps[t.deps_met]);
      if (completed_[target] <= t.iteration) {
        if (t.waits_on_op != target) {  // the target's completion wakes it
          op_waiters_[target].push_back(index);
          t.waits_on_op = target;
        }
        return;
      }
      if (timed_) t.deps_ready = std::max(t.deps_ready, completion_times_[target][t.iteration]);
    }
  }
  double ready = std::max(t.free_at, t.deps_ready);
  if (t.unit < op.count) {
    if (ef::op_receives(op.code)) {
      const WalkConnection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
      if (in.arrivals.empty()) return;  // the sender's push wakes it
      ready = std::max(ready, in.arrivals.front());
    }
    if (ef::op_sends(op.code)) {
      const WalkConnection& out = connections_[static_cast<std::size_t>(t.send_connection)];
      if (out.pushed - out.popped >= slots_) return;  // the receiver's pop wakes it
      // The slot this push takes was freed by the pop of unit pushed - slots.
      if (timed_ && out.pushed >= slots_)
        ready = std::max(ready, out.slot_free_at[(out.pushed - slots_) % out.capacity]);
    }
  }
  t.queued = true;
  queue_.push({ready, index});
}

void ProgramWalk::step(std::size_t index, double ready, UnitCost& cost) {
  WalkThreadblock& t = tbs_[index];
  t.queued = false;
  const ef::Op& op = t.def->ops[t.op];
  double end = ready;
  if (t.unit < op.count) {
    WalkConnection* in = ef::op_receives(op.code)
                             ? &connections_[static_cast<std::size_t>(t.recv_connection)]
                             : nullptr;
    WalkConnection* out = ef::op_sends(op.code)
                              ? &connections_[static_cast<std::size_t>(t.send_connection)]
                              : nullptr;
    WalkUnit unit{t, op};
    unit.tile_start = tiles_.tile_start(t.iteration);
    unit.tile_elements = tiles_.tile_elements(t.iteration);
    if (in != nullptr) unit.pop_slot = static_cast<std::size_t>(in->popped % in->capacity);
    if (out != nullptr) unit.push_slot = static_cast<std::size_t>(out->pushed % out->capacity);
    unit.ready = ready;
    end = cost.run(unit);
    if (out != nullptr) {
      out->arrivals.push_back(end + cost.latency(static_cast<std::size_t>(t.send_connection)));
      ++out->pushed;
      woken_.insert(woken_.end(), out->receivers.begin(), out->receivers.end());
    }
    if (in != nullptr) {
      in->arrivals.pop_front();
      if (timed_)
        in->slot_free_at[unit.pop_slot] =
            end + cost.latency(static_cast<std::size_t>(t.recv_connection));
      ++in->popped;
      woken_.insert(woken_.end(), in->senders.begin(), in->senders.end());
    }
    ++t.unit;
  }
  t.free_at = end;
  if (t.unit >= op.count) {
    const std::size_t g = t.op_index();
    completed_[g] = t.iteration + 1;
    if (timed_ && is_target_[g]) completion_times_[g].push_back(end);
    woken_.insert(woken_.end(), op_waiters_[g].begin(), op_waiters_[g].end());
    for (const std::size_t w : op_waiters_[g]) tbs_[w].waits_on_op = SIZE_MAX;
    op_waiters_[g].clear();
    t.unit = 0;
    t.deps_met = 0;  // the next op, or this one in the next iteration, starts over
    t.deps_ready = 0;
    if (++t.op == t.def->ops.size()) {
      t.op = 0;
      t.done = ++t.iteration == tiles_.iterations;
      if (t.done) finish_ = std::max(finish_, end);
    }
  }
  woken_.push_back(index);
  for (const std::size_t w : woken_) schedule(w);  // schedule() never adds to woken_
  woken_.clear();
}

std::vector<BlockedThreadblock> ProgramWalk::run(UnitCost& cost) {
  for (std::size_t i = 0; i < tbs_.size(); ++i) schedule(i);
  while (!queue_.empty()) {
    const auto [ready, index] = queue_.top();
    queue_.pop();
    step(index, ready, cost);
  }
  std::vector<BlockedThreadblock> blocked;
  for (const WalkThreadblock& t : tbs_)
    if (!t.done)
      blocked.push_back(
          BlockedThreadblock{t.rank, t.tb, static_cast<int>(t.op), t.iteration, waits_for(t)});
  return blocked;
}

std::string ProgramWalk::waits_for(const WalkThreadblock& t) const {
  const ef::Op& op = t.def->ops[t.op];
  std::ostringstream s;
  if (t.unit == 0) {
    for (std::size_t k = t.deps_met; k < op.deps.size(); ++k) {
      const ef::Dependency& d = op.deps[k];
      if (completed_[target_of(t, d)] <= t.iteration) {
        s << "dependency tb " << d.tb << " op " << d.op << " to complete iteration " << t.iteration;
        return s.str();
      }
    }
  }
  if (ef::op_receives(op.code)) {
    const WalkConnection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
    if (in.arrivals.empty()) {
      s << "data from rank " << in.sender << " on channel " << in.channel << " (connection empty)";
      return s.str();
    }
  }
  const WalkConnection& out = connections_[static_cast<std::size_t>(t.send_connection)];
  s << "a free slot on connection " << out.sender << "->" << out.receiver << " channel "
    << out.channel << " (all " << slots_ << " slots full)";
  return s.str();
}

Status deadlock_status(const std::vector<BlockedThreadblock>& blocked, std::size_t threadblocks) {
  ExecResult described;
  described.blocked = blocked;
  return Status::error("deadlock: " + std::to_string(blocked.size()) + " of " +
                       std::to_string(threadblocks) +
                       " threadblocks blocked and none can progress\n" +
                       described.deadlock_report());
}

}  // namespace efccl::host
