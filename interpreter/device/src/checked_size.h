// Size arithmetic that reports overflow instead of wrapping, for every size the device
// executor derives from a program or a call (chunk counts reach 2^40, counts 2^64).
#pragma once

#include <cstdint>
#include <optional>

namespace efccl::device {

/// a * b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

/// a + b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

/// `value` rounded up to a multiple of `alignment` (> 0), or nullopt when that overflows.
inline std::optional<uint64_t> checked_align_up(uint64_t value, uint64_t alignment) {
  const auto padded = checked_add(value, alignment - 1);
  if (!padded) return std::nullopt;
  return *padded / alignment * alignment;
}

}  // namespace efccl::device
