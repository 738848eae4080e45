// See fused_overlap.h.
#include "fused_overlap.h"

#include <algorithm>
#include <tuple>

namespace efccl::device {

std::vector<bool> calls_overlapping_others(
    const std::vector<const std::vector<ByteRange>*>& calls) {
  std::vector<bool> overlapping(calls.size(), false);
  std::vector<std::tuple<uintptr_t, uintptr_t, std::size_t>> ranges;  // begin, end, call
  for (std::size_t i = 0; i < calls.size(); ++i)
    for (const auto& [begin, end] : *calls[i])
      if (begin < end) ranges.emplace_back(begin, end, i);
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::size_t> open;  // ranges that may still overlap the next one
  for (std::size_t j = 0; j < ranges.size(); ++j) {
    // Not a structured binding: the lambda captures `begin`, which Clang 14 does not allow.
    const uintptr_t begin = std::get<0>(ranges[j]);
    const std::size_t call = std::get<2>(ranges[j]);
    std::erase_if(open, [&](std::size_t k) { return std::get<1>(ranges[k]) <= begin; });
    for (std::size_t k : open)
      if (const std::size_t other = std::get<2>(ranges[k]); other != call)
        overlapping[call] = overlapping[other] = true;
    open.push_back(j);
  }
  return overlapping;
}

}  // namespace efccl::device
