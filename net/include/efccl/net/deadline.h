// When a wait gives up. Every call of net that can block takes a Deadline and fails with a
// Status saying what it waited for instead of hanging. A deadline remembers the budget it was
// made with, so that a timeout is reported as the limit the user set ("within 3000 ms"), not as
// whatever was left when some later step started waiting.
#pragma once

#include <chrono>

namespace efccl::net {

/// A point on the steady clock after which a wait gives up, or none (never()).
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// No limit.
  Deadline() = default;
  /// At `when`; its budget is the time left at construction. Implicit: a time point is a deadline.
  Deadline(Clock::time_point when);  // NOLINT(google-explicit-constructor)
  /// `budget` from now.
  static Deadline after(std::chrono::milliseconds budget);
  static Deadline never() { return Deadline(); }

  bool is_never() const { return never_; }
  bool expired() const;
  /// The point in time (Clock::time_point::max() for never).
  Clock::time_point when() const { return never_ ? Clock::time_point::max() : at_; }
  /// The duration this deadline was made with (0 for never).
  std::chrono::milliseconds budget() const { return budget_; }
  /// The time left (0 once expired; a large value for never).
  std::chrono::milliseconds left() const;
  /// poll(2)'s timeout argument: -1 for never (unless capped), else the milliseconds left
  /// rounded up, at most `cap_ms`.
  int poll_ms(int cap_ms = -1) const;
  /// The earlier of the two.
  Deadline earlier(const Deadline& other) const;

 private:
  bool never_ = true;
  Clock::time_point at_{};
  std::chrono::milliseconds budget_{0};
};

}  // namespace efccl::net
