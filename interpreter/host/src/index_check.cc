#include "index_check.h"

#include <sstream>
#include <string>

namespace efccl::host {
namespace {

using ef::BufferKind;
using ef::OpCode;

std::string where(int rank, int tb, int op) {
  std::ostringstream s;
  s << "rank " << rank << " tb " << tb;
  if (op >= 0) s << " op " << op;
  return s.str();
}

}  // namespace

Status check_indices(const ef::Program& p) {
  if (p.nranks < 1 || static_cast<std::size_t>(p.nranks) != p.ranks.size())
    return Status::error("program has nranks " + std::to_string(p.nranks) + " but " +
                         std::to_string(p.ranks.size()) + " rank entries");
  for (int r = 0; r < p.nranks; ++r) {
    const ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    if (rank.input_chunks < 0 || rank.output_chunks < 0 || rank.scratch_chunks < 0)
      return Status::error("rank " + std::to_string(r) + " has a negative buffer size");
    const int ntbs = static_cast<int>(rank.threadblocks.size());
    for (int t = 0; t < ntbs; ++t) {
      const ef::Threadblock& tb = rank.threadblocks[static_cast<std::size_t>(t)];
      for (const int peer : {tb.send_peer, tb.recv_peer})
        if (peer < -1 || peer >= p.nranks || peer == r)
          return Status::error(where(r, t, -1) + ": peer " + std::to_string(peer) +
                               " is not another rank of 0.." + std::to_string(p.nranks - 1));
      const int nops = static_cast<int>(tb.ops.size());
      for (int i = 0; i < nops; ++i) {
        const ef::Op& op = tb.ops[static_cast<std::size_t>(i)];
        // Built only for a message: this loop visits every op of large programs.
        const auto at = [&] {
          return where(r, t, i) + " (" + std::string(ef::to_string(op.code)) + ")";
        };
        if (op.count < 0)
          return Status::error(at() + ": negative count " + std::to_string(op.count));
        if (ef::op_sends(op.code) && tb.send_peer < 0)
          return Status::error(at() + ": pushes but the threadblock has no send peer");
        if (ef::op_receives(op.code) && tb.recv_peer < 0)
          return Status::error(at() + ": pops but the threadblock has no recv peer");
        const auto check_ref = [&](const std::optional<ef::BufferRef>& ref, bool required,
                                   const char* field) -> Status {
          if (!required) return Status::ok();
          if (!ref) return Status::error(at() + ": missing " + field);
          const int64_t chunks = ref->buffer == BufferKind::kInput    ? rank.input_chunks
                                 : ref->buffer == BufferKind::kOutput ? rank.output_chunks
                                                                      : rank.scratch_chunks;
          if (ref->offset < 0 || ref->offset > chunks || op.count > chunks - ref->offset)
            return Status::error(at() + ": " + field + " of " + std::to_string(op.count) +
                                 " chunks from chunk " + std::to_string(ref->offset) +
                                 " outside the " + std::string(ef::to_string(ref->buffer)) +
                                 " buffer of " + std::to_string(chunks) + " chunks");
          return Status::ok();
        };
        if (Status s = check_ref(op.src, ef::op_reads_src(op.code), "src"); !s) return s;
        if (Status s = check_ref(op.dst, ef::op_writes_dst(op.code), "dst"); !s) return s;
        // mrc: every operand in its own rank's buffer (the executor reads them all).
        const bool multi = op.code == OpCode::kMultiReduceCopy;
        if (multi && (op.sources.empty() || op.targets.empty()))
          return Status::error(at() + ": needs at least one source and one target");
        if (!multi && (!op.sources.empty() || !op.targets.empty()))
          return Status::error(at() + ": only mrc takes sources and targets");
        for (const auto* refs : {&op.sources, &op.targets}) {
          for (const ef::RankBufferRef& ref : *refs) {
            if (ref.rank < 0 || ref.rank >= p.nranks)
              return Status::error(at() + ": operand in rank " + std::to_string(ref.rank) +
                                   ", not a rank of 0.." + std::to_string(p.nranks - 1));
            const ef::Rank& owner = p.ranks[static_cast<std::size_t>(ref.rank)];
            const int64_t chunks = ref.buffer == BufferKind::kInput    ? owner.input_chunks
                                   : ref.buffer == BufferKind::kOutput ? owner.output_chunks
                                                                       : owner.scratch_chunks;
            if (ref.offset < 0 || ref.offset > chunks || op.count > chunks - ref.offset)
              return Status::error(at() + ": operand of " + std::to_string(op.count) +
                                   " chunks from chunk " + std::to_string(ref.offset) +
                                   " outside rank " + std::to_string(ref.rank) + "'s " +
                                   std::string(ef::to_string(ref.buffer)) + " buffer of " +
                                   std::to_string(chunks) + " chunks");
          }
        }
        for (const ef::Dependency& d : op.deps) {
          if (d.tb < 0 || d.tb >= ntbs || d.op < 0 ||
              static_cast<std::size_t>(d.op) >=
                  rank.threadblocks[static_cast<std::size_t>(d.tb)].ops.size())
            return Status::error(at() + ": dependency on tb " + std::to_string(d.tb) + " op " +
                                 std::to_string(d.op) + ", which does not exist");
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace efccl::host
