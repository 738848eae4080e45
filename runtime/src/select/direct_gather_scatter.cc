#include "select/direct_gather_scatter.h"

#include <string>

#include "efccl/ef/validate.h"

namespace efccl::runtime {
namespace {

Status check_params(int32_t nranks, int32_t root, int32_t channels) {
  if (nranks < 1 || nranks > 4096) return Status::error("nranks must be 1..4096");
  if (root < 0 || root >= nranks) return Status::error("root " + std::to_string(root) + " is not a rank");
  if (channels < 1 || channels > 64) return Status::error("channels must be 1..64");
  return Status::ok();
}

StatusOr<ef::Program> finish(ef::Program p) {
  std::string problems;
  for (const auto& d : ef::validate(p)) problems += "\n  " + d.to_string();
  if (!problems.empty()) return Status::error(p.name + " is not valid:" + problems);
  return p;
}

ef::Op make_op(ef::OpCode code, std::optional<ef::BufferRef> src, std::optional<ef::BufferRef> dst,
               int64_t count) {
  ef::Op op;
  op.code = code;
  op.src = src;
  op.dst = dst;
  op.count = count;
  return op;
}

/// Common frame: one chunk per (rank-block, channel), C = nranks * channels.
ef::Program frame(const char* name, ef::Collective c, int32_t n, int32_t root, int32_t ch,
                  ef::Protocol protocol) {
  ef::Program p;
  p.name = name;
  p.collective = c;
  p.protocol = protocol;
  p.nranks = n;
  p.nchunksperloop = int64_t{n} * ch;
  p.nchannels = ch;
  p.root = root;
  p.inplace = true;
  p.outofplace = true;
  p.ranks.resize(static_cast<std::size_t>(n));
  return p;
}

}  // namespace

StatusOr<ef::Program> direct_gather(int32_t n, int32_t root, int32_t ch, ef::Protocol protocol) {
  if (Status s = check_params(n, root, ch); !s) return s;
  ef::Program p = frame("direct_gather", ef::Collective::kGather, n, root, ch, protocol);
  using ef::BufferKind;
  for (int32_t r = 0; r < n; ++r) {
    ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = ch;
    rank.output_chunks = r == root ? int64_t{n} * ch : 0;
    if (r == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      ef::Threadblock tb;
      tb.send_peer = root;
      tb.channel = c;
      tb.ops.push_back(make_op(ef::OpCode::kSend, ef::BufferRef{BufferKind::kInput, c}, std::nullopt, 1));
      rank.threadblocks.push_back(std::move(tb));
    }
  }
  ef::Rank& root_rank = p.ranks[static_cast<std::size_t>(root)];
  for (int32_t r = 0; r < n; ++r) {
    if (r == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      ef::Threadblock tb;
      tb.recv_peer = r;
      tb.channel = c;
      tb.ops.push_back(make_op(ef::OpCode::kRecv, std::nullopt,
                               ef::BufferRef{BufferKind::kOutput, int64_t{r} * ch + c}, 1));
      root_rank.threadblocks.push_back(std::move(tb));
    }
  }
  // The root's own block. In place it already lies there (input == output + root*count) and
  // the copy rewrites it with itself.
  ef::Threadblock own;
  own.ops.push_back(make_op(ef::OpCode::kCopy, ef::BufferRef{BufferKind::kInput, 0},
                            ef::BufferRef{BufferKind::kOutput, int64_t{root} * ch}, ch));
  root_rank.threadblocks.push_back(std::move(own));
  return finish(std::move(p));
}

StatusOr<ef::Program> direct_scatter(int32_t n, int32_t root, int32_t ch, ef::Protocol protocol) {
  if (Status s = check_params(n, root, ch); !s) return s;
  ef::Program p = frame("direct_scatter", ef::Collective::kScatter, n, root, ch, protocol);
  using ef::BufferKind;
  for (int32_t r = 0; r < n; ++r) {
    ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = r == root ? int64_t{n} * ch : 0;
    rank.output_chunks = ch;
    if (r == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      ef::Threadblock tb;
      tb.recv_peer = root;
      tb.channel = c;
      tb.ops.push_back(make_op(ef::OpCode::kRecv, std::nullopt, ef::BufferRef{BufferKind::kOutput, c}, 1));
      rank.threadblocks.push_back(std::move(tb));
    }
  }
  ef::Rank& root_rank = p.ranks[static_cast<std::size_t>(root)];
  for (int32_t r = 0; r < n; ++r) {
    if (r == root) continue;
    for (int32_t c = 0; c < ch; ++c) {
      ef::Threadblock tb;
      tb.send_peer = r;
      tb.channel = c;
      tb.ops.push_back(make_op(ef::OpCode::kSend,
                               ef::BufferRef{BufferKind::kInput, int64_t{r} * ch + c}, std::nullopt, 1));
      root_rank.threadblocks.push_back(std::move(tb));
    }
  }
  ef::Threadblock own;
  own.ops.push_back(make_op(ef::OpCode::kCopy, ef::BufferRef{BufferKind::kInput, int64_t{root} * ch},
                            ef::BufferRef{BufferKind::kOutput, 0}, ch));
  root_rank.threadblocks.push_back(std::move(own));
  return finish(std::move(p));
}

}  // namespace efccl::runtime
