#include "launch/network_proxy.h"

#include <unistd.h>

#include <mutex>

#include "efccl/common/log.h"

namespace efccl::runtime {

StatusOr<std::shared_ptr<net::Proxy>> network_proxy() {
  static std::mutex mu;
  // Never destroyed: the proxy's threads serve connections until the process exits.
  static auto* proxy = new std::shared_ptr<net::Proxy>();
  static pid_t owner = 0;
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
  return *proxy;
}

}  // namespace efccl::runtime
