#include "select/selection_observer.h"

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

}  // namespace

void notify_selection(const SelectionRecord& record) {
  std::lock_guard<std::mutex> lock(observer_mutex());
  if (observer()) observer()(record);
}

void set_selection_observer(std::function<void(const SelectionRecord&)> o) {
  std::lock_guard<std::mutex> lock(observer_mutex());
  observer() = std::move(o);
}

}  // namespace efccl::runtime
