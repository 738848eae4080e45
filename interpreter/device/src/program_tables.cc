// The kernel's tables from a program.
#include "program_tables.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include "efccl/ef/direct_analysis.h"
#include "efccl/ef/validate.h"

namespace efccl::device {
namespace {

static_assert(static_cast<int>(ef::OpCode::kSend) == kOpSend &&
                  static_cast<int>(ef::OpCode::kRecv) == kOpRecv &&
                  static_cast<int>(ef::OpCode::kCopy) == kOpCopy &&
                  static_cast<int>(ef::OpCode::kReduce) == kOpReduce &&
                  static_cast<int>(ef::OpCode::kRecvCopySend) == kOpRecvCopySend &&
                  static_cast<int>(ef::OpCode::kRecvReduceCopy) == kOpRecvReduceCopy &&
                  static_cast<int>(ef::OpCode::kRecvReduceSend) == kOpRecvReduceSend &&
                  static_cast<int>(ef::OpCode::kRecvReduceCopySend) == kOpRecvReduceCopySend &&
                  static_cast<int>(ef::OpCode::kNop) == kOpNop &&
                  static_cast<int>(ef::OpCode::kMultiReduceCopy) == kOpMultiReduceCopy,
              "OpKind mirrors ef::OpCode");
static_assert(ef::kMaxMultiOperands == kMaxMultiOperands, "mrc operand limits agree");
static_assert(static_cast<int>(ef::BufferKind::kInput) == kBufferInput &&
                  static_cast<int>(ef::BufferKind::kOutput) == kBufferOutput &&
                  static_cast<int>(ef::BufferKind::kScratch) == kBufferScratch,
              "BufferIndex mirrors ef::BufferKind");

// The kernel counts an op's units (OpDesc::count) in 32 bits: a valid op's chunks lie inside a
// buffer of at most ef::kMaxChunks chunks.
static_assert(ef::kMaxChunks <= std::numeric_limits<uint32_t>::max(),
              "OpDesc::count must fit the kernel's 32-bit unit counter");
static_assert(ef::kMaxChunks <= std::numeric_limits<int32_t>::max(),
              "OpDesc::pull_chunk and push_chunk hold chunk offsets in 32 bits");

/// Table entries the kernel indexes with 32-bit fields (with room for sums of two).
constexpr uint64_t kMaxTableEntries = std::numeric_limits<uint32_t>::max() / 2;

/// Integer avg's result regions of `rank` (local index `local_rank`), in chunks of its API
/// output (the host executor's rule).
void add_divide_segments(const ef::Program& p, int rank, int32_t local_rank,
                         std::vector<DivideSegment>& segments) {
  const int64_t c = p.nchunksperloop;
  const auto add = [&](int64_t first, int64_t chunks) {
    segments.push_back({local_rank, 0, first, chunks});
  };
  switch (p.collective) {
    case ef::Collective::kAllReduce:
      add(0, c);
      break;
    case ef::Collective::kReduceScatter:
      add(0, c / p.nranks);
      break;
    case ef::Collective::kReduce:
      if (rank == p.root) add(0, c);
      break;
    case ef::Collective::kCustom: {
      std::set<int64_t> chunks;  // each named chunk once
      for (const ef::Postcondition& pc : p.postconditions)
        if (pc.rank == rank && pc.index >= 0 && pc.index < p.ranks[rank].output_chunks)
          chunks.insert(pc.index);
      for (int64_t k : chunks) add(k, 1);
      break;
    }
    default:
      break;  // collectives without a reduction ignore the operator
  }
}

}  // namespace

StatusOr<ProgramTables> build_program_tables(const ef::Program& p, const std::vector<int>& ranks,
                                             const ConnectionIndex& sends,
                                             const ConnectionIndex& recvs,
                                             const ef::PremulMap* outofplace,
                                             const ef::PremulMap* inplace,
                                             const std::vector<int>& remote_ranks) {
  ProgramTables t;
  // Counted before anything is built, so that no index below is truncated.
  uint64_t nthreadblocks = 0, nops = 0, ndeps = 0, noperands = 0;
  for (int r : ranks)
    for (const auto& tb : p.ranks[r].threadblocks) {
      ++nthreadblocks;
      nops += tb.ops.size();
      for (const auto& op : tb.ops) {
        ndeps += op.deps.size();
        noperands += op.sources.size() + op.targets.size();
      }
    }
  if (nthreadblocks > kMaxTableEntries || nops > kMaxTableEntries || ndeps > kMaxTableEntries ||
      noperands > kMaxTableEntries)
    return Status::error("program too large for one launch: " + std::to_string(nthreadblocks) +
                         " threadblocks, " + std::to_string(nops) + " ops, " +
                         std::to_string(ndeps) + " dependencies, " + std::to_string(noperands) +
                         " mrc operands (at most " + std::to_string(kMaxTableEntries) + " each)");
  if (nthreadblocks > static_cast<uint64_t>(std::numeric_limits<int>::max()))
    return Status::error("too many threadblocks for one launch");

  // Direct transfers between the ranks sharing the device (this launch's, and those of other
  // processes whose launches it meets), per call mode.
  std::vector<bool> in_launch(p.ranks.size(), false);
  std::vector<int32_t> local_of(p.ranks.size(), -1);
  for (std::size_t li = 0; li < ranks.size(); ++li) {
    in_launch[static_cast<std::size_t>(ranks[li])] = true;
    local_of[static_cast<std::size_t>(ranks[li])] = static_cast<int32_t>(li);
  }
  for (std::size_t j = 0; j < remote_ranks.size(); ++j) {
    const auto r = static_cast<std::size_t>(remote_ranks[j]);
    if (r >= p.ranks.size() || in_launch[r])
      return Status::error("remote rank " + std::to_string(remote_ranks[j]) +
                           " is out of range or runs in this launch");
    in_launch[r] = true;
    local_of[r] = -2 - static_cast<int32_t>(j);
  }
  std::optional<ef::DirectMap> direct[2];  // out of place, in place
  if (ranks.size() + remote_ranks.size() > 1) {
    if (p.outofplace) direct[0] = ef::analyze_direct(p, false, in_launch);
    if (p.inplace) direct[1] = ef::analyze_direct(p, true, in_launch);
  }

  for (std::size_t li = 0; li < ranks.size(); ++li) {
    const int r = ranks[li];
    const auto& rank = p.ranks[r];
    std::vector<uint64_t> flag_base(rank.threadblocks.size());
    std::set<std::pair<int, int>> depended_on;
    for (std::size_t tb = 0; tb < rank.threadblocks.size(); ++tb) {
      flag_base[tb] = t.nflags;
      t.nflags += rank.threadblocks[tb].ops.size();
      for (const auto& op : rank.threadblocks[tb].ops)
        for (const auto& d : op.deps) depended_on.insert({d.tb, d.op});
    }
    for (std::size_t tb_index = 0; tb_index < rank.threadblocks.size(); ++tb_index) {
      const auto& tb = rank.threadblocks[tb_index];
      const int tbi = static_cast<int>(tb_index);
      ThreadblockDesc desc{};
      desc.local_rank = static_cast<int32_t>(li);
      desc.rank = r;
      desc.tb = tbi;
      desc.send = tb.send_peer >= 0 ? sends.at({r, tbi}) : -1;
      desc.recv = tb.recv_peer >= 0 ? recvs.at({r, tbi}) : -1;
      desc.recv_local = tb.recv_peer >= 0 ? local_of[static_cast<std::size_t>(tb.recv_peer)] : -1;
      desc.send_local = tb.send_peer >= 0 ? local_of[static_cast<std::size_t>(tb.send_peer)] : -1;
      desc.op_begin = static_cast<uint32_t>(t.ops.size());
      desc.op_count = static_cast<uint32_t>(tb.ops.size());
      desc.flag_begin = static_cast<uint32_t>(flag_base[tb_index]);
      desc.dep_begin = static_cast<uint32_t>(t.deps.size());
      for (std::size_t o = 0; o < tb.ops.size(); ++o) {
        const ef::Op& op = tb.ops[o];
        OpDesc od{};
        od.code = static_cast<uint8_t>(op.code);
        od.count = op.code == ef::OpCode::kNop ? 0 : op.count;
        if (op.src) {
          od.src_buffer = static_cast<uint8_t>(op.src->buffer);
          od.src_chunk = op.src->offset;
        }
        if (op.dst) {
          od.dst_buffer = static_cast<uint8_t>(op.dst->buffer);
          od.dst_chunk = op.dst->offset;
        }
        const auto bits = [&](const ef::PremulMap* map) {
          if (map == nullptr) return 0;
          const ef::PremulFlags& f = (*map)[r][tb_index][o];
          return (f.src ? kPremulSrc : 0) | (f.dst ? kPremulDst : 0);
        };
        od.premul = static_cast<uint8_t>((bits(outofplace) << kPremulShiftOutOfPlace) |
                                         (bits(inplace) << kPremulShiftInPlace));
        od.publishes = depended_on.count({tbi, static_cast<int>(o)}) ? 1 : 0;
        for (int mode = 0; mode < 2; ++mode) {
          if (!direct[mode]) continue;
          const ef::DirectFlags& f = (*direct[mode])[r][tb_index][o];
          const int bits = static_cast<int>(f.pop) |
                           (static_cast<int>(f.push) << kDirectPushShift);
          od.direct |= static_cast<uint8_t>(
              bits << (mode == 0 ? kDirectShiftOutOfPlace : kDirectShiftInPlace));
          // The same matched op in either mode, so the regions agree where both are set.
          if (f.pull_from) {
            od.pull_buffer = static_cast<uint8_t>(f.pull_from->buffer);
            od.pull_chunk = static_cast<int32_t>(f.pull_from->offset);
          }
          if (f.push_to) {
            od.push_buffer = static_cast<uint8_t>(f.push_to->buffer);
            od.push_chunk = static_cast<int32_t>(f.push_to->offset);
          }
        }
        if (op.code == ef::OpCode::kMultiReduceCopy) {
          if (op.sources.empty() || op.targets.empty() ||
              op.sources.size() > static_cast<std::size_t>(ef::kMaxMultiOperands) ||
              op.targets.size() > static_cast<std::size_t>(ef::kMaxMultiOperands))
            return Status::error("rank " + std::to_string(r) + " tb " + std::to_string(tbi) +
                                 " op " + std::to_string(o) +
                                 " (mrc): " + std::to_string(op.sources.size()) + " sources and " +
                                 std::to_string(op.targets.size()) + " targets; expected 1.." +
                                 std::to_string(ef::kMaxMultiOperands) + " each");
          od.src_chunk = static_cast<int64_t>(t.operands.size());
          od.pull_chunk = static_cast<int32_t>(op.sources.size());
          od.push_chunk = static_cast<int32_t>(op.targets.size());
          for (const auto* refs : {&op.sources, &op.targets}) {
            for (const ef::RankBufferRef& ref : *refs) {
              const int32_t local =
                  ref.rank >= 0 && static_cast<std::size_t>(ref.rank) < local_of.size()
                      ? local_of[static_cast<std::size_t>(ref.rank)]
                      : -1;  // (a remote rank, < -1, is refused too)
              if (local < 0)
                return Status::error(
                    "rank " + std::to_string(r) + " tb " + std::to_string(tbi) + " op " +
                    std::to_string(o) + " (mrc) names rank " + std::to_string(ref.rank) +
                    "'s buffer, but that rank does not run in this launch: mrc runs only on "
                    "ranks of one process on one GPU");
              t.operands.push_back({ref.offset, local, static_cast<uint8_t>(ref.buffer), {}});
            }
          }
        }
        od.dep_begin = static_cast<uint32_t>(t.deps.size());
        od.dep_count = static_cast<uint32_t>(op.deps.size());
        for (const auto& d : op.deps)
          t.deps.push_back({static_cast<uint32_t>(flag_base[d.tb] + d.op), d.tb, d.op});
        t.ops.push_back(od);
      }
      desc.dep_count = static_cast<uint32_t>(t.deps.size()) - desc.dep_begin;
      t.threadblocks.push_back(desc);
    }
    add_divide_segments(p, r, static_cast<int32_t>(li), t.divide_segments);
  }
  for (const auto& seg : t.divide_segments)
    t.largest_divide_chunks = std::max(t.largest_divide_chunks, seg.chunks);
  return t;
}

}  // namespace efccl::device
