// Chunk-level facts about the collectives (docs/ef-format.md §2 and §6): buffer shapes,
// in-place aliasing and the expected outputs, all in chunks.
#include <string>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {

using ef::BufferKind;
using ef::BufferRef;
using ef::Collective;

int64_t rank_block_chunks(Collective c, int32_t nranks, int64_t nchunks) {
  if (!ef::count_is_per_block(c) || nranks <= 0) return 0;
  return nchunks / nranks;
}

int64_t standard_input_chunks(Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                              int32_t rank) {
  const int64_t block = rank_block_chunks(c, nranks, nchunks);
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
    case Collective::kReduce:
      return nchunks;
    case Collective::kAllGather:
    case Collective::kGather:
      return block;
    case Collective::kBroadcast:
    case Collective::kScatter:
      return rank == root ? nchunks : 0;
    case Collective::kCustom:
      return 0;
  }
  return 0;
}

int64_t standard_output_chunks(Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                               int32_t rank) {
  const int64_t block = rank_block_chunks(c, nranks, nchunks);
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kAllToAll:
    case Collective::kBroadcast:
      return nchunks;
    case Collective::kReduceScatter:
    case Collective::kScatter:
      return block;
    case Collective::kReduce:
    case Collective::kGather:
      return rank == root ? nchunks : 0;
    case Collective::kCustom:
      return 0;
  }
  return 0;
}

BufferRef canonical_inplace(Collective c, int32_t nranks, int64_t nchunks, int32_t root,
                            int32_t rank, BufferRef ref) {
  const int64_t block = rank_block_chunks(c, nranks, nchunks);
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllToAll:
    case Collective::kCustom:
      if (ref.buffer == BufferKind::kOutput) ref.buffer = BufferKind::kInput;
      return ref;
    case Collective::kReduce:
      if (rank == root && ref.buffer == BufferKind::kOutput) ref.buffer = BufferKind::kInput;
      return ref;
    case Collective::kAllGather:
    case Collective::kGather: {
      const bool aliased = c == Collective::kAllGather || rank == root;
      if (aliased && ref.buffer == BufferKind::kInput) {
        return {BufferKind::kOutput, rank * block + ref.offset};
      }
      return ref;
    }
    case Collective::kReduceScatter:
    case Collective::kScatter: {
      const bool aliased = c == Collective::kReduceScatter || rank == root;
      if (aliased && ref.buffer == BufferKind::kOutput) {
        return {BufferKind::kInput, rank * block + ref.offset};
      }
      return ref;
    }
  }
  return ref;
}

std::vector<ef::Postcondition> standard_postconditions(Collective c, int32_t nranks,
                                                       int64_t nchunks, int32_t root) {
  std::vector<ef::Postcondition> out;
  const int64_t block = rank_block_chunks(c, nranks, nchunks);
  auto all_ranks = [&](int64_t index) {
    std::vector<ef::ChunkSource> s;
    for (int32_t q = 0; q < nranks; ++q) s.push_back({q, index});
    return s;
  };
  for (int32_t r = 0; r < nranks; ++r) {
    switch (c) {
      case Collective::kAllReduce:
        for (int64_t k = 0; k < nchunks; ++k) out.push_back({r, k, all_ranks(k)});
        break;
      case Collective::kAllGather:
        for (int32_t q = 0; q < nranks; ++q) {
          for (int64_t k = 0; k < block; ++k) out.push_back({r, q * block + k, {{q, k}}});
        }
        break;
      case Collective::kReduceScatter:
        for (int64_t k = 0; k < block; ++k) out.push_back({r, k, all_ranks(r * block + k)});
        break;
      case Collective::kAllToAll:
        for (int32_t q = 0; q < nranks; ++q) {
          for (int64_t k = 0; k < block; ++k) {
            out.push_back({r, q * block + k, {{q, r * block + k}}});
          }
        }
        break;
      case Collective::kBroadcast:
        for (int64_t k = 0; k < nchunks; ++k) out.push_back({r, k, {{root, k}}});
        break;
      case Collective::kReduce:
        if (r == root) {
          for (int64_t k = 0; k < nchunks; ++k) out.push_back({r, k, all_ranks(k)});
        }
        break;
      case Collective::kGather:
        if (r == root) {
          for (int32_t q = 0; q < nranks; ++q) {
            for (int64_t k = 0; k < block; ++k) out.push_back({r, q * block + k, {{q, k}}});
          }
        }
        break;
      case Collective::kScatter:
        for (int64_t k = 0; k < block; ++k) out.push_back({r, k, {{root, r * block + k}}});
        break;
      case Collective::kCustom:
        break;
    }
  }
  return out;
}

std::string describe(const Spec& spec, int32_t rank, Buffer buffer, int64_t index, int64_t count) {
  std::string s = "rank " + std::to_string(rank) + " ";
  if (buffer.scratch_id >= 0 &&
      static_cast<std::size_t>(buffer.scratch_id) < spec.scratch_names.size()) {
    s += "scratch '" + spec.scratch_names[static_cast<std::size_t>(buffer.scratch_id)] + "'";
  } else {
    s += std::string(ef::to_string(buffer.kind));
  }
  s += "[" + std::to_string(index);
  if (count != 1) s += ".." + std::to_string(index + count - 1);
  return s + "]";
}

std::string describe(const TraceOp& op, const Spec& spec, std::size_t op_index) {
  std::string s = "trace op " + std::to_string(op_index) + " (";
  if (op.kind == TraceOp::Kind::kCopy) {
    s += "copy " + describe(spec, op.a_rank, op.a_buffer, op.a_index, op.count) + " to " +
         describe(spec, op.dst_rank, op.dst_buffer, op.dst_index, op.count);
  } else {
    s += "reduce " + describe(spec, op.b_rank, op.b_buffer, op.b_index, op.count) + " into " +
         describe(spec, op.a_rank, op.a_buffer, op.a_index, op.count);
    if (op.dst_buffer != op.a_buffer || op.dst_index != op.a_index) {
      s += " stored at " + describe(spec, op.dst_rank, op.dst_buffer, op.dst_index, op.count);
    }
  }
  return s + ")";
}

}  // namespace efccl::compiler::detail
