// Command-line pieces shared by the benchmarks.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace efccl::bench {

/// "8", "64K", "4M", "1G" (binary multiples); nullopt for anything else.
inline std::optional<uint64_t> parse_size(std::string_view s) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
    mult = s.back() == 'K' ? 1ull << 10 : s.back() == 'M' ? 1ull << 20 : 1ull << 30;
    s.remove_suffix(1);
  }
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v * mult;
}

}  // namespace efccl::bench
