#include "rendezvous_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "efccl/mprun/rendezvous.h"

namespace efccl::mprun {
namespace {

constexpr auto kReplyDeadline = std::chrono::seconds(5);  // a few bytes into a fresh socket

}  // namespace

StatusOr<RendezvousServer> RendezvousServer::start(int size, std::string job) {
  RendezvousServer server;
  server.size_ = size;
  server.job_ = std::move(job);
  auto fd = listen_tcp("127.0.0.1", 0, std::min(size, 1024) + 16, &server.address_);
  if (!fd) return Status::error("rendezvous server: " + fd.status().message());
  server.listener_ = std::move(*fd);
  server.peers_.assign(static_cast<size_t>(size), Address{});
  return server;
}

std::vector<int> RendezvousServer::fds() const {
  std::vector<int> out{listener_.get()};
  for (const Connection& c : connections_) out.push_back(c.fd.get());
  return out;
}

void RendezvousServer::handle(int fd, std::vector<Event>* events) {
  if (fd == listener_.get()) {
    accept_one(events);
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
      reject(*it, "line longer than " + std::to_string(kMaxLineSize) + " bytes", events);
      keep = false;
    }
  }
  if (!keep) connections_.erase(it);
}

void RendezvousServer::accept_one(std::vector<Event>* events) {
  auto fd = accept_tcp(listener_.get(), Deadline::after(std::chrono::milliseconds(0)));
  if (!fd) return;  // the client gave up before we accepted it
  if (connections_.size() >= static_cast<size_t>(2 * size_ + 16)) {
    events->push_back(
        {Event::Kind::kWarning, -1, 0, "rendezvous server: too many connections; refusing one"});
    return;
  }
  connections_.push_back(Connection{std::move(*fd), {}, -1});
}

void RendezvousServer::reject(Connection& c, const std::string& why, std::vector<Event>* events) {
  events->push_back({Event::Kind::kWarning, c.rank, 0, "rendezvous server: " + why});
  const std::string line = format_error(why);
  (void)send_all(c.fd.get(), line.data(), line.size(), Deadline::after(kReplyDeadline));
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
    reject(c, "HELLO from another job (key '" + hello->job.substr(0, 40) + "')", events);
    return false;
  }
  if (hello->size != size_) {
    reject(c,
           "rank " + std::to_string(hello->rank) + " says the job has " +
               std::to_string(hello->size) + " ranks; efccl-mprun started " + std::to_string(size_),
           events);
    return false;
  }
  if (peers_sent_ || peers_[static_cast<size_t>(hello->rank)].port != 0) {
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
    if (Status s =
            send_all(other.fd.get(), reply.data(), reply.size(), Deadline::after(kReplyDeadline));
        !s)
      events->push_back({Event::Kind::kWarning, other.rank, 0,
                         "rendezvous server: rank " + std::to_string(other.rank) +
                             ": sending the peer list: " + s.message()});
  }
  return true;
}

}  // namespace efccl::mprun
