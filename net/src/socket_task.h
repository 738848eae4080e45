// One socket of a network connection, as the proxy thread that serves it drives it: each step
// moves what can move without blocking.
//
// Sending end, socket i: for slot k = 0, 1, ... in order, once the GPU posted it (tail > k),
// writes stripe i of the slot if the slot has one, as far as the socket takes it; the slot's
// head is published once every socket is done with it (its stripe left, or it had none:
// SlotCompletion), so that no socket reads a slot's size after the GPU reused the slot.
// Receiving end, socket i: reads stripe headers, checks each against the layout and the stripe
// plan, and reads the stripe's bytes straight into the slot once the GPU has freed it (head >
// k - nslots); until then the bytes wait in the socket and TCP's flow control stops the sender
// when the buffers are full, so the receiver's head needs no message of its own. A slot's tail
// is published once all its stripes arrived. Every socket ends with a goodbye header; an end of
// stream without one, a reset or a timeout is the peer's failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "connection_core.h"
#include "efccl/net/fd.h"
#include "proxy_wire.h"

namespace efccl::net {

class SocketTask {
 public:
  using Clock = std::chrono::steady_clock;

  /// What a step did.
  struct Step {
    bool progressed = false;    ///< bytes moved or a header was handled
    bool counter_wait = false;  ///< waits for a GPU counter (tail or head), not for the socket
    bool finished = false;      ///< the task is over: remove it (its fd closes with it)
  };

  /// Socket `index` of `core`, whose task the caller reserved (take_socket, reserve_task).
  SocketTask(std::shared_ptr<ConnectionCore> core, uint32_t index, Fd fd);
  /// Closes the socket and detaches from the connection.
  ~SocketTask();
  SocketTask(const SocketTask&) = delete;
  SocketTask& operator=(const SocketTask&) = delete;

  /// The descriptor to poll: -1 (none) while a stripe waits for its slot, whose bytes would
  /// keep the socket readable.
  int poll_fd() const;
  /// poll(2) events to wait for.
  short events() const;
  /// Moves what can move; `revents`: what the latest poll reported for fd().
  Step step(short revents);
  /// The task is dropped before its connection ended (the proxy stops): the connection fails.
  void abandon(const std::string& why) { fail(false, why); }

 private:
  static constexpr std::size_t kStepBudget = std::size_t{4} << 20;  ///< bytes per direction
  enum class Out : uint8_t { kNone, kData, kGoodbye };

  bool is_send() const { return core_->role == NetConnection::Role::kSend; }
  bool read_some(Step& step);
  bool on_header(Step& step);
  /// Receiving: whether the current stripe's slot is free (in_slot_ready_); false when the
  /// connection failed.
  bool claim_slot(Step& step);
  void finish_in_stripe();
  bool write_some(Step& step);
  /// Sets up the next outgoing header (and payload); false when there is none now.
  bool next_out(Step& step);
  bool next_data_stripe(Step& step);
  void finish_out();
  /// Fails the connection (`remote`: kRemote, else kSystem) unless this side is closing.
  void fail(bool remote, const std::string& why);
  void fail_errno(const char* call, int error);
  bool lingered() const;

  std::shared_ptr<ConnectionCore> core_;
  const uint32_t index_;
  Fd fd_;
  const SlotRegion& region_;

  // Incoming.
  StripeHeader in_header_{};
  std::size_t in_header_got_ = 0;
  char* in_to_ = nullptr;  ///< where the current stripe's bytes go (null: a header is next)
  uint64_t in_left_ = 0;
  uint64_t in_seq_ = 0;
  uint64_t in_next_seq_ = 0;  ///< receiving: the lowest slot number the next stripe may carry
  uint32_t in_count_ = 0;
  uint32_t in_length_ = 0;
  uint32_t in_total_ = 0;
  bool peer_goodbye_ = false;
  bool in_waits_for_slot_ = false;  ///< a stripe's header arrived; its slot is not free yet
  bool in_slot_ready_ = false;      ///< the current stripe's slot is free and claimed

  // Outgoing.
  Out out_ = Out::kNone;
  StripeHeader out_header_{};
  const char* out_payload_ = nullptr;
  uint64_t out_length_ = 0;  ///< header + payload
  uint64_t out_done_ = 0;
  uint64_t send_next_ = 0;   ///< sending: the next slot this socket considers
  bool want_write_ = false;  ///< a write would block: wait for POLLOUT
  bool goodbye_sent_ = false;
};

}  // namespace efccl::net
