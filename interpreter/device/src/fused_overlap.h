// Which calls of one fused launch share memory with another call of it (pure C++, no CUDA).
// A fused launch's CTA may start its next call while a peer still runs this one, so a call
// that moves data directly between ranks' buffers (docs/device-executor.md, "Direct
// transfers") must keep its slots when any other call of the launch touches the same bytes.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace efccl::device {

/// A buffer's bytes [first, second).
using ByteRange = std::pair<uintptr_t, uintptr_t>;

/// For each call (its buffers' byte ranges, in any order), whether one of its ranges overlaps a
/// range of another call. A call's ranges that overlap each other (in-place aliasing) don't
/// count. One sweep over the ranges sorted by start: O(r log r + overlapping pairs).
std::vector<bool> calls_overlapping_others(
    const std::vector<const std::vector<ByteRange>*>& calls);

}  // namespace efccl::device
