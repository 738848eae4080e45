// The one hash of the project: 64-bit FNV-1a, with a finalizer for keys that must spread over
// all 64 bits (short inputs leave FNV-1a's high bits barely mixed). Deterministic across
// processes and builds: values are exchanged between ranks and written into tags.
#pragma once

#include <cstdint>
#include <string_view>

namespace efccl {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnv1aPrime = 0x100000001b3ull;

/// FNV-1a of `bytes`, continuing from `seed` (kFnv1aOffset to start).
constexpr uint64_t fnv1a(std::string_view bytes, uint64_t seed = kFnv1aOffset) {
  uint64_t h = seed;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * kFnv1aPrime;
  return h;
}

/// FNV-1a of one 64-bit value, byte by byte (little end first), continuing from `seed`.
constexpr uint64_t fnv1a_u64(uint64_t value, uint64_t seed = kFnv1aOffset) {
  uint64_t h = seed;
  for (int i = 0; i < 8; ++i) h = (h ^ ((value >> (8 * i)) & 0xff)) * kFnv1aPrime;
  return h;
}

/// Murmur3's 64-bit finalizer: every input bit affects every output bit.
constexpr uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

/// fnv1a then mix64: a well-spread 64-bit key of `bytes`.
constexpr uint64_t hash64(std::string_view bytes, uint64_t seed = kFnv1aOffset) {
  return mix64(fnv1a(bytes, seed));
}

}  // namespace efccl
