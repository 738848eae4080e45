#include "bootstrap_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <sstream>
#include <utility>

#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/frame.h"
#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kPollSlice{10};           // abort flags are checked this often
constexpr milliseconds kStrangerTimeout{10000};  // an unauthenticated connection may idle
constexpr std::size_t kMaxStrangers = 128;       // unauthenticated connections kept at once
constexpr milliseconds kGoodbyeLimit{1000};      // close(): wait for peers to acknowledge
constexpr milliseconds kAcceptPause{100};        // accept failed (e.g. no descriptors left)
constexpr std::size_t kReadChunk = std::size_t{64} << 10;  // bytes read from a socket at once
constexpr std::size_t kReadBudget = std::size_t{1} << 20;  // per connection and poll round

std::string hex(uint64_t v) {
  std::ostringstream m;
  m << "0x" << std::hex << v;
  return m.str();
}

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<milliseconds>(to - from).count();
}

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

/// The earlier of `deadline` and one poll slice from now.
Clock::time_point slice_end(const Deadline& deadline) {
  return std::min(deadline.when(), Clock::now() + kPollSlice);
}

/// Takes `lock` unless `deadline` passes or `*abort` is set first. Polls (contention is rare:
/// one writer per connection); std::timed_mutex would do, but TSan cannot see its locks.
bool lock_until(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                const std::atomic<bool>* abort) {
  while (!lock.try_lock()) {
    if (aborted(abort) || deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace

BootstrapTransport::BootstrapTransport(uint64_t magic, int nranks, int rank,
                                       const SocketAddress& root, Deadline deadline)
    : magic_(magic),
      nranks_(nranks),
      rank_(rank),
      root_(root),
      root_name_(root.to_string()),
      deadline_(deadline),
      started_(Clock::now()),
      buffer_(kReadChunk),
      refusals_("bootstrap rank " + std::to_string(rank)),
      peers_(new PeerState[static_cast<std::size_t>(nranks)]) {}

BootstrapTransport::~BootstrapTransport() = default;

Status BootstrapTransport::open(const SocketAddress& local, const std::string& info,
                                uint64_t rank0_token) {
  SocketAddress any_port = local;
  any_port.set_port(0);
  auto listener = listen_on(any_port, false, &listen_addr_);
  if (!listener) return listener.status();
  listen_ = std::move(*listener);
  auto waker = Waker::create();
  if (!waker) return waker.status();
  waker_ = std::make_unique<Waker>(std::move(*waker));
  std::string hello;
  put_u32(hello, kProtocolVersion);
  put_u32(hello, static_cast<uint32_t>(nranks_));
  put_u32(hello, static_cast<uint32_t>(rank_));
  put_u32(hello, 0);
  hello.append(reinterpret_cast<const char*>(&listen_addr_), sizeof(SocketAddress));
  hello += info;
  root_link_ = std::make_unique<RootLink>(magic_, nranks_, root_, deadline_,
                                          frame_bytes(magic_, kRootHello, 0, rank0_token, hello));
  auto self = shared_from_this();
  std::lock_guard<std::mutex> lock(mu_);  // run() starts by taking it: sees thread_id_
  try {
    thread_ = std::thread([self] { self->run(); });
  } catch (const std::exception& e) {
    return Status::error(std::string("cannot start the bootstrap's progress thread: ") + e.what());
  }
  open_handles_ = 1;
  thread_id_ = thread_.get_id();
  return Status::ok();
}

bool BootstrapTransport::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_ == Phase::kReady;
}

void BootstrapTransport::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  ++open_handles_;
}

void BootstrapTransport::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_handles_ > 0) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (getpid() != owner_pid_) {
    // An inherited copy in a forked child: the thread does not exist here (nothing to join)
    // and the descriptors are /dev/null already. Forget the thread object.
    new std::thread(std::move(thread_));  // NOLINT: leaked on purpose, never destroyed
    return;
  }
  waker_->wake();
  if (std::this_thread::get_id() == thread_id_)
    thread_.detach();  // a handler closed its own bootstrap: the thread owns `this` until it ends
  else if (thread_.joinable())
    thread_.join();
}

Status BootstrapTransport::wait_ready(Deadline deadline, const std::atomic<bool>* abort) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (phase_ == Phase::kReady) return Status::ok();
    if (phase_ == Phase::kFailed) return Status::error(fail_reason_);
    if (stopping_) return Status::error("the bootstrap was closed during the rendezvous");
    if (aborted(abort) || deadline.expired()) {
      std::string progress;
      if (!root_reached_)
        progress = "could not reach the rendezvous root at " + root_name_ +
                   (last_connect_error_.empty() ? "" : " (" + last_connect_error_ + ")");
      else if (joined_ >= 0)
        progress = "only " + std::to_string(joined_) + " of " + std::to_string(nranks_) +
                   " ranks joined the rendezvous at " + root_name_;
      else
        progress = "the rendezvous at " + root_name_ + " did not complete (no report yet)";
      if (aborted(abort)) return Status::error("aborted: " + progress);
      // The init's own deadline: report the limit it was made with (the init timeout).
      const long long waited = deadline.when() == deadline_.when() ? deadline_.budget().count()
                                                                   : deadline.budget().count();
      return Status::error(progress + " within " + std::to_string(waited) + " ms");
    }
    cv_.wait_until(lock, slice_end(deadline));
  }
}

void BootstrapTransport::deliver(uint64_t space, int from, uint64_t tag, std::string payload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mail_[MailKey{space, from, tag}].push_back(std::move(payload));
  }
  cv_.notify_all();
}

Status BootstrapTransport::send(int peer, int shown, uint64_t space, uint64_t tag,
                                std::string_view data, Deadline deadline,
                                const std::atomic<bool>* abort) {
  if (data.size() > Bootstrap::kMaxMessageBytes)
    return Status::error("a message of " + std::to_string(data.size()) +
                         " bytes exceeds the bootstrap's limit of " +
                         std::to_string(Bootstrap::kMaxMessageBytes));
  if (peer == rank_) {
    deliver(space, peer, tag, std::string(data));
    return Status::ok();
  }
  auto conn = connection_to(peer, shown, deadline, abort);
  if (!conn) return conn.status();
  BootstrapConnection& c = **conn;
  std::unique_lock<std::mutex> wl(c.write_mu, std::defer_lock);
  if (!lock_until(wl, deadline, abort))
    return Status::error(std::string(aborted(abort) ? "aborted" : "timed out") +
                         " waiting to send to rank " + std::to_string(shown));
  if (c.write_broken || c.closed.load())
    return Status::error("the connection to rank " + std::to_string(shown) + " is broken" +
                         peer_state_suffix(peer));
  FrameHeader h;
  h.magic = magic_;
  h.type = kData;
  h.space = space;
  h.tag = tag;
  h.length = data.size();
  std::size_t written = 0;
  Status s = write_frame(c.fd.get(), h, data, deadline, abort, &written);
  if (s) {
    peers_[static_cast<std::size_t>(peer)].sent.fetch_add(1);
    return s;
  }
  if (written > 0) {
    // Half a frame is on the wire: the stream cannot be used again.
    c.write_broken = true;
    ::shutdown(c.fd.get(), SHUT_RDWR);
  }
  return Status::error("sending " + std::to_string(data.size()) + " bytes to rank " +
                       std::to_string(shown) + " (" + c.remote + "): " + s.message() +
                       peer_state_suffix(peer));
}

Status BootstrapTransport::connect(int peer, int shown, Deadline deadline,
                                   const std::atomic<bool>* abort) {
  if (peer == rank_) return Status::ok();
  auto conn = connection_to(peer, shown, deadline, abort);
  return conn ? Status::ok() : conn.status();
}

Status BootstrapTransport::mail_wait_ended(const std::string& what, Clock::time_point begin,
                                           const Deadline& deadline,
                                           const std::atomic<bool>* abort) const {
  if (!broken_.empty()) return Status::error("waiting for " + what + ": " + broken_);
  if (stopping_) return Status::error("the bootstrap was closed while waiting for " + what);
  if (aborted(abort)) return Status::error("aborted while waiting for " + what);
  if (deadline.expired())
    return Status::error("timed out after " + std::to_string(ms_between(begin, deadline.when())) +
                         " ms waiting for " + what);
  return Status::ok();
}

StatusOr<std::string> BootstrapTransport::recv(int peer, int shown, uint64_t space, uint64_t tag,
                                               Deadline deadline, const std::atomic<bool>* abort) {
  const Clock::time_point begin = Clock::now();
  const MailKey key{space, peer, tag};
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = mail_.find(key);
    if (it != mail_.end() && !it->second.empty()) {
      std::string m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) mail_.erase(it);
      return m;
    }
    const std::string what =
        "a message from rank " + std::to_string(shown) + " (tag " + hex(tag) + ")";
    if (peer != rank_) {
      const PeerState& p = peers_[static_cast<std::size_t>(peer)];
      if (p.failed) return Status::error("waiting for " + what + ": " + p.why);
      if (p.left)
        return Status::error("waiting for " + what + ": rank " + std::to_string(shown) +
                             " closed its bootstrap (left) without sending it");
    }
    if (Status s = mail_wait_ended(what, begin, deadline, abort); !s) return s;
    cv_.wait_until(lock, slice_end(deadline));
  }
}

StatusOr<std::pair<std::size_t, std::string>> BootstrapTransport::recv_any(
    const std::vector<int>& peers, uint64_t space, uint64_t tag, Deadline deadline,
    const std::atomic<bool>* abort) {
  const Clock::time_point begin = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    for (std::size_t i = 0; i < peers.size(); ++i) {
      auto it = mail_.find(MailKey{space, peers[i], tag});
      if (it == mail_.end() || it->second.empty()) continue;
      std::string m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) mail_.erase(it);
      return std::make_pair(i, std::move(m));
    }
    const std::string what = "a message with tag " + hex(tag) + " from any of " +
                             std::to_string(peers.size()) + " ranks";
    if (Status s = mail_wait_ended(what, begin, deadline, abort); !s) return s;
    cv_.wait_until(lock, slice_end(deadline));
  }
}

uint64_t BootstrapTransport::add_handler(std::vector<int> members, const Handler& fn, uint64_t id) {
  std::vector<std::pair<int, std::string>> already;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == 0) id = ++next_handler_;
    if (!fn) {
      handlers_.erase(id);
      return id;
    }
    for (std::size_t i = 0; i < members.size(); ++i) {
      const PeerState& p = peers_[static_cast<std::size_t>(members[i])];
      if (p.failed) already.emplace_back(static_cast<int>(i), p.why);
    }
    handlers_[id] = HandlerEntry{std::move(members), fn};
  }
  for (const auto& [peer, why] : already) fn(peer, why);
  return id;
}

void BootstrapTransport::remove_handler(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_.erase(id);
}

std::string BootstrapTransport::peer_state_suffix(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  const PeerState& p = peers_[static_cast<std::size_t>(peer)];
  if (p.failed) return " (" + p.why + ")";
  if (p.left) return " (it closed its bootstrap)";
  return "";
}

StatusOr<std::shared_ptr<BootstrapConnection>> BootstrapTransport::connection_to(
    int peer, int shown, Deadline deadline, const std::atomic<bool>* abort) {
  // Always the same connection once chosen, so that messages keep their order: one the peer
  // opened, else one opened here.
  PeerState& p = peers_[static_cast<std::size_t>(peer)];
  const std::string who = "rank " + std::to_string(shown);
  std::unique_lock<std::mutex> cl(p.connect_mu, std::defer_lock);
  if (!lock_until(cl, deadline, abort))
    return Status::error(std::string(aborted(abort) ? "aborted" : "timed out") + " connecting to " +
                         who);
  SocketAddress addr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (p.failed) return Status::error("cannot send to " + who + ": " + p.why);
    if (p.left) return Status::error("cannot send to " + who + ": it closed its bootstrap");
    if (stopping_) return Status::error("the bootstrap was closed");
    if (phase_ != Phase::kReady)
      return Status::error("cannot send to " + who + " before the rendezvous completed");
    if (p.send_conn && !p.send_conn->closed.load()) return p.send_conn;
    for (const auto& c : conns_)
      if (c->peer == peer && !c->closed.load()) return p.send_conn = c;
    addr = addrs_[static_cast<std::size_t>(peer)];
  }
  int error = 0;
  Fd fd = start_connect(addr, &error);
  for (;;) {
    if (error != 0)
      return Status::error("cannot connect to " + who + " at " + addr.to_string() + ": " +
                           errno_text(error) + peer_state_suffix(peer));
    pollfd pf{fd.get(), POLLOUT, 0};
    const int rc = ::poll(&pf, 1, deadline.poll_ms(static_cast<int>(kPollSlice.count())));
    if (rc > 0) {
      error = socket_error(fd.get());
      if (error == 0) break;
      continue;
    }
    if (aborted(abort)) return Status::error("aborted while connecting to " + who);
    if (deadline.expired())
      return Status::error("timed out connecting to " + who + " at " + addr.to_string());
  }
  set_nodelay(fd.get());
  auto conn = std::make_shared<BootstrapConnection>(magic_);
  conn->fd = std::move(fd);
  conn->peer = peer;
  conn->outgoing = true;
  conn->remote = addr.to_string();
  conn->since = Clock::now();
  std::string hello;
  put_u32(hello, static_cast<uint32_t>(nranks_));
  put_u32(hello, static_cast<uint32_t>(rank_));
  put_u32(hello, static_cast<uint32_t>(peer));
  FrameHeader h;
  h.magic = magic_;
  h.type = kPeerHello;
  h.length = hello.size();
  std::size_t written = 0;
  if (Status s = write_frame(conn->fd.get(), h, hello, deadline, abort, &written); !s)
    return Status::error("greeting " + who + " at " + conn->remote + ": " + s.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::error("the bootstrap was closed");
    if (!broken_.empty()) return Status::error("cannot send to " + who + ": " + broken_);
    conns_.push_back(conn);
    p.send_conn = conn;
  }
  waker_->wake();
  EFCCL_INFO(kLogNet, -1,
             "bootstrap rank " + std::to_string(rank_) + ": connected to rank " +
                 std::to_string(peer) + " at " + conn->remote);
  return conn;
}

void BootstrapTransport::fail_rendezvous(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != Phase::kJoining) return;
    phase_ = Phase::kFailed;
    fail_reason_ = why;
  }
  cv_.notify_all();
}

void BootstrapTransport::apply(RootLink::Update& u) {
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (u.reached) root_reached_ = true;
    if (u.connect_error) last_connect_error_ = *u.connect_error;
    if (u.joined) joined_ = *u.joined;
    if (u.table && phase_ == Phase::kJoining) {
      addrs_ = std::move(u.addresses);
      infos_ = std::move(u.infos);
      joined_ = nranks_;
      phase_ = Phase::kReady;
      ready = true;
    }
  }
  cv_.notify_all();
  if (u.failed) fail_rendezvous(*u.failed);
  if (ready)
    EFCCL_INFO(kLogInit, -1,
               "bootstrap rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) +
                   ": all ranks joined the rendezvous at " + root_name_ + " after " +
                   std::to_string(ms_between(started_, Clock::now())) + " ms");
}

void BootstrapTransport::accept_all() {
  const Status s = accept_pending(listen_.get(), [&](Fd fd, const SocketAddress& from) {
    auto c = std::make_shared<BootstrapConnection>(magic_);
    c->fd = std::move(fd);
    c->remote = from.to_string();
    c->since = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(std::move(c));
  });
  if (!s) {
    EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": " + s.message());
    listen_paused_until_ = Clock::now() + kAcceptPause;  // e.g. out of descriptors: no busy loop
  }
}

void BootstrapTransport::refuse(BootstrapConnection& c, const std::string& why) {
  if (auto line = refusals_.refused(c.remote, why)) EFCCL_WARN(-1, *line);
  drop(c);
}

void BootstrapTransport::drop(BootstrapConnection& c) {
  c.closed.store(true);
  ::shutdown(c.fd.get(), SHUT_RDWR);  // the fd itself closes with the last reference
}

void BootstrapTransport::peer_broken(int peer, const std::string& why) {
  std::vector<std::pair<int, Handler>> calls;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PeerState& p = peers_[static_cast<std::size_t>(peer)];
    if (stopping_ || p.failed || p.left) return;
    p.failed = true;
    p.why = message = "rank " + std::to_string(peer) + " failed: " + why;
    for (const auto& [id, h] : handlers_)
      for (std::size_t i = 0; i < h.members.size(); ++i)
        if (h.members[i] == peer) calls.emplace_back(static_cast<int>(i), h.fn);
  }
  cv_.notify_all();
  EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": " + message);
  for (auto& [local, fn] : calls) fn(local, message);
}

bool BootstrapTransport::on_frame(BootstrapConnection& c, const FrameHeader& h,
                                  std::string payload) {
  if (c.peer < 0) {
    const auto n = get_u32(payload, 0);
    const auto from = get_u32(payload, 4);
    const auto to = get_u32(payload, 8);
    if (n != static_cast<uint32_t>(nranks_) || to != static_cast<uint32_t>(rank_) ||
        from >= static_cast<uint32_t>(nranks_) || from == static_cast<uint32_t>(rank_)) {
      refuse(c, "hello from rank " + std::to_string(from) + " of " + std::to_string(n) +
                    " to rank " + std::to_string(to) + " does not fit rank " +
                    std::to_string(rank_) + " of " + std::to_string(nranks_));
      return false;
    }
    const int peer = static_cast<int>(from);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const PeerState& p = peers_[static_cast<std::size_t>(peer)];
      if (p.failed || p.left)
        c.closed.store(true);
      else
        c.peer = peer;
    }
    if (c.peer < 0) {
      refuse(c, "rank " + std::to_string(peer) + " had already failed or left");
      return false;
    }
    EFCCL_INFO(kLogNet, -1,
               "bootstrap rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                   " connected from " + c.remote);
    return true;
  }
  if (h.type == kData) {
    {
      // The message and the count together: a receiver that sees `left` finds it queued.
      std::lock_guard<std::mutex> lock(mu_);
      mail_[MailKey{h.space, c.peer, h.tag}].push_back(std::move(payload));
      PeerState& p = peers_[static_cast<std::size_t>(c.peer)];
      ++p.received;
      if (p.goodbye && !p.failed && p.received >= p.announced) p.left = true;
    }
    cv_.notify_all();
    return true;
  }
  // kGoodbye: the peer leaves in order; nothing it does from now on is a failure. Its tag
  // field carries the number of data frames it sent here (PeerState::left).
  c.goodbye = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PeerState& p = peers_[static_cast<std::size_t>(c.peer)];
    p.goodbye = true;
    p.announced = std::max(p.announced, h.tag);
    if (!p.failed && p.received >= p.announced) p.left = true;
  }
  cv_.notify_all();
  ::shutdown(c.fd.get(), SHUT_WR);  // acknowledges: the peer's close() sees our end of stream
  return true;
}

void BootstrapTransport::on_readable(BootstrapConnection& c) {
  std::string why;
  const auto check = [&](const FrameHeader& h, std::string* reason) {
    bool ok;
    if (c.peer < 0)
      ok = h.type == kPeerHello && h.length == kPeerHelloBytes;
    else
      ok = (h.type == kData && h.length <= Bootstrap::kMaxMessageBytes) ||
           (h.type == kGoodbye && h.length == 0);
    if (!ok)
      *reason = "unexpected message type " + std::to_string(h.type) + " of " +
                std::to_string(h.length) + " bytes";
    return ok;
  };
  const auto frame = [&](const FrameHeader& h, std::string payload) {
    return on_frame(c, h, std::move(payload));
  };
  const FrameReader::Result rr =
      c.reader.read(c.fd.get(), buffer_, kReadBudget, check, frame, &why);
  if (rr == FrameReader::Result::kAgain || c.closed.load()) return;
  if (rr == FrameReader::Result::kStop) return;
  if (c.peer < 0) {
    if (rr == FrameReader::Result::kBad)
      refuse(c, why);
    else
      drop(c);  // a stranger that hung up
    return;
  }
  drop(c);
  if (c.goodbye) return;
  if (rr == FrameReader::Result::kBad)
    peer_broken(c.peer, "it sent a malformed message on " + c.remote + " (" + why + ")");
  else if (rr == FrameReader::Result::kEof)
    peer_broken(c.peer, "the connection to " + c.remote + " was closed (end of file)");
  else
    peer_broken(c.peer, "the connection to " + c.remote + " broke (" + why + ")");
}

void BootstrapTransport::expire_strangers() {
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<BootstrapConnection>> strangers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = conns_.rbegin(); it != conns_.rend(); ++it)
      if ((*it)->peer < 0 && !(*it)->closed.load()) strangers.push_back(*it);
  }
  // The newest are kept (a rank says hello as soon as it connected), the oldest dropped.
  for (std::size_t i = 0; i < strangers.size(); ++i) {
    if (now - strangers[i]->since > kStrangerTimeout)
      refuse(*strangers[i], "no hello within " + std::to_string(kStrangerTimeout.count()) + " ms");
    else if (i >= kMaxStrangers)
      refuse(*strangers[i], "too many connections without a hello");
  }
  if (auto line = refusals_.flush(now)) EFCCL_WARN(-1, *line);
}

void BootstrapTransport::run() {
  try {
    serve();
  } catch (const std::exception& e) {
    crash(std::string("the bootstrap's progress thread failed: ") + e.what());
    return;
  } catch (...) {
    crash("the bootstrap's progress thread failed (an unknown exception)");
    return;
  }
  try {
    say_goodbye();
  } catch (...) {
    // Out of memory while leaving: the peers see the connections close instead.
    listen_.reset();
  }
}

void BootstrapTransport::serve() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<BootstrapConnection>> snapshot;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      std::erase_if(conns_, [](const auto& c) { return c->closed.load(); });
      snapshot = conns_;
    }
    const bool listening = Clock::now() >= listen_paused_until_;
    fds.clear();
    fds.push_back({waker_->fd(), POLLIN, 0});
    fds.push_back({listening ? listen_.get() : -1, POLLIN, 0});
    fds.push_back(root_link_->poll_entry());
    for (const auto& c : snapshot) fds.push_back({c->fd.get(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), root_link_->poll_timeout_ms(100));
    if (rc < 0 && errno != EINTR) {
      EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": poll(): " + errno_text(errno));
      std::this_thread::sleep_for(kPollSlice);
      continue;
    }
    if (fds[0].revents != 0) waker_->drain();
    RootLink::Update update;
    root_link_->step(fds[2].revents, buffer_, &update);
    apply(update);
    for (std::size_t i = 0; i < snapshot.size(); ++i)
      if ((fds[i + 3].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !snapshot[i]->closed.load())
        on_readable(*snapshot[i]);
    if ((fds[1].revents & POLLIN) != 0) accept_all();
    expire_strangers();
  }
}

void BootstrapTransport::crash(const std::string& why) noexcept {
  try {
    EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": " + why);
    std::vector<std::pair<int, Handler>> calls;
    std::vector<std::shared_ptr<BootstrapConnection>> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = why;
      if (phase_ == Phase::kJoining) {
        phase_ = Phase::kFailed;
        fail_reason_ = why;
      }
      conns.swap(conns_);
      for (const auto& c : conns) {
        if (c->peer < 0 || c->goodbye) continue;
        PeerState& p = peers_[static_cast<std::size_t>(c->peer)];
        if (p.failed || p.left) continue;
        p.failed = true;
        p.why = why;
        for (const auto& [id, h] : handlers_)
          for (std::size_t i = 0; i < h.members.size(); ++i)
            if (h.members[i] == c->peer) calls.emplace_back(static_cast<int>(i), h.fn);
      }
    }
    cv_.notify_all();
    for (const auto& c : conns) drop(*c);
    listen_.reset();
    root_link_->close();
    for (auto& [local, fn] : calls) fn(local, why);
  } catch (...) {
    // Nothing more can be done without memory; waits still end at their deadlines.
  }
}

void BootstrapTransport::say_goodbye() {
  // Tells every peer this rank leaves, then waits (bounded) for each to acknowledge by closing
  // its end, so that no unread byte turns our close into a reset.
  listen_.reset();
  root_link_->close();
  std::vector<std::shared_ptr<BootstrapConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(conns_);
    for (int p = 0; p < nranks_; ++p) peers_[static_cast<std::size_t>(p)].send_conn.reset();
  }
  const Deadline deadline = Deadline::after(kGoodbyeLimit);
  std::vector<std::shared_ptr<BootstrapConnection>> waiting;
  for (const auto& c : conns) {
    if (c->closed.load() || c->peer < 0) continue;
    std::unique_lock<std::mutex> wl(c->write_mu, std::defer_lock);
    if (lock_until(wl, Deadline::after(milliseconds(100)), nullptr) && !c->write_broken) {
      FrameHeader h;
      h.magic = magic_;
      h.type = kGoodbye;
      h.tag = peers_[static_cast<std::size_t>(c->peer)].sent.load();
      std::size_t written = 0;
      if (write_frame(c->fd.get(), h, {}, deadline.earlier(Deadline::after(milliseconds(200))),
                      nullptr, &written))
        waiting.push_back(c);
    }
    ::shutdown(c->fd.get(), SHUT_WR);
  }
  while (!waiting.empty() && !deadline.expired()) {
    std::vector<pollfd> fds;
    fds.reserve(waiting.size());
    for (const auto& c : waiting) fds.push_back({c->fd.get(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), deadline.poll_ms(static_cast<int>(kPollSlice.count())));
    std::vector<std::shared_ptr<BootstrapConnection>> still;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      bool done = false;
      if (fds[i].revents != 0) {
        for (;;) {
          const ssize_t n = ::recv(fds[i].fd, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
          if (n > 0) continue;  // whatever the peer still sent: nobody will read it
          done = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
          break;
        }
      }
      if (!done) still.push_back(waiting[i]);
    }
    waiting.swap(still);
  }
  for (const auto& c : conns) drop(*c);
  if (auto line = refusals_.flush_final()) EFCCL_WARN(-1, *line);
  EFCCL_INFO(
      kLogInit, -1,
      "bootstrap rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) + ": closed" +
          (waiting.empty()
               ? ""
               : " (" + std::to_string(waiting.size()) + " peers did not acknowledge in time)"));
}

}  // namespace efccl::net
