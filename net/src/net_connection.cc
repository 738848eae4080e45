#include "efccl/net/net_connection.h"

#include <chrono>
#include <utility>

#include "connection_core.h"
#include "efccl/common/log.h"
#include "efccl/net/proxy.h"

namespace efccl::net {

NetConnection::NetConnection(std::shared_ptr<Proxy> proxy, std::shared_ptr<ConnectionCore> core)
    : proxy_(std::move(proxy)), core_(std::move(core)) {}

NetConnection::~NetConnection() { close(); }

NetConnection::Role NetConnection::role() const { return core_->role; }
const SlotRegion& NetConnection::region() const { return core_->region; }
const std::string& NetConnection::name() const { return core_->name; }
int NetConnection::sockets() const { return static_cast<int>(core_->nsocks); }
NetConnection::State NetConnection::state() const { return core_->state(); }
NetConnection::Failure NetConnection::failure() const { return core_->failure(); }
Status NetConnection::status() const { return core_->status(); }
uint64_t NetConnection::bytes_moved() const { return core_->bytes.load(); }

Status NetConnection::wait_open(Deadline deadline, const std::atomic<bool>* abort) {
  return core_->wait_open(deadline, abort);
}

Status NetConnection::wait_for(Counter counter, uint64_t value, Deadline deadline,
                               const std::atomic<bool>* abort) {
  return core_->wait_for(counter, value, deadline, abort);
}

void NetConnection::set_failure_handler(Handler handler) { core_->set_handler(std::move(handler)); }

void NetConnection::close(std::chrono::milliseconds linger) {
  if (proxy_->inherited()) return;  // a forked child: nothing here is its to close
  if (core_->closing.load()) return;
  core_->begin_close(linger);
  proxy_->forget(core_->id);  // a receiving end accepts no more sockets
  proxy_->wake_all();
  if (proxy_->on_proxy_thread()) return;  // a handler: the tasks leave on their own
  // The tasks finish their work and leave by the linger; past it (plus a poll round) they
  // leave at once, as they do once the connection is marked ended.
  if (!core_->wait_detached(Deadline::after(linger + std::chrono::milliseconds(300)))) {
    core_->closed_here();
    proxy_->wake_all();
    if (!core_->wait_detached(Deadline::after(std::chrono::seconds(5))))
      EFCCL_WARN(-1, "network connection " + core_->name +
                         ": its proxy tasks did not stop within 5 s after close");
  }
  core_->closed_here();
}

}  // namespace efccl::net
