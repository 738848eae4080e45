// The per-device pool of launch events.
#include "launch_events.h"

#include <map>
#include <mutex>
#include <vector>

namespace efccl::device {
namespace {

struct Pool {
  std::vector<std::shared_ptr<DeviceEvent>> events;
  std::size_t next = 0;
};

}  // namespace

StatusOr<std::shared_ptr<DeviceEvent>> LaunchEvents::acquire(int device) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, Pool>();
  std::lock_guard<std::mutex> lock(mutex);
  Pool& pool = (*pools)[device];
  for (std::size_t k = 0; k < pool.events.size(); ++k) {
    const std::size_t i = (pool.next + k) % pool.events.size();
    if (pool.events[i].use_count() == 1) {  // only the pool holds it
      pool.next = i + 1;
      return pool.events[i];
    }
  }
  auto event = std::make_shared<DeviceEvent>();
  if (auto e = event->get(device); !e) return e.status();
  pool.events.push_back(event);
  return event;
}

}  // namespace efccl::device
