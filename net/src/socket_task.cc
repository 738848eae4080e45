#include "socket_task.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

/// Errors that mean the peer or the path to it is gone (kRemote), not this host's trouble.
bool remote_errno(int e) {
  return e == ECONNRESET || e == EPIPE || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == ECONNABORTED || e == EHOSTDOWN || e == ENETDOWN || e == ECONNREFUSED;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SocketTask::SocketTask(std::shared_ptr<ConnectionCore> core, uint32_t index, Fd fd)
    : core_(std::move(core)), index_(index), fd_(std::move(fd)), region_(core_->region) {}

SocketTask::~SocketTask() {
  fd_.reset();
  core_->task_detached();
}

int SocketTask::poll_fd() const { return in_waits_for_slot_ ? -1 : fd_.get(); }

short SocketTask::events() const {
  return static_cast<short>(POLLIN | (want_write_ ? POLLOUT : 0));
}

bool SocketTask::lingered() const {
  return core_->closing.load(std::memory_order_acquire) &&
         now_ns() >= core_->linger_until_ns.load(std::memory_order_acquire);
}

void SocketTask::fail(bool remote, const std::string& why) {
  if (core_->closing.load(std::memory_order_acquire)) return;  // this side is leaving anyway
  core_->fail(remote ? NetConnection::Failure::kRemote : NetConnection::Failure::kSystem, why);
}

void SocketTask::fail_errno(const char* call, int error) {
  fail(remote_errno(error),
       std::string(call) + " on socket " + std::to_string(index_) + ": " + errno_text(error));
}

SocketTask::Step SocketTask::step(short revents) {
  Step step;
  if (core_->ended.load(std::memory_order_acquire) || lingered()) {
    step.finished = true;
    return step;
  }
  if (((revents & (POLLIN | POLLERR | POLLHUP)) != 0 || in_waits_for_slot_) && !read_some(step)) {
    step.finished = true;
    return step;
  }
  if (revents & POLLOUT) want_write_ = false;
  if (!write_some(step)) step.finished = true;
  return step;
}

// ---- incoming ----

bool SocketTask::read_some(Step& step) {
  std::size_t budget = kStepBudget;
  char scratch[4096];
  while (budget > 0) {
    const bool draining = goodbye_sent_;  // after this side's goodbye: read to the end, discard
    void* to;
    std::size_t want;
    if (draining) {
      to = scratch;
      want = sizeof(scratch);
    } else if (in_to_ != nullptr) {
      if (!in_slot_ready_) {
        if (!claim_slot(step)) return false;
        if (!in_slot_ready_) return true;  // waits for the GPU to free the slot
        if (in_left_ == 0) {
          finish_in_stripe();
          continue;
        }
      }
      to = in_to_;
      want = static_cast<std::size_t>(std::min<uint64_t>(in_left_, budget));
    } else {
      to = reinterpret_cast<char*>(&in_header_) + in_header_got_;
      want = sizeof(in_header_) - in_header_got_;
    }
    const ssize_t n = ::recv(fd_.get(), to, want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (!draining) fail_errno("recv()", errno);
      return false;
    }
    if (n == 0) {
      if (!draining && !peer_goodbye_)
        fail(true, "the peer closed socket " + std::to_string(index_) +
                       " without a goodbye (did its process die?)");
      return false;
    }
    step.progressed = true;
    budget -= std::min<std::size_t>(budget, static_cast<std::size_t>(n));
    if (draining) continue;
    if (in_to_ != nullptr) {
      in_to_ += n;
      in_left_ -= static_cast<uint64_t>(n);
      if (in_left_ == 0) finish_in_stripe();
      continue;
    }
    in_header_got_ += static_cast<std::size_t>(n);
    if (in_header_got_ < sizeof(in_header_)) continue;
    in_header_got_ = 0;
    if (!on_header(step)) return false;
  }
  return true;
}

bool SocketTask::on_header(Step& step) {
  const StripeHeader h = in_header_;
  const std::string where = " on socket " + std::to_string(index_);
  switch (static_cast<StripeType>(h.type)) {
    case StripeType::kGoodbye:
      peer_goodbye_ = true;
      core_->goodbye_from_peer();
      return false;  // nothing follows on this socket
    case StripeType::kData:
      break;
    default:
      fail(true, "the peer sent a header of unknown type " + std::to_string(h.type) + where);
      return false;
  }
  const SlotLayout& layout = region_.layout;
  std::string bad;
  const StripePlan plan = StripePlan::of(h.total, core_->nsocks);
  if (is_send())
    bad = "data sent to the sending end";
  else if (h.seq < in_next_seq_)
    bad = "slot " + std::to_string(h.seq) + " after slot " + std::to_string(in_next_seq_ - 1);
  else if (h.total > layout.slot_bytes)
    bad = "a slot of " + std::to_string(h.total) + " bytes (slots hold " +
          std::to_string(layout.slot_bytes) + ")";
  else if (index_ >= plan.count || h.offset != plan.offset(index_) ||
           h.length != plan.length(index_, h.total))
    bad = "stripe [" + std::to_string(h.offset) + ", +" + std::to_string(h.length) + ") of a " +
          std::to_string(h.total) + "-byte slot, not this socket's";
  if (!bad.empty()) {
    fail(true, "the peer sent " + bad + where);
    return false;
  }
  in_seq_ = h.seq;
  in_next_seq_ = h.seq + 1;
  in_count_ = plan.count;
  in_length_ = h.length;
  in_total_ = h.total;
  in_left_ = h.length;
  in_to_ = region_.slot(h.seq) + h.offset;
  in_slot_ready_ = false;
  step.progressed = true;
  return true;
}

bool SocketTask::claim_slot(Step& step) {
  // Flow control: a stripe is taken only into a slot the GPU has freed (nothing of the slot,
  // its size or its stripe count is touched before); until then its bytes wait in the socket,
  // and TCP stops the sender once the buffers are full.
  const SlotLayout& layout = region_.layout;
  const uint64_t head = region_.load_head();
  const uint64_t arrived = core_->completion.published();
  if (head > arrived) {
    fail(false, "this side's GPU freed " + std::to_string(head) + " slots while only " +
                    std::to_string(arrived) + " had arrived (head beyond tail)");
    return false;
  }
  in_waits_for_slot_ = in_seq_ >= head + layout.nslots;
  if (in_waits_for_slot_) {
    step.counter_wait = true;
    return true;
  }
  // Every stripe of a slot must announce the same total.
  std::atomic<uint64_t>& total = core_->slot_total[in_seq_ % layout.nslots];
  uint64_t expected = 0;
  if (!total.compare_exchange_strong(expected, uint64_t{in_total_} + 1) &&
      expected != uint64_t{in_total_} + 1) {
    fail(true, "the peer sent stripes of slot " + std::to_string(in_seq_) +
                   " that disagree on its size (" + std::to_string(expected - 1) + " and " +
                   std::to_string(in_total_) + " bytes) on socket " + std::to_string(index_));
    return false;
  }
  in_slot_ready_ = true;
  return true;
}

void SocketTask::finish_in_stripe() {
  in_to_ = nullptr;
  in_slot_ready_ = false;
  core_->bytes.fetch_add(in_length_, std::memory_order_relaxed);
  const uint32_t slot = static_cast<uint32_t>(in_seq_ % region_.layout.nslots);
  const uint32_t total = in_total_;
  core_->completion.stripe_done(in_seq_, in_count_, region_.tail, [&] {
    if (region_.layout.sized)
      std::atomic_ref<uint32_t>(region_.sizes[slot]).store(total, std::memory_order_relaxed);
    core_->slot_total[slot].store(0, std::memory_order_relaxed);
  });
}

// ---- outgoing ----

bool SocketTask::write_some(Step& step) {
  std::size_t budget = kStepBudget;
  while (budget > 0) {
    if (out_ == Out::kNone && !next_out(step)) return true;
    if (want_write_) return true;
    const uint64_t header_left =
        out_done_ < sizeof(out_header_) ? sizeof(out_header_) - out_done_ : 0;
    iovec iov[2];
    int parts = 0;
    if (header_left > 0)
      iov[parts++] = {reinterpret_cast<char*>(&out_header_) + out_done_, header_left};
    const uint64_t payload_done = out_done_ - (sizeof(out_header_) - header_left);
    const uint64_t payload_left = out_length_ - sizeof(out_header_) - payload_done;
    if (payload_left > 0)
      iov[parts++] = {const_cast<char*>(out_payload_ + payload_done),
                      static_cast<std::size_t>(std::min<uint64_t>(payload_left, budget))};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(parts);
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        want_write_ = true;
        return true;
      }
      fail_errno("send()", errno);
      return false;
    }
    step.progressed = true;
    out_done_ += static_cast<uint64_t>(n);
    budget -= std::min<std::size_t>(budget, static_cast<std::size_t>(n));
    if (out_done_ == out_length_) {
      const bool was_goodbye = out_ == Out::kGoodbye;
      finish_out();
      if (was_goodbye) {
        // Said goodbye: read what the peer still sends until its end (or the linger passes).
        goodbye_sent_ = true;
        ::shutdown(fd_.get(), SHUT_WR);
        return true;
      }
    }
  }
  return true;
}

bool SocketTask::next_out(Step& step) {
  if (goodbye_sent_) return false;
  const bool closing = core_->closing.load(std::memory_order_acquire);
  if (is_send()) {
    if (next_data_stripe(step)) return true;
    if (core_->ended.load(std::memory_order_acquire)) return false;
  }
  if (!closing) return false;
  // A closing sender first sends what its GPU posted, while the receiver takes it (until the
  // linger passes).
  if (is_send() && send_next_ < region_.load_tail()) return false;
  out_header_ = StripeHeader{};
  out_header_.type = static_cast<uint32_t>(StripeType::kGoodbye);
  out_payload_ = nullptr;
  out_length_ = sizeof(out_header_);
  out_done_ = 0;
  out_ = Out::kGoodbye;
  return true;
}

bool SocketTask::next_data_stripe(Step& step) {
  const SlotLayout& layout = region_.layout;
  for (;;) {
    const uint64_t k = send_next_;
    const uint64_t tail = region_.load_tail();
    if (k >= tail) {
      step.counter_wait = true;
      return false;
    }
    const uint64_t freed = core_->completion.published();
    if (tail > freed + layout.nslots) {
      fail(false, "this side's GPU posted " + std::to_string(tail) + " slots while only " +
                      std::to_string(freed) + " of " + std::to_string(layout.nslots) +
                      " had been sent (tail beyond the free slots)");
      return false;
    }
    const uint64_t total = layout.sized
                               ? std::atomic_ref<uint32_t>(region_.sizes[k % layout.nslots])
                                     .load(std::memory_order_relaxed)
                               : layout.slot_bytes;
    if (total > layout.slot_bytes) {
      fail(false, "this side's GPU posted slot " + std::to_string(k) + " with " +
                      std::to_string(total) + " bytes; slots hold " +
                      std::to_string(layout.slot_bytes));
      return false;
    }
    const StripePlan plan = StripePlan::of(total, core_->nsocks);
    ++send_next_;
    if (index_ >= plan.count) {
      // The slot travels on other sockets. Every socket reports every slot, so that the slot
      // (and its size) is not reused before each socket has read its size.
      core_->completion.stripe_done(k, core_->nsocks, region_.head, [] {});
      step.progressed = true;
      continue;
    }
    out_header_ = StripeHeader{};
    out_header_.type = static_cast<uint32_t>(StripeType::kData);
    out_header_.seq = k;
    out_header_.total = static_cast<uint32_t>(total);
    out_header_.offset = static_cast<uint32_t>(plan.offset(index_));
    out_header_.length = static_cast<uint32_t>(plan.length(index_, total));
    out_payload_ = region_.slot(k) + out_header_.offset;
    out_length_ = sizeof(out_header_) + out_header_.length;
    out_done_ = 0;
    out_ = Out::kData;
    return true;
  }
}

void SocketTask::finish_out() {
  switch (out_) {
    case Out::kData:
      core_->bytes.fetch_add(out_header_.length, std::memory_order_relaxed);
      core_->completion.stripe_done(out_header_.seq, core_->nsocks, region_.head, [] {});
      break;
    case Out::kGoodbye:
    case Out::kNone:
      break;
  }
  out_ = Out::kNone;
}

}  // namespace efccl::net
