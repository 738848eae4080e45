// All-pairs allreduce in one communication step (small messages): every rank sends its whole
// buffer to every other rank's scratch (one multi-chunk op per peer), then reduces the n-1
// copies into its output. Sends to different peers use different connections, so they all
// proceed at once; peer q's data travels on channel (q - r) mod channels. Two ranks: see
// two_ranks() below.
#include "efccl/ef/validate.h"
#include "library.h"

namespace efccl::algorithms::detail {
namespace {

ef::Op make_op(ef::OpCode code, std::optional<ef::BufferRef> src,
               std::optional<ef::BufferRef> dst) {
  ef::Op op;
  op.code = code;
  op.src = src;
  op.dst = dst;
  op.count = 1;
  return op;
}

/// Two ranks, written as EF directly: per lane (channel x instance) one threadblock that sends
/// its input chunk to the peer, then reduces the peer's chunk into its output as it arrives
/// (recv-reduce-copy). No scratch, no second pass, no flag between threadblocks; valid in
/// place too, because the send has read the chunk before the same threadblock overwrites it
/// (a sequential trace cannot say that without a scratch copy, hence not the builder).
StatusOr<ef::Program> two_ranks(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  using ef::BufferKind;
  const int32_t lanes = p.channels * p.instances;
  ef::Program prog;
  prog.name = "allpairs_allreduce";
  prog.collective = ef::Collective::kAllReduce;
  prog.protocol = p.protocol;
  prog.nranks = 2;
  prog.nchunksperloop = lanes;
  prog.nchannels = lanes;
  prog.inplace = true;
  prog.outofplace = true;
  prog.min_bytes = o.min_bytes;
  prog.max_bytes = o.max_bytes;
  prog.ranks.resize(2);
  for (int32_t r = 0; r < 2; ++r) {
    ef::Rank& rank = prog.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = lanes;
    rank.output_chunks = lanes;
    for (int32_t k = 0; k < lanes; ++k) {
      ef::Threadblock tb;
      tb.send_peer = 1 - r;
      tb.recv_peer = 1 - r;
      tb.channel = k;
      tb.ops.push_back(
          make_op(ef::OpCode::kSend, ef::BufferRef{BufferKind::kInput, k}, std::nullopt));
      tb.ops.push_back(make_op(ef::OpCode::kRecvReduceCopy, ef::BufferRef{BufferKind::kInput, k},
                               ef::BufferRef{BufferKind::kOutput, k}));
      rank.threadblocks.push_back(std::move(tb));
    }
  }
  std::string problems;
  for (const auto& d : ef::validate(prog)) problems += "\n  " + d.to_string();
  if (!problems.empty())
    return Status::error("allpairs_allreduce (2 ranks) is not valid:" + problems);
  return prog;
}

}  // namespace

using compiler::kInput;
using compiler::kOutput;
using compiler::kScratch;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> allpairs_allreduce(const AlgorithmParams& p,
                                         const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  if (n == 2) return two_ranks(p, o);
  const int64_t cf = p.channels;  // chunks per buffer: one lane per channel
  ProgramBuilder b("allpairs_allreduce", ef::Collective::kAllReduce, n, cf, p.inplace, p.protocol,
                   p.instances, o);
  // Scratch slot of peer q on rank r: peers in rank order, skipping r.
  auto slot = [](int32_t q, int32_t r) { return q < r ? q : q - 1; };
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t q = 0; q < n; ++q) {
      if (q == r) continue;
      const int ch = static_cast<int>(((q - r) % n + n) % n % p.channels);
      b.chunk(q, kInput, 0, cf).copy(r, kScratch, slot(q, r) * cf, -1, -1, ch);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    Ref acc = b.chunk(r, kInput, 0, cf).copy(r, kOutput, 0);
    for (int32_t q = 0; q < n; ++q) {
      if (q != r) acc = acc.reduce(b.chunk(r, kScratch, slot(q, r) * cf, cf));
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
