// In-place aliasing in chunks (docs/ef-format.md §2), shared by the analyses of ef_format/src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "efccl/ef/program.h"

namespace efccl::ef::detail {

/// For an in-place call, where rank `rank`'s output buffer sits in its input buffer, in
/// chunks: input chunk = output chunk + shift. nullopt when the rank's output does not alias
/// its input (NCCL's rules; docs/ef-format.md §2).
inline std::optional<int64_t> output_to_input_shift(const Program& p, std::size_t rank) {
  const auto n = static_cast<int64_t>(p.ranks.size());
  const bool is_root = static_cast<int64_t>(rank) == p.root;
  const bool has_blocks = n > 0 && p.nchunksperloop > 0 && p.nchunksperloop % n == 0;
  const int64_t block = has_blocks ? p.nchunksperloop / n : 0;
  const auto rank_block = static_cast<int64_t>(rank) * block;  // <= nchunksperloop
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllToAll:
    case Collective::kCustom:
      return 0;
    case Collective::kReduce:
      if (is_root) return 0;
      return std::nullopt;
    case Collective::kAllGather:  // input == output + rank * count
      if (has_blocks) return -rank_block;
      return std::nullopt;
    case Collective::kGather:
      if (has_blocks && is_root) return -rank_block;
      return std::nullopt;
    case Collective::kReduceScatter:  // output == input + rank * count
      if (has_blocks) return rank_block;
      return std::nullopt;
    case Collective::kScatter:
      if (has_blocks && is_root) return rank_block;
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace efccl::ef::detail
