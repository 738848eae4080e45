// The CPU playing the GPU at both ends of a network connection (efccl/net/net_connection.h):
// the sender fills slot k with a pattern of k and posts it, the receiver checks every byte and
// frees it. Used by the proxy tests in one process, across processes and across namespaces.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/net_connection.h"

namespace net_test {

/// Bytes of slot k: every size from empty to full occurs, and full slots often.
inline uint64_t slot_size(uint64_t k, uint64_t slot_bytes, bool sized) {
  if (!sized) return slot_bytes;
  switch (k % 5) {
    case 0:
      return slot_bytes;
    case 1:
      return (k * 7919) % (slot_bytes + 1);
    case 2:
      return std::min<uint64_t>(slot_bytes, 1 + k % 97);
    case 3:
      return 0;
    default:
      return slot_bytes - std::min<uint64_t>(slot_bytes, k % 4099);
  }
}

/// The pattern of slot k's bytes.
inline void fill_pattern(char* to, uint64_t k, uint64_t size) {
  uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < size; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    std::memcpy(to + i, &x, std::min<uint64_t>(8, size - i));
  }
}

/// Posts slots [first, first + count) on a sending end. `delay_us` between slots (a slow GPU).
inline efccl::Status produce(efccl::net::NetConnection& c, uint64_t first, uint64_t count,
                             efccl::net::Deadline deadline,
                             const std::atomic<bool>* abort = nullptr, int delay_us = 0) {
  using Counter = efccl::net::NetConnection::Counter;
  const efccl::net::SlotRegion& r = c.region();
  for (uint64_t k = first; k < first + count; ++k) {
    if (k >= r.layout.nslots)
      if (efccl::Status s = c.wait_for(Counter::kHead, k + 1 - r.layout.nslots, deadline, abort);
          !s)
        return efccl::Status::error("sender at slot " + std::to_string(k) + ": " + s.message());
    const uint64_t size = slot_size(k, r.layout.slot_bytes, r.layout.sized);
    fill_pattern(r.slot(k), k, size);
    if (r.layout.sized) r.sizes[k % r.layout.nslots] = static_cast<uint32_t>(size);
    r.store_tail(k + 1);
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  }
  return efccl::Status::ok();
}

/// Consumes slots [first, first + count) on a receiving end, checking each; `*done` counts them.
inline efccl::Status consume(efccl::net::NetConnection& c, uint64_t first, uint64_t count,
                             efccl::net::Deadline deadline,
                             const std::atomic<bool>* abort = nullptr,
                             std::atomic<uint64_t>* done = nullptr) {
  using Counter = efccl::net::NetConnection::Counter;
  const efccl::net::SlotRegion& r = c.region();
  std::vector<char> expected(r.layout.slot_bytes);
  for (uint64_t k = first; k < first + count; ++k) {
    if (efccl::Status s = c.wait_for(Counter::kTail, k + 1, deadline, abort); !s)
      return efccl::Status::error("receiver at slot " + std::to_string(k) + ": " + s.message());
    const uint64_t size = slot_size(k, r.layout.slot_bytes, r.layout.sized);
    if (r.layout.sized && r.sizes[k % r.layout.nslots] != size)
      return efccl::Status::error("slot " + std::to_string(k) + " arrived with size " +
                                  std::to_string(r.sizes[k % r.layout.nslots]) + ", sent " +
                                  std::to_string(size));
    fill_pattern(expected.data(), k, size);
    if (std::memcmp(expected.data(), r.slot(k), size) != 0) {
      uint64_t at = 0;
      while (at < size && expected[at] == r.slot(k)[at]) ++at;
      return efccl::Status::error("slot " + std::to_string(k) + " (" + std::to_string(size) +
                                  " bytes) differs at byte " + std::to_string(at));
    }
    r.store_head(k + 1);
    if (done != nullptr) done->store(k + 1 - first);
  }
  return efccl::Status::ok();
}

}  // namespace net_test
