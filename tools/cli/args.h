// The `efccl` command's argument parsing, shared by its subcommands: usage errors (exit 2),
// `--flag value` and boolean flags, integer values in a range.
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace efccl::cli {

/// A usage problem (unknown option, bad value, missing argument): main prints it with the
/// usage text and exits 2.
struct UsageError {
  std::string message;
};

inline uint64_t parse_u64(std::string_view flag, std::string_view text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty())
    throw UsageError{std::string(flag) + ": expected a non-negative integer, got '" +
                     std::string(text) + "'"};
  return v;
}

/// An int32 flag value in [min, max].
inline int32_t parse_i32(std::string_view flag, std::string_view text, int32_t min, int32_t max) {
  const uint64_t v = parse_u64(flag, text);
  if (v < static_cast<uint64_t>(min) || v > static_cast<uint64_t>(max))
    throw UsageError{std::string(flag) + ": expected " + std::to_string(min) + ".." +
                     std::to_string(max) + ", got " + std::string(text)};
  return static_cast<int32_t>(v);
}

/// Minimal flag parser: positional arguments plus `--flag value` and boolean flags.
class Args {
 public:
  Args(const std::vector<std::string>& argv, std::set<std::string> value_flags,
       std::set<std::string> bool_flags) {
    for (std::size_t i = 0; i < argv.size(); ++i) {
      const std::string& a = argv[i];
      if (a.size() > 1 && a[0] == '-') {
        if (value_flags.count(a)) {
          if (i + 1 >= argv.size()) throw UsageError{a + " needs a value"};
          if (values_.count(a)) throw UsageError{a + " given twice"};
          values_[a] = argv[++i];
        } else if (bool_flags.count(a)) {
          bools_.insert(a);
        } else {
          throw UsageError{"unknown option '" + a + "'"};
        }
      } else {
        positional_.push_back(a);
      }
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }
  std::optional<std::string> value(const std::string& flag) const {
    auto it = values_.find(flag);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  bool has(const std::string& flag) const { return bools_.count(flag) > 0; }

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
  std::set<std::string> bools_;
};

}  // namespace efccl::cli
