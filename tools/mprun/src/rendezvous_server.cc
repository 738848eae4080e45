#include "rendezvous_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/deadline.h"
#include "efccl/net/printable.h"
#include "efccl/net/socket.h"

namespace efccl::mprun {
namespace {

constexpr auto kReplyDeadline = std::chrono::seconds(5);       // the peer list into a rank's socket
constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // accept failed (no descriptors)

}  // namespace

StatusOr<RendezvousServer> RendezvousServer::start(int size, std::string job, Limits limits) {
  RendezvousServer server;
  server.size_ = size;
  server.job_ = std::move(job);
  server.limits_ = limits;
  auto loopback =
      net::SocketAddress::parse("127.0.0.1:1", AF_INET, net::SocketAddress::Lookup::kNumericOnly);
  if (!loopback) return loopback.status();
  loopback->set_port(0);
  auto fd = net::listen_on(*loopback, true, &server.address_);
  if (!fd) return Status::error("rendezvous server: " + fd.status().message());
  server.listener_ = std::move(*fd);
  server.peers_.assign(static_cast<size_t>(size), net::SocketAddress());
  return server;
}

std::vector<int> RendezvousServer::fds() const {
  std::vector<int> out;
  out.push_back(Clock::now() >= accept_paused_until_ ? listener_.get() : -1);
  for (const Connection& c : connections_) out.push_back(c.fd.get());
  return out;
}

void RendezvousServer::report(std::optional<std::string> line, std::vector<Event>* events) {
  if (line) events->push_back({Event::Kind::kWarning, -1, 0, std::move(*line)});
}

void RendezvousServer::handle(int fd, std::vector<Event>* events) {
  if (fd < 0) return;
  if (fd == listener_.get()) {
    accept_all(events);
    return;
  }
  auto it = std::find_if(connections_.begin(), connections_.end(),
                         [fd](const Connection& c) { return c.fd.get() == fd; });
  if (it == connections_.end()) return;
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  bool keep = n > 0;  // 0: the rank closed (it exited or finalized); < 0: a socket error
  if (keep) {
    it->input.append(buf, static_cast<size_t>(n));
    size_t nl;
    while (keep && (nl = it->input.find('\n')) != std::string::npos) {
      const std::string line = it->input.substr(0, nl);
      it->input.erase(0, nl + 1);
      keep = on_line(*it, line, events);
    }
    if (keep && it->input.size() > kMaxLineSize) {
      reject(*it, "a line longer than " + std::to_string(kMaxLineSize) + " bytes", events);
      keep = false;
    }
  }
  if (!keep) connections_.erase(it);
}

void RendezvousServer::accept_all(std::vector<Event>* events) {
  const Clock::time_point now = Clock::now();
  const Status s =
      net::accept_pending(listener_.get(), [&](net::Fd fd, const net::SocketAddress& from) {
        connections_.push_back(Connection{std::move(fd), {}, -1, from.to_string(), now});
      });
  if (!s) {
    report("rendezvous server: " + s.message(), events);
    accept_paused_until_ = now + kAcceptPause;
  }
  // The newest strangers are kept: a rank says HELLO as soon as it connected.
  size_t strangers = 0;
  for (auto it = connections_.rbegin(); it != connections_.rend(); ++it)
    if (it->rank < 0 && it->fd.valid() && ++strangers > limits_.max_strangers) {
      reject(*it, "too many connections without HELLO", events);
      it->fd.reset();
    }
  std::erase_if(connections_, [](const Connection& c) { return !c.fd.valid(); });
}

void RendezvousServer::tick(std::vector<Event>* events) {
  const Clock::time_point now = Clock::now();
  for (Connection& c : connections_)
    if (c.rank < 0 && now - c.since > limits_.hello_timeout) {
      reject(c, "no HELLO within " + std::to_string(limits_.hello_timeout.count()) + " ms", events);
      c.fd.reset();
    }
  std::erase_if(connections_, [](const Connection& c) { return !c.fd.valid(); });
  report(refusals_.flush(now), events);
}

void RendezvousServer::finish(std::vector<Event>* events) {
  report(refusals_.flush_final(), events);
}

void RendezvousServer::reject(Connection& c, const std::string& why, std::vector<Event>* events) {
  report(refusals_.refused(c.from, why), events);
  // Best effort and without waiting: a stranger that does not read gets nothing.
  const std::string line = format_error(why);
  (void)::send(c.fd.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool RendezvousServer::on_line(Connection& c, const std::string& line, std::vector<Event>* events) {
  if (c.rank >= 0) {
    auto abort = parse_abort(line);
    if (!abort) {
      events->push_back(
          {Event::Kind::kWarning, c.rank, 0,
           "rendezvous server: rank " + std::to_string(c.rank) + ": " + abort.status().message()});
      return true;
    }
    events->push_back({Event::Kind::kAbort, c.rank, abort->second, ""});
    return true;
  }
  auto hello = parse_hello(line);
  if (!hello) {
    reject(c, hello.status().message(), events);
    return false;
  }
  if (hello->job != job_) {
    reject(c, "HELLO from another job (key '" + net::printable(hello->job, 40) + "')", events);
    return false;
  }
  if (hello->size != size_) {
    reject(c,
           "rank " + std::to_string(hello->rank) + " says the job has " +
               std::to_string(hello->size) + " ranks; efccl-mprun started " + std::to_string(size_),
           events);
    return false;
  }
  if (peers_sent_ || peers_[static_cast<size_t>(hello->rank)].valid()) {
    reject(c, "rank " + std::to_string(hello->rank) + " registered twice", events);
    return false;
  }
  c.rank = hello->rank;
  peers_[static_cast<size_t>(c.rank)] = hello->listen;
  if (++registered_ < size_) return true;

  // Everyone is here: tell each rank where the others listen.
  peers_sent_ = true;
  const std::string reply = format_peers(peers_);
  for (Connection& other : connections_) {
    if (other.rank < 0) continue;
    if (Status s = net::send_all(other.fd.get(), reply.data(), reply.size(),
                                 net::Deadline::after(kReplyDeadline));
        !s)
      events->push_back({Event::Kind::kWarning, other.rank, 0,
                         "rendezvous server: rank " + std::to_string(other.rank) +
                             ": sending the peer list: " + s.message()});
  }
  return true;
}

}  // namespace efccl::mprun
