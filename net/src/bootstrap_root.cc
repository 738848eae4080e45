#include "bootstrap_root.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/frame.h"
#include "efccl/net/printable.h"
#include "efccl/net/socket.h"
#include "root_server.h"

namespace efccl::net {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kStrangerTimeout{10000};      // an unauthenticated connection may idle
constexpr std::size_t kMaxStrangers = 128;           // unauthenticated connections kept at once
constexpr milliseconds kCountInterval{50};           // progress reports at most this often
constexpr std::chrono::seconds kFailedRootLife{30};  // answers late joiners after failing
constexpr std::chrono::seconds kFlushLimit{60};      // time to deliver the table
constexpr milliseconds kGoodbyeLimit{1000};          // a rank may take this long to hang up
constexpr milliseconds kAcceptPause{100};            // accept failed (e.g. no descriptors left)
// A pending root outlives its lifetime by this much, so that ranks whose init deadline is the
// same lifetime (counted from their API call, before they joined) report their own timeout.
constexpr milliseconds kExpiryGrace{2000};
constexpr std::size_t kReadBudget = std::size_t{1} << 20;  // per connection and step

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

StatusOr<std::shared_ptr<BootstrapRoot>> BootstrapRoot::launch(const Options& options) {
  auto root = std::make_shared<BootstrapRoot>(options);
  auto listener = listen_on(options.address, options.reuse_address, &root->address_);
  if (!listener) return listener.status();
  root->listen_ = std::move(*listener);
  root->name_ = "bootstrap root at " + root->address_.to_string();
  root->refusals_ = RefusalReport(root->name_);
  if (Status s = RootServer::instance().add(root); !s) return s;
  return root;
}

BootstrapRoot::BootstrapRoot(const Options& options)
    : options_(options),
      nranks_(options.expected_nranks),
      started_(Clock::now()),
      last_join_(started_),
      refusals_("bootstrap root") {}

void BootstrapRoot::abandon() {
  stop_.store(true);
  RootServer::instance().wake();
}

void BootstrapRoot::close() {
  if (auto line = refusals_.flush_final()) warn(*line);
  listen_.reset();
  conns_.clear();
}

void BootstrapRoot::warn(const std::string& message) const { EFCCL_WARN(-1, message); }

void BootstrapRoot::queue(Conn& c, uint32_t type, std::string_view payload) {
  c.out.push_back(
      std::make_shared<const std::string>(frame_bytes(options_.magic, type, 0, 0, payload)));
}

std::string BootstrapRoot::count_payload() const {
  std::string p;
  put_u32(p, static_cast<uint32_t>(members_.size()));
  put_u32(p, static_cast<uint32_t>(nranks_));
  return p;
}

void BootstrapRoot::fail(const std::string& why, Conn* also) {
  failed_ = why;
  failed_at_ = Clock::now();
  if (members_.empty() && also == nullptr)  // an id nobody used: nothing went wrong for anyone
    EFCCL_INFO(kLogInit, -1, name_ + ": ends: " + why);
  else
    warn(name_ + ": the rendezvous failed: " + why);
  for (auto& [rank, m] : members_) {
    queue(*m.conn, kRootError, why);
    m.conn->closing = true;
    m.conn->rank = -1;
  }
  if (also != nullptr) {
    queue(*also, kRootError, why);
    also->closing = true;
  }
  members_.clear();
}

void BootstrapRoot::refuse(Conn& c, const std::string& why) {
  if (auto line = refusals_.refused(c.from, why)) warn(*line);
  c.dead = true;
}

void BootstrapRoot::reject(Conn& c, const std::string& why) {
  if (auto line = refusals_.refused(c.from, why)) warn(*line);
  queue(c, kRootError, why);
  c.closing = true;
}

void BootstrapRoot::hello(Conn& c, const FrameHeader& h, const std::string& payload) {
  const uint32_t version = get_u32(payload, 0);
  const uint32_t claimed_nranks = get_u32(payload, 4);
  const uint32_t claimed_rank = get_u32(payload, 8);
  SocketAddress addr;
  std::memcpy(static_cast<void*>(&addr), payload.data() + 16, sizeof(addr));
  if (version != kProtocolVersion) {
    reject(c, "bootstrap protocol version " + std::to_string(version) +
                  " differs from the root's " + std::to_string(kProtocolVersion) +
                  " (mixed efccl builds?)");
    return;
  }
  const std::string claim =
      "rank " + std::to_string(claimed_rank) + " of " + std::to_string(claimed_nranks);
  if (claimed_nranks < 1 || claimed_nranks > static_cast<uint32_t>(Bootstrap::kMaxRanks) ||
      claimed_rank >= claimed_nranks || !addr.valid()) {
    reject(c, "malformed hello (" + claim + "; nranks must be 1.." +
                  std::to_string(Bootstrap::kMaxRanks) + ", the address IPv4 or IPv6)");
    return;
  }
  const int n = static_cast<int>(claimed_nranks);
  const int rank = static_cast<int>(claimed_rank);
  if (completed_) {
    queue(c, kRootError,
          "the rendezvous at " + address_.to_string() + " already completed without rank " +
              std::to_string(rank));
    c.closing = true;
    return;
  }
  if (!failed_.empty()) {
    queue(c, kRootError, failed_);
    c.closing = true;
    return;
  }
  if (options_.expected_nranks != 0) {
    // NCCL_COMM_ID: the magic is public; rank 0 told us the job. A hello that does not fit it
    // is a stranger's (or a misconfigured rank's): refused without disturbing the others.
    if (n != options_.expected_nranks) {
      reject(c, claim + " does not fit this rendezvous: rank 0 started it for " +
                    std::to_string(options_.expected_nranks) + " ranks");
      return;
    }
    if (rank == 0 && h.tag != options_.rank0_token) {
      reject(c, "claims rank 0, whose process runs this root (NCCL_COMM_ID), without its token");
      return;
    }
  } else if (nranks_ == 0) {
    nranks_ = n;
    nranks_from_ = rank;
  } else if (n != nranks_) {
    fail("rank " + std::to_string(rank) + " says nranks " + std::to_string(n) + ", rank " +
             std::to_string(nranks_from_) + " said " + std::to_string(nranks_),
         &c);
    return;
  }
  if (auto it = members_.find(rank); it != members_.end()) {
    fail("rank " + std::to_string(rank) + " joined twice (from " + it->second.conn->from + " and " +
             c.from + ")",
         &c);
    return;
  }
  members_.emplace(rank, Member{&c, addr, payload.substr(kRootHelloFixedBytes)});
  c.rank = rank;
  last_join_ = Clock::now();
  EFCCL_INFO(kLogInit, -1,
             name_ + ": rank " + std::to_string(rank) + " of " + std::to_string(n) +
                 " joined from " + c.from + " (" + std::to_string(members_.size()) + " joined)");
  queue(c, kRootCount, count_payload());
  count_dirty_ = true;
  if (static_cast<int>(members_.size()) == nranks_) complete();
}

void BootstrapRoot::complete() {
  std::string table;
  put_u32(table, static_cast<uint32_t>(nranks_));
  put_u32(table, 0);
  for (const auto& [rank, m] : members_) {  // every rank 0..nranks-1, in order
    table.append(reinterpret_cast<const char*>(&m.address), sizeof(SocketAddress));
    put_u32(table, static_cast<uint32_t>(m.info.size()));
    table += m.info;
  }
  auto frame =
      std::make_shared<const std::string>(frame_bytes(options_.magic, kRootTable, 0, 0, table));
  for (auto& [rank, m] : members_) {
    m.conn->out.push_back(frame);
    m.conn->closing = true;
  }
  members_.clear();  // the connections only deliver the table now
  completed_ = true;
  completed_at_ = Clock::now();
  listen_.reset();  // nobody else may join; strangers are refused by the kernel
  EFCCL_INFO(kLogInit, -1,
             name_ + ": all " + std::to_string(nranks_) + " ranks joined; sending the table");
}

void BootstrapRoot::forget(Conn& c, const std::string& why) {
  EFCCL_INFO(
      kLogInit, -1,
      name_ + ": rank " + std::to_string(c.rank) + " " + why + " before the rendezvous completed");
  members_.erase(c.rank);
  c.rank = -1;
  count_dirty_ = true;
  if (members_.empty() && options_.expected_nranks == 0) nranks_ = 0;
}

void BootstrapRoot::on_readable(Conn& c, std::vector<char>& buffer) {
  std::string why;
  const auto check = [&](const FrameHeader& h, std::string* reason) {
    if (c.rank >= 0 || c.closing) {
      *reason = "unexpected data after the hello";
      return false;
    }
    if (h.type != kRootHello || h.length < kRootHelloFixedBytes ||
        h.length > kRootHelloFixedBytes + Bootstrap::kMaxInfoBytes) {
      *reason = "not a bootstrap hello (type " + std::to_string(h.type) + ", " +
                std::to_string(h.length) + " bytes)";
      return false;
    }
    return true;
  };
  const auto on_frame = [&](const FrameHeader& h, std::string payload) {
    hello(c, h, payload);
    return true;
  };
  const FrameReader::Result rr =
      c.reader.read(c.fd.get(), buffer, kReadBudget, check, on_frame, &why);
  switch (rr) {
    case FrameReader::Result::kAgain:
    case FrameReader::Result::kStop:
      return;
    case FrameReader::Result::kBad:
      if (c.rank >= 0 && !completed_) forget(c, "sent " + why);
      if (c.draining || c.closing) {
        c.dead = true;  // a rank that finished or was refused: nothing to report
        return;
      }
      refuse(c, why);
      return;
    case FrameReader::Result::kEof:
    case FrameReader::Result::kError:
      if (c.rank >= 0 && !completed_)
        forget(c, rr == FrameReader::Result::kEof ? "closed its connection" : why);
      c.dead = true;
      return;
  }
}

void BootstrapRoot::on_writable(Conn& c) {
  while (!c.out.empty()) {
    const std::string& f = *c.out.front();
    const ssize_t n =
        ::send(c.fd.get(), f.data() + c.out_at, f.size() - c.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      if (c.rank >= 0 && !completed_)
        forget(c, "could not be written to (" + errno_text(errno) + ")");
      c.dead = true;
      return;
    }
    c.out_at += static_cast<std::size_t>(n);
    if (c.out_at == f.size()) {
      c.out.pop_front();
      c.out_at = 0;
    }
  }
  if (c.closing && !c.draining) {
    // Let the rank close first, so that no unread byte turns our close into a reset.
    ::shutdown(c.fd.get(), SHUT_WR);
    c.draining = true;
    c.since = Clock::now();
  }
}

void BootstrapRoot::add_poll_fds(std::vector<pollfd>* fds) const {
  const bool listening = listen_.valid() && Clock::now() >= listen_paused_until_;
  fds->push_back({listening ? listen_.get() : -1, POLLIN, 0});
  for (const auto& c : conns_)
    fds->push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
}

void BootstrapRoot::step(const pollfd* fds, std::size_t count, std::vector<char>& buffer,
                         Clock::time_point now) {
  // The entries follow add_poll_fds: the listener, then conns_ as they were (accept_all and
  // the handlers below only append to conns_ or mark connections dead).
  const std::size_t polled = std::min(count - 1, conns_.size());
  for (std::size_t i = 0; i < polled; ++i) {
    Conn& c = *conns_[i];
    const short ev = fds[i + 1].revents;
    if ((ev & POLLOUT) != 0) on_writable(c);
    if (!c.dead && (ev & (POLLIN | POLLHUP | POLLERR)) != 0) on_readable(c, buffer);
    if (!c.dead && c.closing && !c.draining && c.out.empty()) on_writable(c);
  }
  if (!stop_.load() && listen_.valid() && (fds[0].revents & POLLIN) != 0) accept_all(now);
  if (count_dirty_ && now - last_count_ >= kCountInterval) {
    for (auto& [rank, m] : members_) queue(*m.conn, kRootCount, count_payload());
    count_dirty_ = false;
    last_count_ = now;
  }
  for (auto& c : conns_)  // reports queued above: send what fits now
    if (!c->dead && !c->out.empty() && !c->draining) on_writable(*c);
  expire(now);
  if (auto line = refusals_.flush(now)) warn(*line);
  std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
}

void BootstrapRoot::accept_all(Clock::time_point now) {
  const Status s = accept_pending(listen_.get(), [&](Fd fd, const SocketAddress& from) {
    auto c = std::make_unique<Conn>(options_.magic);
    c->fd = std::move(fd);
    c->from = from.to_string();
    c->since = now;
    conns_.push_back(std::move(c));
  });
  if (!s) {
    warn(name_ + ": " + s.message());
    listen_paused_until_ = now + kAcceptPause;  // e.g. out of descriptors: no busy loop
  }
}

BootstrapRoot::Clock::time_point BootstrapRoot::expiry() const {
  return std::max(started_, last_join_) + options_.lifetime + kExpiryGrace;
}

void BootstrapRoot::expire(Clock::time_point now) {
  if (!completed_ && failed_.empty() && !stop_.load() && now >= expiry()) {
    expired_ = true;
    fail("the rendezvous expired: only " + std::to_string(members_.size()) + " of " +
             (nranks_ > 0 ? std::to_string(nranks_) : std::string("?")) +
             " ranks joined, and none in the last " + ms_text(options_.lifetime) +
             " (EFCCL_INIT_TIMEOUT_MS)",
         nullptr);
    listen_.reset();
  }
  // Connections that never said hello, or never acknowledged the end; the newest strangers
  // are kept (a rank connects and says hello at once), the oldest beyond the cap dropped.
  std::size_t strangers = 0;
  for (auto it = conns_.rbegin(); it != conns_.rend(); ++it) {
    Conn& c = **it;
    if (c.dead) continue;
    if (c.draining) {
      if (now - c.since > kGoodbyeLimit) c.dead = true;
      continue;
    }
    if (c.rank >= 0 || c.closing) continue;
    if (now - c.since > kStrangerTimeout)
      refuse(c, "no hello within " + ms_text(kStrangerTimeout));
    else if (++strangers > kMaxStrangers)
      refuse(c, "too many connections without a hello");
  }
}

BootstrapRoot::Clock::time_point BootstrapRoot::next_timer(Clock::time_point now) const {
  Clock::time_point next = Clock::time_point::max();
  if (count_dirty_) next = std::max(now, last_count_ + kCountInterval);
  if (!completed_ && failed_.empty()) next = std::min(next, expiry());
  if (listen_.valid() && listen_paused_until_ > now) next = std::min(next, listen_paused_until_);
  return next;
}

bool BootstrapRoot::finished(Clock::time_point now) const {
  if (crashed_) return true;
  if (stop_.load() && !completed_) return true;
  if (completed_) return conns_.empty() || now - completed_at_ > kFlushLimit;
  if (!failed_.empty()) {
    if (expired_) return conns_.empty() || now - failed_at_ > 2 * kGoodbyeLimit;
    return now - failed_at_ > kFailedRootLife;
  }
  return false;
}

void BootstrapRoot::crash(const std::string& what) noexcept {
  crashed_ = true;
  try {
    const std::string why = name_ + " failed: " + what;
    warn(why);
    const std::string frame = frame_bytes(options_.magic, kRootError, 0, 0, why);
    for (auto& [rank, m] : members_)
      (void)::send(m.conn->fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } catch (...) {
    // Out of memory even for the message: the ranks see the connection close.
  }
}

}  // namespace efccl::net
