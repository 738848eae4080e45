#include "efccl/net/deadline.h"

#include <algorithm>

namespace efccl::net {

Deadline::Deadline(Clock::time_point when) : never_(false), at_(when) {
  budget_ = std::max(std::chrono::milliseconds(0),
                     std::chrono::ceil<std::chrono::milliseconds>(when - Clock::now()));
}

Deadline Deadline::after(std::chrono::milliseconds budget) {
  Deadline d;
  d.never_ = false;
  d.at_ = Clock::now() + budget;
  d.budget_ = budget;
  return d;
}

bool Deadline::expired() const { return !never_ && Clock::now() >= at_; }

std::chrono::milliseconds Deadline::left() const {
  if (never_) return std::chrono::milliseconds::max();
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::ceil<std::chrono::milliseconds>(at_ - Clock::now()));
}

int Deadline::poll_ms(int cap_ms) const {
  if (never_) return cap_ms;
  const long long left_ms = left().count();
  if (cap_ms < 0) return static_cast<int>(std::min<long long>(left_ms, 1 << 30));
  return static_cast<int>(std::min<long long>(left_ms, cap_ms));
}

Deadline Deadline::earlier(const Deadline& other) const {
  if (never_) return other;
  if (other.never_) return *this;
  return at_ <= other.at_ ? *this : other;
}

}  // namespace efccl::net
