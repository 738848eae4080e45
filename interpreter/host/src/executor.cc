// Interpretation of a Program over host memory (docs/ef-format.md §5): the walk shared with the
// timing model (program_walk.h) decides which unit runs next; this file's cost function moves
// each unit's data, taking no time, so the lowest-numbered threadblock that can go on runs.
// Connection slots are allocated once, before the run.
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
#include "efccl/ef/validate.h"
#include "efccl/host/numeric.h"
#include "index_check.h"
#include "program_walk.h"

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
  // mrc ops read and write other ranks' buffers in the walk's order, which gives the program's
  // result only under validation's multi-rank-exclusive rule (the GPU executor validates every
  // program): a program with mrc ops runs here only if it is valid.
  if (ef::uses_multi_rank_ops(p))
    if (const auto d = ef::validate(p); !d.empty())
      return Status::error("the program has mrc ops and is not valid: " + d.front().to_string());
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

/// One call's data: the program's buffers laid over the user's, the connections' slots, and
/// the operations of a unit (the walk's cost function: it moves data and takes no time).
class Execution final : public UnitCost {
 public:
  Execution(const ef::Program& p, const ExecOptions& o, uint64_t chunk_elements)
      : program_(p),
        options_(o),
        tiles_(TileGeometry::of(p, o, chunk_elements)),
        walk_(p, tiles_, o.connection_slots, /*timed=*/false) {}

  uint64_t iterations() const { return tiles_.iterations; }

  /// Lays the program's buffers over the user's (NCCL's aliasing) and allocates the rest.
  Status prepare(std::vector<RankBuffers>& buffers);
  /// Runs to completion or deadlock.
  ExecResult execute();
  /// Integer avg's last step: divides the API output's result region by nranks.
  void divide_integer_average(std::vector<RankBuffers>& buffers);

  double run(const WalkUnit& unit) override;
  double latency(std::size_t) const override { return 0; }

 private:
  /// Where a program buffer of a rank starts: in the user's memory or the executor's.
  uint8_t*& base(int rank, BufferKind b) {
    return bases_[static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(b)];
  }
  Status prepare_buffers(int rank, RankBuffers& buffers);
  Status prepare_premul();

  uint8_t* element(int rank, const ef::BufferRef& ref, int64_t unit, uint64_t tile_start);
  const uint8_t* src_operand(const WalkUnit& unit, const uint8_t* src, std::size_t n);

  const ef::Program& program_;
  const ExecOptions& options_;
  TileGeometry tiles_;
  ProgramWalk walk_;

  std::vector<uint8_t*> bases_;                       ///< [rank * 3 + BufferKind]
  std::vector<std::vector<uint8_t>> private_memory_;  ///< scratch and buffers the API lacks
  std::vector<std::vector<uint8_t>> slots_;           ///< per connection: capacity slots
  /// Pre-multiplication (premulsum, float avg): per op, which operand reads to scale.
  std::vector<ef::PremulFlags> premul_;
  std::vector<double> scalars_;        ///< per rank
  std::vector<uint8_t> operand_tile_;  ///< a scaled or staged src tile
  std::vector<uint8_t> result_tile_;   ///< rrc's result before it is written
};

Status Execution::prepare_buffers(int r, RankBuffers& buffers) {
  const ef::Rank& rank = program_.ranks[static_cast<std::size_t>(r)];
  const ApiLayout l = api_layout(program_, r, options_.count, options_.inplace);
  const std::size_t size = tiles_.element_size;
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
      tiles_.chunk_elements * static_cast<uint64_t>(rank.input_chunks),
      tiles_.chunk_elements * static_cast<uint64_t>(rank.output_chunks)};
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
      make_private(tiles_.chunk_elements * static_cast<uint64_t>(rank.scratch_chunks));
  return Status::ok();
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
  premul_.assign(walk_.op_count(), ef::PremulFlags{});
  for (const WalkThreadblock& t : walk_.threadblocks()) {
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
    for (int r = 0; r < program_.nranks; ++r)
      if (Status s = prepare_buffers(r, buffers[static_cast<std::size_t>(r)]); !s) return s;
    walk_.prepare();
    const std::size_t slot_bytes = tiles_.slot_bytes();
    for (const WalkConnection& c : walk_.connections()) {
      std::size_t bytes = 0;
      if (__builtin_mul_overflow(c.capacity, slot_bytes, &bytes))
        return Status::error("connection " + std::to_string(c.sender) + "->" +
                             std::to_string(c.receiver) + " channel " + std::to_string(c.channel) +
                             ": " + std::to_string(c.capacity) + " slots of " +
                             std::to_string(slot_bytes) + " bytes overflow 64-bit sizes");
      slots_.emplace_back(bytes);
    }
    if (Status s = prepare_premul(); !s) return s;
    operand_tile_.resize(slot_bytes);
    result_tile_.resize(slot_bytes);
  } catch (const std::bad_alloc&) {
    return Status::error("cannot allocate the executor's memory (scratch, slots) for count " +
                         std::to_string(options_.count));
  }
  return Status::ok();
}

uint8_t* Execution::element(int rank, const ef::BufferRef& ref, int64_t unit,
                            uint64_t tile_start) {
  const uint64_t chunk = static_cast<uint64_t>(ref.offset + unit);
  return base(rank, ref.buffer) + (chunk * tiles_.chunk_elements + tile_start) * tiles_.element_size;
}

/// The src tile as the op must read it: scaled by the rank's scalar when the read is pristine
/// under a pre-multiplying operator, otherwise in place.
const uint8_t* Execution::src_operand(const WalkUnit& unit, const uint8_t* src, std::size_t n) {
  if (premul_.empty() || !premul_[unit.tb.op_index()].src) return src;
  scale_elements(options_.dtype, scalars_[static_cast<std::size_t>(unit.tb.rank)],
                 operand_tile_.data(), src, n);
  return operand_tile_.data();
}

double Execution::run(const WalkUnit& unit) {
  const WalkThreadblock& t = unit.tb;
  const ef::Op& op = unit.op;
  const std::size_t n = unit.tile_elements;
  const std::size_t bytes = n * tiles_.element_size;
  const std::size_t slot_bytes = tiles_.slot_bytes();
  const ef::DataType type = options_.dtype;
  const ef::RedOp red = options_.op;
  uint8_t* src = op.src ? element(t.rank, *op.src, t.unit, unit.tile_start) : nullptr;
  uint8_t* dst = op.dst ? element(t.rank, *op.dst, t.unit, unit.tile_start) : nullptr;
  const uint8_t* popped =
      ef::op_receives(op.code)
          ? slots_[static_cast<std::size_t>(t.recv_connection)].data() + unit.pop_slot * slot_bytes
          : nullptr;
  uint8_t* pushed =
      ef::op_sends(op.code)
          ? slots_[static_cast<std::size_t>(t.send_connection)].data() + unit.push_slot * slot_bytes
          : nullptr;

  switch (op.code) {
    case OpCode::kSend:
      std::memcpy(pushed, src_operand(unit, src, n), bytes);
      break;
    case OpCode::kRecv:
      std::memcpy(dst, popped, bytes);
      break;
    case OpCode::kCopy:
      std::memmove(dst, src_operand(unit, src, n), bytes);  // in-place aliasing may overlap
      break;
    case OpCode::kReduce: {
      // Stage src first: scaling dst in place, or overlapping operands, must not change it.
      const uint8_t* operand = src_operand(unit, src, n);
      if (operand == src) {
        std::memcpy(operand_tile_.data(), src, bytes);
        operand = operand_tile_.data();
      }
      if (!premul_.empty() && premul_[t.op_index()].dst)
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
      reduce_elements(type, red, result_tile_.data(), src_operand(unit, src, n), n);
      std::memcpy(dst, result_tile_.data(), bytes);
      break;
    case OpCode::kRecvReduceSend:
    case OpCode::kRecvReduceCopySend:
      std::memcpy(pushed, popped, bytes);
      reduce_elements(type, red, pushed, src_operand(unit, src, n), n);
      if (op.code == OpCode::kRecvReduceCopySend) std::memcpy(dst, pushed, bytes);
      break;
    case OpCode::kMultiReduceCopy: {
      // Under a pre-multiplying operator every source is scaled by its own rank's scalar:
      // validation (check_call) keeps other ops from writing mrc's sources: pristine input.
      const auto read = [&](const ef::RankBufferRef& ref, uint8_t* into) {
        const uint8_t* at = element(ref.rank, {ref.buffer, ref.offset}, t.unit, unit.tile_start);
        if (premul_.empty())
          std::memcpy(into, at, bytes);
        else
          scale_elements(type, scalars_[static_cast<std::size_t>(ref.rank)], into, at, n);
      };
      read(op.sources.front(), result_tile_.data());
      for (std::size_t k = 1; k < op.sources.size(); ++k) {
        read(op.sources[k], operand_tile_.data());
        reduce_elements(type, red, result_tile_.data(), operand_tile_.data(), n);
      }
      for (const ef::RankBufferRef& ref : op.targets)
        std::memcpy(element(ref.rank, {ref.buffer, ref.offset}, t.unit, unit.tile_start),
                    result_tile_.data(), bytes);
      break;
    }
    case OpCode::kNop:
      break;
  }
  return unit.ready;  // moving data takes no time in the walk's order
}

void Execution::divide_integer_average(std::vector<RankBuffers>& buffers) {
  const uint64_t chunk_elements = tiles_.chunk_elements;
  if (chunk_elements == 0) return;
  const auto n = static_cast<uint64_t>(program_.nranks);
  const auto divide = [&](int r, uint64_t first, uint64_t elements) {
    const ApiLayout l = api_layout(program_, r, options_.count, options_.inplace);
    uint8_t* base = buffers[static_cast<std::size_t>(r)].output.data() +
                    ((l.shared ? l.output_offset : 0) + first) * tiles_.element_size;
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
            ef::api_output_elements(program_, pc.rank, options_.count) / chunk_elements;
        if (static_cast<uint64_t>(pc.index) >= chunks) continue;
        auto& marks = divided[static_cast<std::size_t>(pc.rank)];
        if (marks.size() <= static_cast<std::size_t>(pc.index))
          marks.resize(static_cast<std::size_t>(pc.index) + 1, false);
        if (marks[static_cast<std::size_t>(pc.index)]) continue;
        marks[static_cast<std::size_t>(pc.index)] = true;
        divide(pc.rank, static_cast<uint64_t>(pc.index) * chunk_elements, chunk_elements);
      }
      break;
    }
    default:
      break;  // collectives without a reduction ignore the operator
  }
}

ExecResult Execution::execute() {
  ExecResult result;
  result.iterations = tiles_.iterations;
  result.blocked = walk_.run(*this);
  if (!result.blocked.empty()) {
    result.deadlock = true;
    result.status = deadlock_status(result.blocked, walk_.threadblocks().size());
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
  result = execution.execute();
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
