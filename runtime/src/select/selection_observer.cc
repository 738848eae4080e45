#include "select/selection_observer.h"

#include <atomic>
#include <mutex>

namespace efccl::runtime {
namespace {

std::mutex& observer_mutex() {
  static std::mutex m;
  return m;
}
std::function<void(const SelectionRecord&)>& observer() {
  static std::function<void(const SelectionRecord&)> o;
  return o;
}

std::atomic<bool> g_observed{false};  // lets callers skip the mutex and the record

}  // namespace

void notify_selection(const SelectionRecord& record) {
  if (!g_observed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(observer_mutex());
  if (observer()) observer()(record);
}

bool selection_observed() { return g_observed.load(std::memory_order_relaxed); }

void set_selection_observer(std::function<void(const SelectionRecord&)> o) {
  std::lock_guard<std::mutex> lock(observer_mutex());
  observer() = std::move(o);
  g_observed.store(static_cast<bool>(observer()), std::memory_order_relaxed);
}

}  // namespace efccl::runtime
