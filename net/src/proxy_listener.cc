#include "proxy_listener.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "connection_core.h"
#include "efccl/common/log.h"
#include "efccl/net/frame.h"
#include "efccl/net/printable.h"
#include "efccl/net/proxy.h"
#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

constexpr std::chrono::milliseconds kAcceptPause{100};  // accept failed (e.g. no descriptors)

}  // namespace

ProxyListener::ProxyListener(Proxy& proxy, Fd listener, const std::string& address)
    : proxy_(proxy), listener_(std::move(listener)), refusals_("network proxy at " + address) {}

ProxyListener::~ProxyListener() {
  if (auto line = refusals_.flush_final()) EFCCL_WARN(-1, *line);
}

std::size_t ProxyListener::add_pollfds(std::vector<pollfd>& fds) const {
  const bool paused = Clock::now() < paused_until_;
  fds.push_back({listener_.get(), static_cast<short>(paused ? 0 : POLLIN), 0});
  for (const Pending& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
  return 1 + pending_.size();
}

void ProxyListener::service(const pollfd* fds, std::size_t count) {
  const Clock::time_point now = Clock::now();
  // The pollfds describe the pending connections as they were before this call.
  for (std::size_t i = 1; i < count && i - 1 < pending_.size(); ++i) {
    Pending& p = pending_[i - 1];
    if (p.done) continue;
    if ((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0 && read_hello(p)) {
      p.done = true;
      continue;
    }
    if (now - p.since > kHelloTimeout) {
      refuse(p, "no hello within " + std::to_string(kHelloTimeout.count()) + " ms", false);
      p.done = true;
    }
  }
  std::erase_if(pending_, [](const Pending& p) { return p.done; });
  if (count > 0 && (fds[0].revents & POLLIN) != 0) accept_new();
  if (auto line = refusals_.flush(now)) EFCCL_WARN(-1, *line);
}

void ProxyListener::accept_new() {
  const Status s = accept_pending(
      listener_.get(),
      [&](Fd connection, const SocketAddress& from) {
        Pending p;
        p.fd = std::move(connection);
        p.from = from.to_string();
        p.since = Clock::now();
        pending_.push_back(std::move(p));
        while (pending_.size() > kMaxPending) {
          refuse(pending_.front(), "too many connections without a hello", false);
          pending_.pop_front();
        }
      },
      64);
  if (!s) {
    EFCCL_WARN(-1, "network proxy: " + s.message());
    paused_until_ = Clock::now() + kAcceptPause;
  }
}

bool ProxyListener::read_hello(Pending& p) {
  for (;;) {
    const ssize_t n = ::recv(p.fd.get(), p.hello + p.got, sizeof(p.hello) - p.got, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n <= 0) {
      refuse(p, n == 0 ? "closed before its hello ended" : "recv(): " + errno_text(errno), false);
      return true;
    }
    p.got += static_cast<std::size_t>(n);
    const std::string_view got(p.hello, p.got);
    if (p.got >= 4 && get_u32(got, 0) != kHelloMagic) {
      refuse(p, "its first bytes are not a network transport hello: " + printable(got, 16), false);
      return true;
    }
    if (p.got >= 8 && get_u32(got, 4) != kProxyWireVersion) {
      refuse(p,
             "network transport version " + std::to_string(get_u32(got, 4)) + ", this one " +
                 std::to_string(kProxyWireVersion),
             true, ReplyCode::kBadVersion);
      return true;
    }
    if (p.got < sizeof(p.hello)) continue;
    authenticate(p);
    return true;
  }
}

void ProxyListener::authenticate(Pending& p) {
  const Hello h = Hello::decode(p.hello);
  std::shared_ptr<ConnectionCore> core = proxy_.expected(h.id);
  if (core == nullptr) {
    refuse(p, "its hello names connection " + std::to_string(h.id) + ", which is not expected",
           true, ReplyCode::kUnknownConnection);
    return;
  }
  if (!same_token(h.token, core->token)) {
    refuse(p, "its hello for connection " + std::to_string(h.id) + " carries a wrong token", true,
           ReplyCode::kBadToken);
    return;
  }
  if (h.nsocks != core->nsocks || !core->take_socket(h.index)) {
    refuse(p,
           "socket " + std::to_string(h.index) + " of " + std::to_string(h.nsocks) +
               " for connection " + std::to_string(h.id) + " (" + std::to_string(core->nsocks) +
               " sockets, out of range or taken)",
           true, ReplyCode::kBadSocket);
    return;
  }
  char reply[kReplyBytes];
  const uint32_t magic = kReplyMagic, code = static_cast<uint32_t>(ReplyCode::kAccepted);
  std::memcpy(reply, &magic, 4);
  std::memcpy(reply + 4, &code, 4);
  // A fresh socket's buffer takes 8 bytes at once.
  if (::send(p.fd.get(), reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(reply))) {
    core->fail(NetConnection::Failure::kRemote, "could not accept socket " +
                                                    std::to_string(h.index) + " from " + p.from +
                                                    ": " + errno_text(errno));
    core->task_detached();
    return;
  }
  core->set_peer(p.from);
  EFCCL_INFO(kLogNet, -1,
             "network connection " + core->name + ": socket " + std::to_string(h.index) + " of " +
                 std::to_string(core->nsocks) + " from " + p.from);
  proxy_.attach(core, h.index, std::move(p.fd));
}

void ProxyListener::refuse(Pending& p, const std::string& why, bool reply, ReplyCode code) {
  if (reply) {
    char bytes[kReplyBytes];
    const uint32_t magic = kReplyMagic, c = static_cast<uint32_t>(code);
    std::memcpy(bytes, &magic, 4);
    std::memcpy(bytes + 4, &c, 4);
    (void)::send(p.fd.get(), bytes, sizeof(bytes), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  proxy_.count_refusal();
  if (auto line = refusals_.refused(p.from, why)) EFCCL_WARN(-1, *line);
  p.fd.reset();
}

}  // namespace efccl::net
