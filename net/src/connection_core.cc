#include "connection_core.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "efccl/common/log.h"

namespace efccl::net {
namespace {

using Clock = std::chrono::steady_clock;

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

const char* failure_text(NetConnection::Failure f) {
  switch (f) {
    case NetConnection::Failure::kNone:
      return "none";
    case NetConnection::Failure::kPeerClosed:
      return "closed by the peer";
    case NetConnection::Failure::kRemote:
      return "remote failure";
    case NetConnection::Failure::kSystem:
      return "local failure";
  }
  return "?";
}

}  // namespace

SlotCompletion::SlotCompletion(uint32_t nslots)
    : nslots_(nslots),
      stripes_(new std::atomic<uint32_t>[nslots]),
      done_(new std::atomic<uint64_t>[nslots]) {
  for (uint32_t i = 0; i < nslots; ++i) {
    stripes_[i].store(0);
    done_[i].store(0);
  }
}

void SlotCompletion::publish_in_order(uint64_t* publish) {
  uint64_t p = next_.load(std::memory_order_acquire);
  while (done_[p % nslots_].load(std::memory_order_acquire) == p + 1) {
    if (next_.compare_exchange_weak(p, p + 1, std::memory_order_acq_rel)) ++p;
  }
  SlotRegion::raise(publish, next_.load(std::memory_order_acquire));
}

ConnectionCore::ConnectionCore(Role r, const SlotRegion& reg, std::string n, uint32_t socks,
                               uint64_t i, const Token& t)
    : role(r),
      region(reg),
      nsocks(socks),
      id(i),
      token(t),
      name(std::move(n)),
      completion(reg.layout.nslots),
      slot_total(new std::atomic<uint64_t>[reg.layout.nslots]),
      taken_(socks, false) {
  for (uint32_t s = 0; s < reg.layout.nslots; ++s) slot_total[s].store(0);
}

void ConnectionCore::set_peer(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer_.empty()) peer_ = address;
}

std::string ConnectionCore::who() const {
  std::lock_guard<std::mutex> lock(mu_);
  return name + (peer_.empty() ? "" : " (peer " + peer_ + ")");
}

NetConnection::State ConnectionCore::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

NetConnection::Failure ConnectionCore::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

Status ConnectionCore::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_ == Failure::kNone) return Status::ok();
  return Status::error(why_);
}

bool ConnectionCore::take_socket(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= nsocks || taken_[index] || state_ != State::kConnecting || closing.load())
    return false;
  taken_[index] = true;
  ++attached_;
  if (++taken_count_ == nsocks) {
    state_ = State::kOpen;
    cv_.notify_all();
  }
  return true;
}

void ConnectionCore::open() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kConnecting) state_ = State::kOpen;
  cv_.notify_all();
}

void ConnectionCore::fail(Failure failure, const std::string& why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failure_ != Failure::kNone || state_ == State::kClosed) return;
  failure_ = failure;
  why_ = "network connection " + name + (peer_.empty() ? "" : " (peer " + peer_ + ")") + ": " + why;
  state_ = failure == Failure::kPeerClosed ? State::kClosed : State::kFailed;
  ended.store(true, std::memory_order_release);
  cv_.notify_all();
  if (failure == Failure::kPeerClosed)
    EFCCL_INFO(kLogNet, -1, why_);
  else
    EFCCL_WARN(-1, why_ + " [" + failure_text(failure) + "]");
  report(lock);
}

void ConnectionCore::goodbye_from_peer() {
  std::unique_lock<std::mutex> lock(mu_);
  if (++goodbyes_ < nsocks || closing.load()) return;  // closing here: no news
  lock.unlock();
  fail(Failure::kPeerClosed, "the peer closed the connection");
}

void ConnectionCore::closed_here() {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_ == Failure::kNone) state_ = State::kClosed;
  ended.store(true, std::memory_order_release);
  cv_.notify_all();
}

void ConnectionCore::set_handler(NetConnection::Handler handler) {
  std::unique_lock<std::mutex> lock(mu_);
  handler_ = std::move(handler);
  reported_ = false;
  report(lock);
}

void ConnectionCore::report(std::unique_lock<std::mutex>& lock) {
  if (reported_ || !handler_ || failure_ == Failure::kNone) return;
  reported_ = true;
  NetConnection::Handler h = handler_;
  const Failure f = failure_;
  const std::string why = why_;
  lock.unlock();
  h(f, why);
  lock.lock();
}

bool ConnectionCore::reserve_task() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing.load() || ended.load()) return false;
  ++attached_;
  return true;
}

void ConnectionCore::begin_close(std::chrono::milliseconds linger) {
  std::lock_guard<std::mutex> lock(mu_);
  linger_until_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            (Clock::now() + linger).time_since_epoch())
                            .count(),
                        std::memory_order_release);
  closing.store(true, std::memory_order_release);
}

void ConnectionCore::task_detached() {
  std::lock_guard<std::mutex> lock(mu_);
  --attached_;
  cv_.notify_all();
}

bool ConnectionCore::wait_detached(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (attached_ > 0) {
    if (deadline.expired()) return false;
    cv_.wait_until(lock, std::min(deadline.when(), Clock::now() + std::chrono::milliseconds(10)));
  }
  return true;
}

Status ConnectionCore::wait_open(Deadline deadline, const std::atomic<bool>* abort) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (state_ == State::kOpen) return Status::ok();
    if (failure_ != Failure::kNone) return Status::error(why_);
    if (state_ == State::kClosed)
      return Status::error("network connection " + name + " was closed before it opened");
    const std::string waiting = "network connection " + name + ": " + std::to_string(taken_count_) +
                                " of " + std::to_string(nsocks) + " sockets of the sender arrived";
    if (aborted(abort)) return Status::error("aborted: " + waiting);
    if (deadline.expired())
      return Status::error(waiting + " within " + std::to_string(deadline.budget().count()) +
                           " ms");
    cv_.wait_until(lock, std::min(deadline.when(), Clock::now() + std::chrono::milliseconds(10)));
  }
}

Status ConnectionCore::wait_for(NetConnection::Counter counter, uint64_t value, Deadline deadline,
                                const std::atomic<bool>* abort) {
  const bool tail = counter == NetConnection::Counter::kTail;
  const auto now_at = [&] { return tail ? region.load_tail() : region.load_head(); };
  int idle = 0;
  for (;;) {
    if (now_at() >= value) return Status::ok();
    if (ended.load(std::memory_order_acquire)) {
      if (now_at() >= value) return Status::ok();  // arrived before the end
      Status s = status();
      if (s) s = Status::error("network connection " + name + " is closed");
      return Status::error(s.message() + " (waiting for " + (tail ? "tail" : "head") + " " +
                           std::to_string(value) + ", at " + std::to_string(now_at()) + ")");
    }
    if (aborted(abort))
      return Status::error("aborted waiting for " + std::string(tail ? "tail" : "head") + " " +
                           std::to_string(value) + " of network connection " + name);
    if (deadline.expired())
      return Status::error("timed out after " + std::to_string(deadline.budget().count()) +
                           " ms waiting for " + (tail ? "tail" : "head") + " " +
                           std::to_string(value) + " of network connection " + who() + " (at " +
                           std::to_string(now_at()) + ")");
    if (++idle < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(idle < 256 ? 5 : 50));
  }
}

}  // namespace efccl::net
