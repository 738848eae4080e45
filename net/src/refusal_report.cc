#include "efccl/net/refusal_report.h"

#include <utility>

namespace efccl::net {

RefusalReport::RefusalReport(std::string server, std::chrono::milliseconds interval)
    : server_(std::move(server)), interval_(interval) {}

std::optional<std::string> RefusalReport::refused(const std::string& from, const std::string& why,
                                                  Clock::time_point now) {
  ++total_;
  if (!any_line_ || now - last_line_ >= interval_) {
    std::string line = server_ + ": refused a connection from " + from + ": " + why;
    if (unreported_ > 0)
      line += " (and " + std::to_string(unreported_) + " more since the last report)";
    unreported_ = 0;
    latest_.clear();
    any_line_ = true;
    last_line_ = now;
    return line;
  }
  ++unreported_;
  latest_ = "from " + from + ": " + why;
  return std::nullopt;
}

std::optional<std::string> RefusalReport::flush(Clock::time_point now) {
  if (now - last_line_ < interval_) return std::nullopt;
  return flush_final(now);
}

std::optional<std::string> RefusalReport::flush_final(Clock::time_point now) {
  if (unreported_ == 0) return std::nullopt;
  std::string line = server_ + ": refused " + std::to_string(unreported_) + " more connection" +
                     (unreported_ == 1 ? "" : "s") + " since the last report (the latest " +
                     latest_ + ")";
  unreported_ = 0;
  latest_.clear();
  last_line_ = now;
  return line;
}

}  // namespace efccl::net
