// Discrete-event interpretation of a Program (docs/ef-format.md §5): every threadblock of every
// rank is a state machine (iteration, op, unit) visited in one fixed round-robin order; each
// visit runs it until it blocks on a connection or a dependency. Connections are bounded FIFOs
// whose slot storage is allocated once, before the run.
#include "efccl/host/executor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <tuple>

#include "efccl/ef/premul_analysis.h"
#include "efccl/host/numeric.h"
#include "index_check.h"

namespace efccl::host {
namespace {

using ef::BufferKind;
using ef::OpCode;

/// a * b, or nullopt when it does not fit in 64 bits.
std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

/// Checks everything about the call that does not depend on the buffers.
Status check_call(const ef::Program& p, const ExecOptions& o) {
  if (Status s = check_indices(p); !s) return s;
  if (Status s = ef::check_call(p, o.count, o.dtype, o.op, o.inplace, o.premul_scalars.size()); !s)
    return s;
  if (o.connection_slots < 1)
    return Status::error("connection_slots must be at least 1, got " +
                         std::to_string(o.connection_slots));
  const auto b = ef::chunk_elements(p, o.count);
  // Every buffer, API or program, must have a byte size that fits in 64 bits.
  const uint64_t size = ef::size_of(o.dtype);
  for (int r = 0; r < p.nranks; ++r) {
    const ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    for (const int64_t chunks : {rank.input_chunks, rank.output_chunks, rank.scratch_chunks}) {
      const auto elements = checked_mul(*b, static_cast<uint64_t>(chunks));
      if (!elements || !checked_mul(*elements, size))
        return Status::error("rank " + std::to_string(r) + ": a buffer of " +
                             std::to_string(chunks) + " chunks of " + std::to_string(*b) +
                             " elements overflows 64-bit byte sizes");
    }
    const ApiLayout l = api_layout(p, r, o.count, o.inplace);
    if (!checked_mul(std::max(l.shared_elements, std::max(l.input_elements, l.output_elements)),
                     size))
      return Status::error("rank " + std::to_string(r) + ": API buffers overflow 64-bit sizes");
  }
  return Status::ok();
}

/// A bounded FIFO of units between two threadblocks; storage is one block of `capacity` slots.
struct Connection {
  int sender = 0, receiver = 0, channel = 0;
  std::size_t capacity = 0;  ///< slots, at most the units that will ever be pushed
  std::size_t head = 0;      ///< slot of the oldest unit
  std::size_t filled = 0;
  std::vector<uint8_t> storage;

  bool empty() const { return filled == 0; }
  bool full() const { return filled == capacity; }
};

/// Where a threadblock is in its program.
struct ThreadblockState {
  int rank = 0, tb = 0;
  const ef::Threadblock* def = nullptr;
  std::size_t first_op = 0;       ///< index of its op 0 in Execution::completed_
  std::size_t rank_first_tb = 0;  ///< index of the rank's tb 0 in Execution::tbs_
  int send_connection = -1, recv_connection = -1;
  uint64_t iteration = 0;
  std::size_t op = 0;
  int64_t unit = 0;  ///< units of the current op done in this iteration; > 0: op started
  /// Dependencies of the current op known met in this iteration: completion only grows, so
  /// each dependency is checked until met and never again (reset when the op changes).
  std::size_t deps_met = 0;
  bool done = false;
};

class Execution {
 public:
  Execution(const ef::Program& p, const ExecOptions& o, uint64_t chunk_elements)
      : program_(p), options_(o), chunk_elements_(chunk_elements) {
    const std::size_t slot_bytes =
        o.slot_bytes != 0 ? o.slot_bytes : default_slot_bytes(p.protocol);
    element_size_ = ef::size_of(o.dtype);
    stride_elements_ = std::max<uint64_t>(1, slot_bytes / element_size_);
    iterations_ =
        chunk_elements == 0 ? 0 : (chunk_elements + stride_elements_ - 1) / stride_elements_;
    tile_bytes_ = std::min(stride_elements_, chunk_elements) * element_size_;
  }

  uint64_t iterations() const { return iterations_; }

  /// Lays the program's buffers over the user's (NCCL's aliasing) and allocates the rest.
  Status prepare(std::vector<RankBuffers>& buffers);
  /// Runs to completion or deadlock.
  ExecResult run();
  /// Integer avg's last step: divides the API output's result region by nranks.
  void divide_integer_average(std::vector<RankBuffers>& buffers);

 private:
  /// Where a program buffer of a rank starts: in the user's memory or the executor's.
  uint8_t*& base(int rank, BufferKind b) {
    return bases_[static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(b)];
  }
  Status prepare_buffers(int rank, RankBuffers& buffers);
  void prepare_connections();
  Status prepare_premul();

  bool advance(ThreadblockState& t);
  bool dependencies_met(ThreadblockState& t, const ef::Op& op) const;
  bool try_unit(ThreadblockState& t, const ef::Op& op);
  uint8_t* element(int rank, const ef::BufferRef& ref, int64_t unit);
  const uint8_t* src_operand(const ThreadblockState& t, const uint8_t* src, std::size_t n);
  std::string waits_for(const ThreadblockState& t) const;

  const ef::Program& program_;
  const ExecOptions& options_;
  uint64_t chunk_elements_;
  std::size_t element_size_ = 1;
  uint64_t stride_elements_ = 1;  ///< E: elements per full tile
  uint64_t iterations_ = 0;
  std::size_t tile_bytes_ = 0;  ///< bytes of a full tile (a slot's size)

  std::vector<uint8_t*> bases_;                       ///< [rank * 3 + BufferKind]
  std::vector<std::vector<uint8_t>> private_memory_;  ///< scratch and buffers the API lacks
  std::vector<Connection> connections_;
  std::vector<ThreadblockState> tbs_;
  std::vector<uint64_t> completed_;  ///< per op of every threadblock: iterations completed
  /// Pre-multiplication (premulsum, float avg): per op, which operand reads to scale.
  std::vector<ef::PremulFlags> premul_;
  std::vector<double> scalars_;        ///< per rank
  std::vector<uint8_t> operand_tile_;  ///< a scaled or staged src tile
  std::vector<uint8_t> result_tile_;   ///< rrc's result before it is written
  uint64_t tile_elements_now_ = 0;     ///< elements of the tile being processed
  uint64_t tile_start_now_ = 0;        ///< its first element within the chunk
};

Status Execution::prepare_buffers(int r, RankBuffers& buffers) {
  const ef::Rank& rank = program_.ranks[static_cast<std::size_t>(r)];
  const ApiLayout l = api_layout(program_, r, options_.count, options_.inplace);
  const std::size_t size = element_size_;
  const auto check_bytes = [&](const std::vector<uint8_t>& v, uint64_t elements,
                               const char* name) -> Status {
    if (v.size() == elements * size) return Status::ok();
    return Status::error("rank " + std::to_string(r) + ": " + name + " buffer has " +
                         std::to_string(v.size()) + " bytes; expected " +
                         std::to_string(elements * size) + " (" + std::to_string(elements) +
                         " elements of " + std::string(ef::to_string(options_.dtype)) + ")");
  };
  const auto make_private = [&](uint64_t elements) {
    private_memory_.emplace_back(elements * size, kPoisonByte);
    return private_memory_.back().data();
  };
  const uint64_t program_elements[2] = {
      chunk_elements_ * static_cast<uint64_t>(rank.input_chunks),
      chunk_elements_ * static_cast<uint64_t>(rank.output_chunks)};
  const char* names[2] = {"input", "output"};

  if (l.shared) {
    if (Status s = check_bytes(buffers.input, 0, "input (in-place: must be empty)"); !s) return s;
    if (Status s = check_bytes(buffers.output, l.shared_elements, "shared in-place"); !s) return s;
    const uint64_t offsets[2] = {l.input_offset, l.output_offset};
    for (int k = 0; k < 2; ++k) {
      if (program_elements[k] > l.shared_elements - offsets[k])
        return Status::error("rank " + std::to_string(r) + ": the program's " + names[k] +
                             " buffer (" + std::to_string(program_elements[k]) + " elements at " +
                             std::to_string(offsets[k]) +
                             ") does not fit in the in-place region of " +
                             std::to_string(l.shared_elements) + " elements");
      base(r, static_cast<BufferKind>(k)) = buffers.output.data() + offsets[k] * size;
    }
  } else {
    std::vector<uint8_t>* api[2] = {&buffers.input, &buffers.output};
    const uint64_t api_elements[2] = {l.input_elements, l.output_elements};
    for (int k = 0; k < 2; ++k) {
      if (Status s = check_bytes(*api[k], api_elements[k], names[k]); !s) return s;
      if (program_elements[k] <= api_elements[k]) {
        base(r, static_cast<BufferKind>(k)) = api[k]->data();
      } else if (api_elements[k] == 0) {
        // e.g. the output of a non-root rank of reduce: the program uses it, the API has none.
        base(r, static_cast<BufferKind>(k)) = make_private(program_elements[k]);
      } else {
        return Status::error("rank " + std::to_string(r) + ": the program's " + names[k] +
                             " buffer has " + std::to_string(program_elements[k]) +
                             " elements but the API's has " + std::to_string(api_elements[k]));
      }
    }
  }
  base(r, BufferKind::kScratch) =
      make_private(chunk_elements_ * static_cast<uint64_t>(rank.scratch_chunks));
  return Status::ok();
}

void Execution::prepare_connections() {
  std::map<std::tuple<int, int, int>, int> index;
  const auto connection_of = [&](int sender, int receiver, int channel) {
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
  for (ThreadblockState& t : tbs_) {
    if (t.def->send_peer >= 0)
      t.send_connection = connection_of(t.rank, t.def->send_peer, t.def->channel);
    if (t.def->recv_peer >= 0)
      t.recv_connection = connection_of(t.def->recv_peer, t.rank, t.def->channel);
  }
  // No connection ever holds more units than are pushed into it: with generous `slots` this,
  // not the slot count, bounds its storage.
  std::vector<uint64_t> units_pushed(connections_.size(), 0);
  for (const ThreadblockState& t : tbs_) {
    if (t.send_connection < 0) continue;
    uint64_t per_iteration = 0;
    for (const ef::Op& op : t.def->ops)
      if (ef::op_sends(op.code)) per_iteration += static_cast<uint64_t>(op.count);
    uint64_t& units = units_pushed[static_cast<std::size_t>(t.send_connection)];
    const auto total = checked_mul(per_iteration, iterations_);
    if (!total || __builtin_add_overflow(units, *total, &units))
      units = std::numeric_limits<uint64_t>::max();
  }
  for (std::size_t c = 0; c < connections_.size(); ++c) {
    Connection& conn = connections_[c];
    conn.capacity = static_cast<std::size_t>(
        std::min<uint64_t>(static_cast<uint64_t>(options_.connection_slots), units_pushed[c]));
    conn.storage.resize(conn.capacity * tile_bytes_);
  }
}

Status Execution::prepare_premul() {
  const bool premul = ef::collective_reduces(program_.collective) &&
                      (options_.op == ef::RedOp::kPreMulSum ||
                       (options_.op == ef::RedOp::kAvg && ef::is_floating(options_.dtype)));
  if (!premul) return Status::ok();
  const ef::PremulMap map = ef::analyze_premul(program_, options_.inplace);
  // An operand mixing pristine and written input chunks would be scaled not at all.
  if (std::string mixed = ef::describe_mixed_operand(program_, map, options_.inplace);
      !mixed.empty())
    return Status::error(mixed);
  premul_.assign(completed_.size(), ef::PremulFlags{});
  for (const ThreadblockState& t : tbs_) {
    const auto r = static_cast<std::size_t>(t.rank);
    const auto b = static_cast<std::size_t>(t.tb);
    for (std::size_t i = 0; i < t.def->ops.size(); ++i)
      if (r < map.size() && b < map[r].size() && i < map[r][b].size())
        premul_[t.first_op + i] = map[r][b][i];
  }
  scalars_.assign(static_cast<std::size_t>(program_.nranks), 1.0);
  for (std::size_t r = 0; r < scalars_.size(); ++r) {
    if (options_.op == ef::RedOp::kAvg) {
      scalars_[r] = 1.0 / static_cast<double>(program_.nranks);
    } else if (!options_.premul_scalars.empty()) {
      scalars_[r] = options_.premul_scalars[r];
    }
  }
  return Status::ok();
}

Status Execution::prepare(std::vector<RankBuffers>& buffers) {
  try {
    bases_.assign(static_cast<std::size_t>(program_.nranks) * 3, nullptr);
    for (int r = 0; r < program_.nranks; ++r) {
      if (Status s = prepare_buffers(r, buffers[static_cast<std::size_t>(r)]); !s) return s;
      const ef::Rank& rank = program_.ranks[static_cast<std::size_t>(r)];
      const std::size_t rank_first_tb = tbs_.size();
      for (std::size_t t = 0; t < rank.threadblocks.size(); ++t) {
        ThreadblockState s;
        s.rank = r;
        s.tb = static_cast<int>(t);
        s.def = &rank.threadblocks[t];
        s.first_op = completed_.size();
        s.rank_first_tb = rank_first_tb;
        s.done = iterations_ == 0 || s.def->ops.empty();
        completed_.resize(completed_.size() + s.def->ops.size(), 0);
        tbs_.push_back(s);
      }
    }
    prepare_connections();
    if (Status s = prepare_premul(); !s) return s;
    operand_tile_.resize(tile_bytes_);
    result_tile_.resize(tile_bytes_);
  } catch (const std::bad_alloc&) {
    return Status::error("cannot allocate the executor's memory (scratch, slots) for count " +
                         std::to_string(options_.count));
  }
  return Status::ok();
}

uint8_t* Execution::element(int rank, const ef::BufferRef& ref, int64_t unit) {
  const uint64_t chunk = static_cast<uint64_t>(ref.offset + unit);
  return base(rank, ref.buffer) + (chunk * chunk_elements_ + tile_start_now_) * element_size_;
}

bool Execution::dependencies_met(ThreadblockState& t, const ef::Op& op) const {
  for (; t.deps_met < op.deps.size(); ++t.deps_met) {
    const ef::Dependency& d = op.deps[t.deps_met];
    const ThreadblockState& target = tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)];
    if (completed_[target.first_op + static_cast<std::size_t>(d.op)] <= t.iteration) return false;
  }
  return true;
}

/// The src tile as the op must read it: scaled by the rank's scalar when the read is pristine
/// under a pre-multiplying operator, otherwise in place.
const uint8_t* Execution::src_operand(const ThreadblockState& t, const uint8_t* src,
                                      std::size_t n) {
  if (premul_.empty() || !premul_[t.first_op + t.op].src) return src;
  scale_elements(options_.dtype, scalars_[static_cast<std::size_t>(t.rank)], operand_tile_.data(),
                 src, n);
  return operand_tile_.data();
}

bool Execution::try_unit(ThreadblockState& t, const ef::Op& op) {
  Connection* in = ef::op_receives(op.code)
                       ? &connections_[static_cast<std::size_t>(t.recv_connection)]
                       : nullptr;
  Connection* out =
      ef::op_sends(op.code) ? &connections_[static_cast<std::size_t>(t.send_connection)] : nullptr;
  if ((in != nullptr && in->empty()) || (out != nullptr && out->full())) return false;

  const std::size_t n = tile_elements_now_;
  const std::size_t bytes = n * element_size_;
  const ef::DataType type = options_.dtype;
  const ef::RedOp red = options_.op;
  uint8_t* src = op.src ? element(t.rank, *op.src, t.unit) : nullptr;
  uint8_t* dst = op.dst ? element(t.rank, *op.dst, t.unit) : nullptr;
  const uint8_t* popped = in != nullptr ? in->storage.data() + in->head * tile_bytes_ : nullptr;
  uint8_t* pushed = out != nullptr ? out->storage.data() +
                                         ((out->head + out->filled) % out->capacity) * tile_bytes_
                                   : nullptr;

  switch (op.code) {
    case OpCode::kSend:
      std::memcpy(pushed, src_operand(t, src, n), bytes);
      break;
    case OpCode::kRecv:
      std::memcpy(dst, popped, bytes);
      break;
    case OpCode::kCopy:
      std::memmove(dst, src_operand(t, src, n), bytes);  // in-place aliasing may overlap
      break;
    case OpCode::kReduce: {
      // Stage src first: scaling dst in place, or overlapping operands, must not change it.
      const uint8_t* operand = src_operand(t, src, n);
      if (operand == src) {
        std::memcpy(operand_tile_.data(), src, bytes);
        operand = operand_tile_.data();
      }
      if (!premul_.empty() && premul_[t.first_op + t.op].dst)
        scale_elements(type, scalars_[static_cast<std::size_t>(t.rank)], dst, dst, n);
      reduce_elements(type, red, dst, operand, n);
      break;
    }
    case OpCode::kRecvCopySend:
      std::memcpy(dst, popped, bytes);
      std::memcpy(pushed, popped, bytes);
      break;
    case OpCode::kRecvReduceCopy:
      std::memcpy(result_tile_.data(), popped, bytes);
      reduce_elements(type, red, result_tile_.data(), src_operand(t, src, n), n);
      std::memcpy(dst, result_tile_.data(), bytes);
      break;
    case OpCode::kRecvReduceSend:
    case OpCode::kRecvReduceCopySend:
      std::memcpy(pushed, popped, bytes);
      reduce_elements(type, red, pushed, src_operand(t, src, n), n);
      if (op.code == OpCode::kRecvReduceCopySend) std::memcpy(dst, pushed, bytes);
      break;
    case OpCode::kNop:
      break;
  }
  if (in != nullptr) {
    in->head = (in->head + 1) % in->capacity;
    --in->filled;
  }
  if (out != nullptr) ++out->filled;
  return true;
}

/// Runs the threadblock until it blocks or finishes; true when it did anything.
bool Execution::advance(ThreadblockState& t) {
  bool progressed = false;
  const std::vector<ef::Op>& ops = t.def->ops;
  while (!t.done) {
    const ef::Op& op = ops[t.op];
    if (t.unit == 0 && !dependencies_met(t, op)) return progressed;
    tile_start_now_ = t.iteration * stride_elements_;
    tile_elements_now_ = std::min(stride_elements_, chunk_elements_ - tile_start_now_);
    while (t.unit < op.count) {
      if (!try_unit(t, op)) return progressed;
      ++t.unit;
      progressed = true;
    }
    completed_[t.first_op + t.op] = t.iteration + 1;
    progressed = true;
    t.unit = 0;
    t.deps_met = 0;  // the next op, or this one in the next iteration, starts over
    if (++t.op == ops.size()) {
      t.op = 0;
      t.done = ++t.iteration == iterations_;
    }
  }
  return progressed;
}

std::string Execution::waits_for(const ThreadblockState& t) const {
  const ef::Op& op = t.def->ops[t.op];
  std::ostringstream s;
  if (t.unit == 0) {
    for (std::size_t k = t.deps_met; k < op.deps.size(); ++k) {
      const ef::Dependency& d = op.deps[k];
      const ThreadblockState& target = tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)];
      if (completed_[target.first_op + static_cast<std::size_t>(d.op)] <= t.iteration) {
        s << "dependency tb " << d.tb << " op " << d.op << " to complete iteration " << t.iteration;
        return s.str();
      }
    }
  }
  if (ef::op_receives(op.code)) {
    const Connection& in = connections_[static_cast<std::size_t>(t.recv_connection)];
    if (in.empty()) {
      s << "data from rank " << in.sender << " on channel " << in.channel << " (connection empty)";
      return s.str();
    }
  }
  const Connection& out = connections_[static_cast<std::size_t>(t.send_connection)];
  s << "a free slot on connection " << out.sender << "->" << out.receiver << " channel "
    << out.channel << " (all " << out.capacity << " slots full)";
  return s.str();
}

void Execution::divide_integer_average(std::vector<RankBuffers>& buffers) {
  if (chunk_elements_ == 0) return;
  const auto n = static_cast<uint64_t>(program_.nranks);
  const auto divide = [&](int r, uint64_t first, uint64_t elements) {
    const ApiLayout l = api_layout(program_, r, options_.count, options_.inplace);
    uint8_t* base = buffers[static_cast<std::size_t>(r)].output.data() +
                    ((l.shared ? l.output_offset : 0) + first) * element_size_;
    divide_elements(options_.dtype, n, base, static_cast<std::size_t>(elements));
  };
  switch (program_.collective) {
    case ef::Collective::kAllReduce:
    case ef::Collective::kReduceScatter:
      for (int r = 0; r < program_.nranks; ++r) divide(r, 0, options_.count);
      break;
    case ef::Collective::kReduce:
      divide(program_.root, 0, options_.count);
      break;
    case ef::Collective::kCustom: {
      // Each output chunk a postcondition defines, once even if named twice.
      std::vector<std::vector<bool>> divided(static_cast<std::size_t>(program_.nranks));
      for (const ef::Postcondition& pc : program_.postconditions) {
        if (pc.rank < 0 || pc.rank >= program_.nranks || pc.index < 0) continue;
        const uint64_t chunks =
            ef::api_output_elements(program_, pc.rank, options_.count) / chunk_elements_;
        if (static_cast<uint64_t>(pc.index) >= chunks) continue;
        auto& marks = divided[static_cast<std::size_t>(pc.rank)];
        if (marks.size() <= static_cast<std::size_t>(pc.index))
          marks.resize(static_cast<std::size_t>(pc.index) + 1, false);
        if (marks[static_cast<std::size_t>(pc.index)]) continue;
        marks[static_cast<std::size_t>(pc.index)] = true;
        divide(pc.rank, static_cast<uint64_t>(pc.index) * chunk_elements_, chunk_elements_);
      }
      break;
    }
    default:
      break;  // collectives without a reduction ignore the operator
  }
}

ExecResult Execution::run() {
  ExecResult result;
  result.iterations = iterations_;
  std::size_t remaining = 0;
  for (const ThreadblockState& t : tbs_) remaining += t.done ? 0 : 1;
  while (remaining > 0) {
    bool progressed = false;
    for (ThreadblockState& t : tbs_) {
      if (t.done) continue;
      progressed |= advance(t);
      if (t.done) --remaining;
    }
    if (progressed) continue;
    result.deadlock = true;
    for (const ThreadblockState& t : tbs_)
      if (!t.done)
        result.blocked.push_back(
            BlockedThreadblock{t.rank, t.tb, static_cast<int>(t.op), t.iteration, waits_for(t)});
    result.status =
        Status::error("deadlock: " + std::to_string(result.blocked.size()) + " of " +
                      std::to_string(tbs_.size()) +
                      " threadblocks blocked and none can progress\n" + result.deadlock_report());
    return result;
  }
  return result;
}

}  // namespace

std::size_t default_slot_bytes(ef::Protocol protocol) {
  switch (protocol) {
    case ef::Protocol::kSimple:
      return 512 * 1024;
    case ef::Protocol::kLL128:
      return 480 * 1024;  // 120 payload bytes of every 128
    case ef::Protocol::kLL:
      return 32 * 1024;  // half of every 16-byte line is flags
  }
  return 512 * 1024;
}

std::string ExecResult::deadlock_report() const {
  std::ostringstream s;
  for (const BlockedThreadblock& b : blocked)
    s << "rank " << b.rank << " tb " << b.tb << " op " << b.op << " iteration " << b.iteration
      << ": waits for " << b.waits_for << '\n';
  return s.str();
}

ApiLayout api_layout(const ef::Program& program, int32_t rank, uint64_t count, bool inplace) {
  ApiLayout l;
  l.input_elements = ef::api_input_elements(program, rank, count);
  l.output_elements = ef::api_output_elements(program, rank, count);
  if (!inplace) return l;
  const auto alias = ef::inplace_alias(program, rank, count);
  if (!alias) return l;
  l.shared = true;
  if (alias->input_inside_output) {
    l.input_offset = alias->offset_elements;
    l.shared_elements = std::max(l.output_elements, l.input_offset + l.input_elements);
  } else {
    l.output_offset = alias->offset_elements;
    l.shared_elements = std::max(l.input_elements, l.output_offset + l.output_elements);
  }
  return l;
}

StatusOr<std::vector<RankBuffers>> make_buffers(const ef::Program& program,
                                                const ExecOptions& options) {
  if (Status s = check_call(program, options); !s) return s;
  const std::size_t size = ef::size_of(options.dtype);
  try {
    std::vector<RankBuffers> buffers(static_cast<std::size_t>(program.nranks));
    for (int r = 0; r < program.nranks; ++r) {
      const ApiLayout l = api_layout(program, r, options.count, options.inplace);
      RankBuffers& b = buffers[static_cast<std::size_t>(r)];
      if (l.shared) {
        b.output.resize(l.shared_elements * size);
      } else {
        b.input.resize(l.input_elements * size);
        b.output.resize(l.output_elements * size);
      }
    }
    return buffers;
  } catch (const std::bad_alloc&) {
    return Status::error("cannot allocate the API buffers for count " +
                         std::to_string(options.count));
  }
}

ExecResult execute(const ef::Program& program, const ExecOptions& options,
                   std::vector<RankBuffers>& buffers) {
  ExecResult result;
  result.status = check_call(program, options);
  if (!result.status) return result;
  if (buffers.size() != static_cast<std::size_t>(program.nranks)) {
    result.status = Status::error("got buffers for " + std::to_string(buffers.size()) +
                                  " ranks; the program has " + std::to_string(program.nranks));
    return result;
  }
  Execution execution(program, options, *ef::chunk_elements(program, options.count));
  result.iterations = execution.iterations();
  result.status = execution.prepare(buffers);
  if (!result.status) return result;
  result = execution.run();
  if (result.status && options.op == ef::RedOp::kAvg && !ef::is_floating(options.dtype))
    execution.divide_integer_average(buffers);
  return result;
}

std::vector<bool> allowed_inplace_modes(const ef::Program& program) {
  std::vector<bool> modes;
  if (program.outofplace) modes.push_back(false);
  if (program.inplace) modes.push_back(true);
  return modes;
}

}  // namespace efccl::host
