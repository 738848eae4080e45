#include "launch/network_proxy.h"

#include <unistd.h>

#include <atomic>
#include <mutex>

#include "efccl/common/log.h"

namespace efccl::runtime {

namespace {

std::mutex mu;
// Never destroyed: the proxy's threads serve connections until the process exits.
std::shared_ptr<net::Proxy>* const proxy = new std::shared_ptr<net::Proxy>();
pid_t owner = 0;
/// This process's running proxy, for kicks without the lock (null until started here).
std::atomic<net::Proxy*> running{nullptr};

}  // namespace

void kick_network_proxy() {
  if (net::Proxy* p = running.load(std::memory_order_acquire); p != nullptr && !p->inherited())
    p->kick();
}

StatusOr<std::shared_ptr<net::Proxy>> network_proxy() {
  std::lock_guard<std::mutex> lock(mu);
  if (*proxy != nullptr && owner == getpid()) return *proxy;
  if (*proxy != nullptr) {
    // Inherited through fork(): its threads do not exist here and its sockets are /dev/null.
    new std::shared_ptr<net::Proxy>(std::move(*proxy));  // NOLINT: leaked on purpose
  }
  auto settings = net::ProxySettings::from_environment();
  if (!settings) return Status::error("the network proxy: " + settings.status().message());
  auto started = net::Proxy::start(*settings);
  if (!started) return started.status();
  *proxy = *started;
  owner = getpid();
  running.store(proxy->get(), std::memory_order_release);  // never destroyed (above)
  return *proxy;
}

}  // namespace efccl::runtime
