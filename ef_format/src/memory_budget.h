// The loaders' memory budget (docs/ef-format.md §8, "Limits"): both parsers charge each
// element of the document they build its estimated size before building it, and stop once
// the total exceeds the budget, so that a small file of many tiny elements cannot take
// gigabytes (a file of `{}` or `<a/>` costs about 30 times its size when parsed).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace efccl::ef {

/// Estimated bytes charged so far against a limit.
class MemoryBudget {
 public:
  explicit MemoryBudget(std::size_t limit_bytes) : limit_(limit_bytes) {}

  /// Adds `bytes` for one more element; false once the total exceeds the limit.
  bool charge(std::size_t bytes) {
    ++elements_;
    if (exceeded_ || bytes > limit_ - charged_) {
      exceeded_ = true;
      return false;
    }
    charged_ += bytes;
    return true;
  }

  /// The diagnostic's message once charge() returned false; `element` names what the
  /// document consists of ("value", "element").
  std::string exceeded_message(std::string_view element) const {
    return "loading the document needs more than " + describe(limit_) +
           " of memory, the loaders' budget (stopped at " + std::string(element) + " " +
           std::to_string(elements_) + ")";
  }

 private:
  static std::string describe(std::size_t bytes) {
    constexpr std::size_t kMiB = std::size_t{1} << 20;
    if (bytes % kMiB == 0 && bytes > 0) return std::to_string(bytes / kMiB) + " MiB";
    return std::to_string(bytes) + " bytes";
  }

  std::size_t limit_;
  std::size_t charged_ = 0;  ///< never above limit_
  std::size_t elements_ = 0;
  bool exceeded_ = false;
};

}  // namespace efccl::ef
