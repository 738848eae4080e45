#include "efccl/ef/program.h"

#include <array>
#include <numeric>

namespace efccl::ef {
namespace {

template <typename E, std::size_t N>
std::optional<E> parse_enum(const std::array<std::string_view, N>& names, std::string_view s) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

constexpr std::array<std::string_view, 9> kCollectiveNames = {
    "allreduce", "allgather", "reducescatter", "broadcast", "reduce",
    "alltoall",  "gather",    "scatter",       "custom"};
constexpr std::array<std::string_view, 3> kProtocolNames = {"Simple", "LL", "LL128"};
constexpr std::array<std::string_view, 3> kBufferNames = {"input", "output", "scratch"};
constexpr std::array<std::string_view, 10> kOpNames = {
    "send", "recv", "copy", "reduce", "rcs", "rrc", "rrs", "rrcs", "nop", "mrc"};
constexpr std::array<std::string_view, 3> kSlotLocationNames = {"receiver", "host", "device"};
// mrc has no MSCCL spelling: its name here is for messages only, and parsing refuses it.
constexpr std::array<std::string_view, 10> kMscclOpNames = {"s",   "r",   "cpy",  "re",  "rcs",
                                                            "rrc", "rrs", "rrcs", "nop", "mrc"};

}  // namespace

bool Program::operator==(const Program& o) const {
  return name == o.name && collective == o.collective && protocol == o.protocol &&
         nranks == o.nranks && nchunksperloop == o.nchunksperloop && nchannels == o.nchannels &&
         root == o.root && inplace == o.inplace && outofplace == o.outofplace &&
         min_bytes == o.min_bytes && max_bytes == o.max_bytes && ranks == o.ranks &&
         postconditions == o.postconditions && slot_devices == o.slot_devices &&
         placements == o.placements;
}

ConnectionPlacement placement_of(const Program& p, int32_t sender, int32_t receiver,
                                 int32_t channel) {
  for (const ConnectionPlacement& c : p.placements)
    if (c.sender == sender && c.receiver == receiver && c.channel == channel) return c;
  ConnectionPlacement c;
  c.sender = sender;
  c.receiver = receiver;
  c.channel = channel;
  return c;
}

std::string_view to_string(Collective c) { return kCollectiveNames.at(static_cast<int>(c)); }
std::string_view to_string(Protocol p) { return kProtocolNames.at(static_cast<int>(p)); }
std::string_view to_string(BufferKind b) { return kBufferNames.at(static_cast<int>(b)); }
std::string_view to_string(OpCode op) { return kOpNames.at(static_cast<int>(op)); }
std::string_view to_string(SlotLocation s) { return kSlotLocationNames.at(static_cast<int>(s)); }
std::string_view to_msccl_string(OpCode op) { return kMscclOpNames.at(static_cast<int>(op)); }

std::optional<Collective> parse_collective(std::string_view s) {
  return parse_enum<Collective>(kCollectiveNames, s);
}
std::optional<Protocol> parse_protocol(std::string_view s) {
  return parse_enum<Protocol>(kProtocolNames, s);
}
std::optional<BufferKind> parse_buffer_kind(std::string_view s) {
  return parse_enum<BufferKind>(kBufferNames, s);
}
std::optional<OpCode> parse_op_code(std::string_view s) {
  return parse_enum<OpCode>(kOpNames, s);
}
std::optional<SlotLocation> parse_slot_location(std::string_view s) {
  return parse_enum<SlotLocation>(kSlotLocationNames, s);
}
std::optional<OpCode> parse_msccl_op_code(std::string_view s) {
  const std::optional<OpCode> code = parse_enum<OpCode>(kMscclOpNames, s);
  if (code == OpCode::kMultiReduceCopy) return std::nullopt;
  return code;
}

bool op_receives(OpCode op) {
  return op == OpCode::kRecv || op == OpCode::kRecvCopySend || op == OpCode::kRecvReduceCopy ||
         op == OpCode::kRecvReduceSend || op == OpCode::kRecvReduceCopySend;
}
bool op_sends(OpCode op) {
  return op == OpCode::kSend || op == OpCode::kRecvCopySend || op == OpCode::kRecvReduceSend ||
         op == OpCode::kRecvReduceCopySend;
}
bool op_reads_src(OpCode op) {
  return op == OpCode::kSend || op == OpCode::kCopy || op == OpCode::kReduce ||
         op == OpCode::kRecvReduceCopy || op == OpCode::kRecvReduceSend ||
         op == OpCode::kRecvReduceCopySend;
}
bool op_writes_dst(OpCode op) {
  return op == OpCode::kRecv || op == OpCode::kCopy || op == OpCode::kReduce ||
         op == OpCode::kRecvCopySend || op == OpCode::kRecvReduceCopy ||
         op == OpCode::kRecvReduceCopySend;
}
bool op_reduces(OpCode op) {
  return op == OpCode::kReduce || op == OpCode::kRecvReduceCopy ||
         op == OpCode::kRecvReduceSend || op == OpCode::kRecvReduceCopySend ||
         op == OpCode::kMultiReduceCopy;
}

bool uses_multi_rank_ops(const Program& p) {
  for (const Rank& rank : p.ranks)
    for (const Threadblock& tb : rank.threadblocks)
      for (const Op& op : tb.ops)
        if (op.code == OpCode::kMultiReduceCopy) return true;
  return false;
}

bool collective_reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter ||
         c == Collective::kReduce || c == Collective::kCustom;
}

bool count_is_per_block(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter ||
         c == Collective::kAllToAll || c == Collective::kGather || c == Collective::kScatter;
}

std::optional<uint64_t> chunk_elements(const Program& p, uint64_t count) {
  if (p.nchunksperloop <= 0 || p.nranks <= 0) return std::nullopt;
  uint64_t total = count;
  if (count_is_per_block(p.collective)) {
    if (count > UINT64_MAX / static_cast<uint64_t>(p.nranks)) return std::nullopt;
    total = count * static_cast<uint64_t>(p.nranks);
  }
  const auto c = static_cast<uint64_t>(p.nchunksperloop);
  if (total % c != 0) return std::nullopt;
  return total / c;
}

uint64_t count_granularity(const Program& p) {
  const auto c = static_cast<uint64_t>(p.nchunksperloop > 0 ? p.nchunksperloop : 1);
  if (!count_is_per_block(p.collective) || p.nranks <= 0) return c;
  return c / std::gcd(c, static_cast<uint64_t>(p.nranks));
}

uint64_t api_input_elements(const Program& p, int32_t rank, uint64_t count) {
  const auto n = static_cast<uint64_t>(p.nranks);
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kReduce:
    case Collective::kGather:
      return count;
    case Collective::kBroadcast:
      // NCCL ignores sendbuff off the root: a program must not touch the user's memory there.
      return rank == p.root ? count : 0;
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return count * n;
    case Collective::kScatter:
      return rank == p.root ? count * n : 0;
    case Collective::kCustom: {
      auto b = chunk_elements(p, count);
      if (!b || rank < 0 || rank >= p.nranks) return 0;
      return *b * static_cast<uint64_t>(p.ranks[static_cast<std::size_t>(rank)].input_chunks);
    }
  }
  return 0;
}

uint64_t api_output_elements(const Program& p, int32_t rank, uint64_t count) {
  const auto n = static_cast<uint64_t>(p.nranks);
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kScatter:
      return count;
    case Collective::kAllGather:
    case Collective::kAllToAll:
      return count * n;
    case Collective::kReduce:
      return rank == p.root ? count : 0;
    case Collective::kGather:
      return rank == p.root ? count * n : 0;
    case Collective::kCustom: {
      auto b = chunk_elements(p, count);
      if (!b || rank < 0 || rank >= p.nranks) return 0;
      return *b * static_cast<uint64_t>(p.ranks[static_cast<std::size_t>(rank)].output_chunks);
    }
  }
  return 0;
}

std::optional<InPlaceAlias> inplace_alias(const Program& p, int32_t rank, uint64_t count) {
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllToAll:
    case Collective::kCustom:
      return InPlaceAlias{true, 0};
    case Collective::kReduce:
      if (rank != p.root) return std::nullopt;
      return InPlaceAlias{true, 0};
    case Collective::kAllGather:
      return InPlaceAlias{true, static_cast<uint64_t>(rank) * count};
    case Collective::kGather:
      if (rank != p.root) return std::nullopt;
      return InPlaceAlias{true, static_cast<uint64_t>(rank) * count};
    case Collective::kReduceScatter:
      return InPlaceAlias{false, static_cast<uint64_t>(rank) * count};
    case Collective::kScatter:
      if (rank != p.root) return std::nullopt;
      return InPlaceAlias{false, static_cast<uint64_t>(rank) * count};
  }
  return std::nullopt;
}

Status check_call(const Program& p, uint64_t count, DataType dtype, RedOp op, bool inplace,
                  std::size_t premul_scalars) {
  const auto t = static_cast<int>(dtype);
  const auto o = static_cast<int>(op);
  if (t < 0 || t >= kNumDataTypes) return Status::error("unknown datatype value " + std::to_string(t));
  if (o < 0 || o >= kNumRedOps)
    return Status::error("unknown reduction operator value " + std::to_string(o));
  if (inplace && !p.inplace)
    return Status::error("program '" + p.name + "' is not valid for in-place calls");
  if (!inplace && !p.outofplace)
    return Status::error("program '" + p.name + "' is not valid for out-of-place calls");
  if (premul_scalars != 0 && premul_scalars != static_cast<std::size_t>(p.nranks))
    return Status::error("premul_scalars has " + std::to_string(premul_scalars) +
                         " entries; expected one per rank (" + std::to_string(p.nranks) + ")");
  if (count_is_per_block(p.collective) && p.nranks > 0 &&
      count > UINT64_MAX / static_cast<uint64_t>(p.nranks))
    return Status::error("count " + std::to_string(count) + " times " + std::to_string(p.nranks) +
                         " ranks overflows 64 bits");
  if (!chunk_elements(p, count))
    return Status::error("count " + std::to_string(count) +
                         " is not a multiple of the program's count granularity " +
                         std::to_string(count_granularity(p)));
  return Status::ok();
}

}  // namespace efccl::ef
