#include "efccl/net/proxy.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "connection_core.h"
#include "efccl/common/log.h"
#include "efccl/net/socket.h"
#include "efccl/net/waker.h"
#include "proxy_listener.h"
#include "proxy_thread.h"
#include "proxy_wire.h"
#include "socket_task.h"

namespace efccl::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kKick{10};

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

/// Waits until `fd` is ready for `events`, checking `*abort` every 10 ms.
Status wait_socket(int fd, short events, Deadline deadline, const std::atomic<bool>* abort,
                   const std::string& what) {
  for (;;) {
    if (aborted(abort)) return Status::error("aborted " + what);
    if (deadline.expired())
      return Status::error("timed out after " + std::to_string(deadline.budget().count()) + " ms " +
                           what);
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, deadline.poll_ms(10));
    if (n > 0) return Status::ok();
    if (n < 0 && errno != EINTR) return Status::error(what + ": poll(): " + errno_text(errno));
  }
}

/// Writes `size` bytes, then reads `size_in` bytes into `in` (a hello and its reply).
Status exchange(int fd, const char* out, std::size_t size, char* in, std::size_t size_in,
                Deadline deadline, const std::atomic<bool>* abort, const std::string& what) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fd, out + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::error(what + ": send(): " + errno_text(errno));
    if (Status s = wait_socket(fd, POLLOUT, deadline, abort, what); !s) return s;
  }
  done = 0;
  while (done < size_in) {
    const ssize_t n = ::recv(fd, in + done, size_in - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return Status::error(what + ": the receiver closed the socket");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::error(what + ": recv(): " + errno_text(errno));
    if (Status s = wait_socket(fd, POLLIN, deadline, abort, what); !s) return s;
  }
  return Status::ok();
}

}  // namespace

struct Proxy::Private {};

Proxy::Proxy(const Private&, const ProxySettings& settings) : settings_(settings) {}

StatusOr<std::shared_ptr<Proxy>> Proxy::start(const ProxySettings& settings) {
  if (settings.nthreads < 1 || settings.nthreads > ProxySettings::kMaxThreads ||
      settings.nsocks_per_thread < 1 ||
      settings.sockets_per_connection() > ProxySettings::kMaxSockets)
    return Status::error("network proxy: " + settings.describe() + " is out of bounds (1 to " +
                         std::to_string(ProxySettings::kMaxThreads) + " threads, at most " +
                         std::to_string(ProxySettings::kMaxSockets) + " sockets)");
  auto proxy = std::make_shared<Proxy>(Private{}, settings);
  if (Status s = proxy->open(); !s) return Status::error("network proxy: " + s.message());
  EFCCL_INFO(kLogNet | kLogInit, -1,
             "network proxy listening at " + proxy->listen_address() + ", " + settings.describe() +
                 " per connection");
  return proxy;
}

Status Proxy::open() {
  SocketAddress any_port = settings_.interface.address;
  any_port.set_port(0);
  auto listener = listen_on(any_port, false, &listen_addr_);
  if (!listener) return listener.status();
  for (int i = 0; i < settings_.nthreads; ++i) {
    auto waker = Waker::create();
    if (!waker) return waker.status();
    std::unique_ptr<ProxyListener> l;
    if (i == 0) l = std::make_unique<ProxyListener>(*this, std::move(*listener), listen_address());
    threads_.push_back(std::make_unique<ProxyThread>(i, std::move(*waker), std::move(l)));
  }
  for (auto& t : threads_)  // all made before any runs: attach() reads threads_
    if (Status s = t->start(); !s) return s;
  return Status::ok();
}

Proxy::~Proxy() {
  for (auto& t : threads_) t->stop();  // a forked child's copy forgets its threads' state
  if (inherited()) {
    new std::map<uint64_t, std::weak_ptr<ConnectionCore>>(std::move(expecting_));  // NOLINT
    return;
  }
  std::map<uint64_t, std::weak_ptr<ConnectionCore>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(expecting_);
  }
  for (auto& [id, weak] : left)
    if (auto core = weak.lock())
      core->fail(NetConnection::Failure::kSystem, "the network proxy stopped");
}

void Proxy::tune(int fd) const {
  const int one = 1;
  const long long ms = std::max<long long>(settings_.peer_timeout.count(), 1000);
  const int idle = static_cast<int>(std::max<long long>(1, ms / 2000));
  const int interval = static_cast<int>(std::max<long long>(1, ms / 6000));
  const int probes = 3;
  const unsigned user_timeout = static_cast<unsigned>(std::min<long long>(ms, 1LL << 30));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  set_nodelay(fd);
}

StatusOr<std::unique_ptr<NetConnection>> Proxy::expect(const SlotRegion& region, std::string name,
                                                       std::string* handle) {
  if (!region.valid()) return Status::error("network connection " + name + ": no slot memory");
  if (Status s = region.layout.check(); !s)
    return Status::error("network connection " + name + ": " + s.message());
  ConnectionHandle h;
  h.address = listen_addr_;
  h.id = next_id_.fetch_add(1);
  h.token = random_token();
  h.nsocks = static_cast<uint32_t>(settings_.sockets_per_connection());
  h.layout = region.layout;
  auto core = std::make_shared<ConnectionCore>(NetConnection::Role::kRecv, region, std::move(name),
                                               h.nsocks, h.id, h.token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    expecting_[h.id] = core;
  }
  *handle = h.encode();
  return std::make_unique<NetConnection>(shared_from_this(), core);
}

StatusOr<std::unique_ptr<NetConnection>> Proxy::connect(const SlotRegion& region, std::string name,
                                                        std::string_view handle, Deadline deadline,
                                                        const std::atomic<bool>* abort) {
  const std::string what = "network connection " + name;
  if (!region.valid()) return Status::error(what + ": no slot memory");
  auto decoded = ConnectionHandle::decode(handle);
  if (!decoded) return Status::error(what + ": " + decoded.status().message());
  const ConnectionHandle& h = *decoded;
  const SlotLayout& mine = region.layout;
  if (!(h.layout == mine))
    return Status::error(
        what + ": the two ends disagree on the slots (here " + std::to_string(mine.nslots) + " x " +
        std::to_string(mine.slot_bytes) + (mine.sized ? " sized" : "") + ", at the receiver " +
        std::to_string(h.layout.nslots) + " x " + std::to_string(h.layout.slot_bytes) +
        (h.layout.sized ? " sized" : "") + ")");
  if (h.nsocks != static_cast<uint32_t>(settings_.sockets_per_connection()))
    EFCCL_INFO(kLogNet, -1,
               what + ": the receiver asks for " + std::to_string(h.nsocks) + " sockets (here " +
                   std::to_string(settings_.sockets_per_connection()) + "); using the receiver's");
  auto core = std::make_shared<ConnectionCore>(NetConnection::Role::kSend, region, std::move(name),
                                               h.nsocks, h.id, h.token);
  const std::string peer = h.address.to_string();
  core->set_peer(peer);
  std::vector<Fd> sockets;
  for (uint32_t i = 0; i < h.nsocks; ++i) {
    const std::string step =
        "connecting socket " + std::to_string(i) + " of " + what + " to " + peer;
    auto fd = connect_to(h.address, deadline, abort);
    if (!fd) return Status::error(step + ": " + fd.status().message());
    tune(fd->get());
    Hello hello;
    hello.id = h.id;
    hello.token = h.token;
    hello.index = i;
    hello.nsocks = h.nsocks;
    char out[Hello::kBytes], in[kReplyBytes];
    hello.encode(out);
    if (Status s = exchange(fd->get(), out, sizeof(out), in, sizeof(in), deadline, abort, step); !s)
      return s;
    uint32_t magic, code;
    std::memcpy(&magic, in, 4);
    std::memcpy(&code, in + 4, 4);
    if (magic != kReplyMagic)
      return Status::error(step + ": the receiver's reply is not the network transport's");
    if (code != static_cast<uint32_t>(ReplyCode::kAccepted))
      return Status::error(
          step + ": refused by the receiver: " + reply_text(static_cast<ReplyCode>(code)));
    sockets.push_back(std::move(*fd));
  }
  core->open();
  EFCCL_INFO(kLogNet, -1,
             what + ": " + std::to_string(h.nsocks) + " socket(s) to " + peer + ", " +
                 std::to_string(mine.nslots) + " slots of " + std::to_string(mine.slot_bytes) +
                 " bytes");
  for (uint32_t i = 0; i < h.nsocks; ++i) {
    if (!core->reserve_task()) break;
    attach(core, i, std::move(sockets[i]));
  }
  return std::make_unique<NetConnection>(shared_from_this(), core);
}

std::shared_ptr<ConnectionCore> Proxy::expected(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expecting_.find(id);
  if (it == expecting_.end()) return nullptr;
  auto core = it->second.lock();
  if (core == nullptr) expecting_.erase(it);
  return core;
}

void Proxy::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  expecting_.erase(id);
}

void Proxy::attach(const std::shared_ptr<ConnectionCore>& core, uint32_t index, Fd fd) {
  if (core->role == NetConnection::Role::kRecv) tune(fd.get());
  const uint32_t t = next_thread_.fetch_add(1) % static_cast<uint32_t>(threads_.size());
  threads_[t]->add(std::make_unique<SocketTask>(core, index, std::move(fd)));
}

void Proxy::kick() {
  const int64_t until = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            (Clock::now() + kKick).time_since_epoch())
                            .count();
  for (auto& t : threads_) t->kick(until);
}

void Proxy::wake_all() {
  for (auto& t : threads_) t->wake();
}

bool Proxy::on_proxy_thread() const {
  const auto me = std::this_thread::get_id();
  return std::any_of(threads_.begin(), threads_.end(),
                     [&](const auto& t) { return t->id() == me; });
}

}  // namespace efccl::net
