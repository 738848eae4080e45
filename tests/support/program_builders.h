// Small builders for hand-written EF programs in the tests (ef_format's, the host executor's):
// buffer references, ops
// (with optional count and dependencies), threadblocks, an empty program, and the 2-rank ring
// allreduce several analyses are checked on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::ef::test_builders {

inline BufferRef in(int64_t offset) { return {BufferKind::kInput, offset}; }
inline BufferRef out(int64_t offset) { return {BufferKind::kOutput, offset}; }
inline BufferRef scratch(int64_t offset) { return {BufferKind::kScratch, offset}; }

inline Op make_op(OpCode code, std::optional<BufferRef> src, std::optional<BufferRef> dst,
                  int64_t count = 1, std::vector<Dependency> deps = {}) {
  Op op;
  op.code = code;
  op.src = src;
  op.dst = dst;
  op.count = count;
  op.deps = std::move(deps);
  return op;
}
inline Op send(BufferRef src, int64_t count = 1, std::vector<Dependency> deps = {}) {
  return make_op(OpCode::kSend, src, std::nullopt, count, std::move(deps));
}
inline Op recv(BufferRef dst, int64_t count = 1, std::vector<Dependency> deps = {}) {
  return make_op(OpCode::kRecv, std::nullopt, dst, count, std::move(deps));
}
inline Op rrc(BufferRef src, BufferRef dst, std::vector<Dependency> deps = {}) {
  return make_op(OpCode::kRecvReduceCopy, src, dst, 1, std::move(deps));
}
inline Op rrs(BufferRef src) { return make_op(OpCode::kRecvReduceSend, src, std::nullopt); }
inline Op rrcs(BufferRef src, BufferRef dst, int64_t count = 1) {
  return make_op(OpCode::kRecvReduceCopySend, src, dst, count);
}
inline Op rcs(BufferRef dst) { return make_op(OpCode::kRecvCopySend, std::nullopt, dst); }
inline Op copy(BufferRef src, BufferRef dst) { return make_op(OpCode::kCopy, src, dst); }
inline Op reduce(BufferRef src, BufferRef dst) { return make_op(OpCode::kReduce, src, dst); }

/// mrc: targets = reduction of sources (operands in any rank's buffers).
inline Op mrc(std::vector<RankBufferRef> sources, std::vector<RankBufferRef> targets,
              int64_t count = 1) {
  Op op;
  op.code = OpCode::kMultiReduceCopy;
  op.count = count;
  op.sources = std::move(sources);
  op.targets = std::move(targets);
  return op;
}

inline Threadblock make_tb(int32_t send_peer, int32_t recv_peer, std::vector<Op> ops,
                           int32_t channel = 0) {
  return {send_peer, recv_peer, channel, std::move(ops)};
}

inline Program make_program(Collective collective, int32_t nranks, int64_t chunks) {
  Program p;
  p.collective = collective;
  p.nranks = nranks;
  p.nchunksperloop = chunks;
  p.ranks.resize(static_cast<std::size_t>(nranks));
  return p;
}

/// 2-rank ring allreduce, nchunksperloop 2: send the peer's chunk, reduce own chunk with the
/// received one, send the result, receive the peer's result.
inline Program ring_allreduce_2() {
  Program p = make_program(Collective::kAllReduce, 2, 2);
  for (int r = 0; r < 2; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 2;
    const int other = 1 - r;
    rank.threadblocks = {make_tb(
        other, other, {send(in(other)), rrc(in(r), out(r)), send(out(r)), recv(out(other))})};
  }
  return p;
}

/// n-rank allreduce of mrc ops (as the library's shared_gpu_allreduce with one lane): rank r's
/// one threadblock reduces chunk r of every rank's input into chunk r of every output.
inline Program mrc_allreduce(int32_t n) {
  Program p = make_program(Collective::kAllReduce, n, n);
  for (int32_t r = 0; r < n; ++r) {
    Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = n;
    std::vector<RankBufferRef> sources, targets;
    for (int32_t q = 0; q < n; ++q) {
      sources.push_back({q, BufferKind::kInput, r});
      targets.push_back({q, BufferKind::kOutput, r});
    }
    rank.threadblocks = {make_tb(-1, -1, {mrc(sources, targets)})};
  }
  return p;
}

/// A review's counterexample to the first direct-transfer analysis (direct_analysis_test,
/// TwoPairsJudgedApartDoNotRace): rank 0's X is pulled by rank 1's Y while P later receives
/// into X's chunk a value Q could push as soon as A ran.
inline Program direct_review_counterexample() {
  Program p = make_program(Collective::kCustom, 2, 1);
  p.nchannels = 3;
  p.inplace = false;
  for (auto& rank : p.ranks) rank.input_chunks = rank.output_chunks = rank.scratch_chunks = 1;
  p.ranks[0].threadblocks = {
      make_tb(1, -1, {send(in(0))}, 0),                // X
      make_tb(1, -1, {send(out(0), 1, {{0, 0}})}, 2),  // A, after X
      make_tb(-1, 1, {recv(in(0), 1, {{3, 0}})}, 2),   // P, after W
      make_tb(-1, 1, {recv(scratch(0))}, 1),           // W
  };
  p.ranks[1].threadblocks = {
      make_tb(-1, 0, {rrc(in(0), out(0))}, 0),        // Y
      make_tb(0, -1, {send(in(0), 1, {{0, 0}})}, 1),  // Z, after Y (to W)
      make_tb(0, 0, {rcs(scratch(0))}, 2),            // Q: A -> P
  };
  p.postconditions = {{1, 0, {{0, 0}, {1, 0}}}};
  return p;
}

}  // namespace efccl::ef::test_builders
