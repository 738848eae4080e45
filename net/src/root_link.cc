#include "root_link.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "efccl/net/bootstrap.h"
#include "efccl/net/printable.h"
#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

constexpr std::chrono::milliseconds kMaxBackoff{200};
constexpr std::size_t kReadBudget = std::size_t{1} << 30;

}  // namespace

RootLink::RootLink(uint64_t magic, int nranks, const SocketAddress& root, Deadline deadline,
                   std::string hello)
    : nranks_(nranks),
      root_(root),
      root_name_(root.to_string()),
      deadline_(deadline),
      hello_(std::move(hello)),
      reader_(magic) {}

pollfd RootLink::poll_entry() const {
  short events = 0;
  if (state_ == State::kConnecting) events = POLLOUT;
  if (state_ == State::kActive)
    events = static_cast<short>(POLLIN | (hello_sent_ < hello_.size() ? POLLOUT : 0));
  return {events != 0 ? fd_.get() : -1, events, 0};
}

int RootLink::poll_timeout_ms(int cap_ms) const {
  if (state_ != State::kWait) return cap_ms;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(retry_at_ - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, cap_ms));
}

void RootLink::close() {
  fd_.reset();
  state_ = State::kDone;
}

void RootLink::retry(const std::string& error, Update* update) {
  fd_.reset();
  state_ = State::kWait;
  retry_at_ = Clock::now() + backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  last_error_ = error;
  update->connect_error = error;
}

void RootLink::finish(std::string why, Update* update) {
  close();
  update->failed = std::move(why);
}

void RootLink::step(short revents, std::vector<char>& buffer, Update* update) {
  switch (state_) {
    case State::kDone:
      return;
    case State::kWait: {
      if (Clock::now() < retry_at_) return;
      if (deadline_.expired()) {
        finish("could not reach the rendezvous root at " + root_name_ + " within " +
                   std::to_string(deadline_.budget().count()) + " ms (" + last_error_ + ")",
               update);
        return;
      }
      int error = 0;
      fd_ = start_connect(root_, &error);
      if (error != 0) {
        retry(errno_text(error), update);
        return;
      }
      state_ = State::kConnecting;
      return;
    }
    case State::kConnecting: {
      if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) {
        if (deadline_.expired()) retry("connection attempt timed out", update);
        return;
      }
      if (const int error = socket_error(fd_.get()); error != 0) {
        retry(errno_text(error), update);
        return;
      }
      set_nodelay(fd_.get());
      state_ = State::kActive;
      update->reached = true;
      [[fallthrough]];
    }
    case State::kActive:
      exchange(revents, buffer, update);
      return;
  }
}

void RootLink::exchange(short revents, std::vector<char>& buffer, Update* update) {
  while (hello_sent_ < hello_.size()) {
    const ssize_t n = ::send(fd_.get(), hello_.data() + hello_sent_, hello_.size() - hello_sent_,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // full (retried on POLLOUT) or broken (the read below reports it)
    hello_sent_ += static_cast<std::size_t>(n);
  }
  if ((revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
  const uint64_t table_limit =
      8 + static_cast<uint64_t>(nranks_) * (sizeof(SocketAddress) + 4 + Bootstrap::kMaxInfoBytes);
  std::string why;
  const auto check = [&](const FrameHeader& h, std::string* reason) {
    const bool ok = (h.type == kRootCount && h.length == 8) ||
                    (h.type == kRootError && h.length <= Bootstrap::kMaxInfoBytes) ||
                    (h.type == kRootTable && h.length <= table_limit);
    if (!ok)
      *reason = "unexpected message type " + std::to_string(h.type) + " of " +
                std::to_string(h.length) + " bytes";
    return ok;
  };
  const auto on_frame = [&](const FrameHeader& h, std::string payload) {
    if (h.type == kRootCount) {
      update->joined = static_cast<int>(get_u32(payload, 0));
      return true;
    }
    if (h.type == kRootError) {
      finish(printable(payload, Bootstrap::kMaxInfoBytes), update);
      return false;
    }
    if (!learn_table(payload, update)) {
      finish("the rendezvous root at " + root_name_ + " sent a malformed table", update);
      return false;
    }
    close();
    return false;
  };
  const FrameReader::Result rr =
      reader_.read(fd_.get(), buffer, kReadBudget, check, on_frame, &why);
  if (rr == FrameReader::Result::kEof)
    finish("the rendezvous root at " + root_name_ +
               " closed the connection before all ranks joined (did its process exit?)",
           update);
  else if (rr == FrameReader::Result::kError)
    finish("lost the connection to the rendezvous root at " + root_name_ + ": " + why, update);
  else if (rr == FrameReader::Result::kBad)
    finish("the rendezvous root at " + root_name_ + " sent garbage: " + why, update);
}

bool RootLink::learn_table(std::string_view t, Update* update) const {
  if (t.size() < 8 || get_u32(t, 0) != static_cast<uint32_t>(nranks_)) return false;
  std::vector<SocketAddress> addresses(static_cast<std::size_t>(nranks_));
  std::vector<std::string> infos(static_cast<std::size_t>(nranks_));
  std::size_t at = 8;
  for (std::size_t r = 0; r < addresses.size(); ++r) {
    if (t.size() - at < sizeof(SocketAddress) + 4) return false;
    std::memcpy(static_cast<void*>(&addresses[r]), t.data() + at, sizeof(SocketAddress));
    if (!addresses[r].valid()) return false;
    const uint32_t len = get_u32(t, at + sizeof(SocketAddress));
    at += sizeof(SocketAddress) + 4;
    if (len > Bootstrap::kMaxInfoBytes || t.size() - at < len) return false;
    infos[r] = std::string(t.substr(at, len));
    at += len;
  }
  if (at != t.size()) return false;
  update->addresses = std::move(addresses);
  update->infos = std::move(infos);
  update->table = true;
  return true;
}

}  // namespace efccl::net
