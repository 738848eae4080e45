// Refused connections, reported at most once per interval with a count: a connect flood must not
// turn into one log line per connection. Not thread-safe: one per serving thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace efccl::net {

/// Throttles the reports of refused connections of one server (a root, a rank's listener, the
/// launcher's rendezvous server).
class RefusalReport {
 public:
  using Clock = std::chrono::steady_clock;

  /// `server` starts every line, e.g. "bootstrap root at 10.0.0.1:4242".
  explicit RefusalReport(std::string server,
                         std::chrono::milliseconds interval = std::chrono::seconds(1));

  /// Counts a refused connection from `from` for `why`. Returns the line to report now: this one
  /// when no line was reported within the interval, else nothing (it is counted for flush()).
  std::optional<std::string> refused(const std::string& from, const std::string& why,
                                     Clock::time_point now = Clock::now());
  /// The line summing up the refusals counted since the last line, once the interval has
  /// passed since that line (call it regularly); nothing otherwise.
  std::optional<std::string> flush(Clock::time_point now = Clock::now());
  /// The line for the refusals not reported yet, whatever the interval (the server stops).
  std::optional<std::string> flush_final(Clock::time_point now = Clock::now());

  /// Every connection refused so far.
  uint64_t total() const { return total_; }

 private:
  std::string server_;
  std::chrono::milliseconds interval_;
  Clock::time_point last_line_{};
  bool any_line_ = false;
  uint64_t total_ = 0;
  uint64_t unreported_ = 0;
  std::string latest_;  ///< the latest unreported refusal: "from A: why"
};

}  // namespace efccl::net
