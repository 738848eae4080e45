// The state one network connection's end shares between its NetConnection handle and the proxy
// threads that serve its sockets: identity, the data path's counters, and the life cycle.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "efccl/net/net_connection.h"
#include "efccl/net/slot_region.h"
#include "proxy_wire.h"

namespace efccl::net {

/// Slots completed by several sockets (each carries some of a slot's stripes), published in
/// order: a counter rises past slot k only once slots 0..k are all complete.
class SlotCompletion {
 public:
  explicit SlotCompletion(uint32_t nslots);
  /// One of the `count` stripes of slot `seq` is done. The thread that completes the slot calls
  /// `on_slot_done` (before publishing), then raises `*publish` past every slot complete in
  /// order. Returns whether this stripe completed the slot.
  template <typename OnSlotDone>
  bool stripe_done(uint64_t seq, uint32_t count, uint64_t* publish, OnSlotDone on_slot_done) {
    const uint32_t i = static_cast<uint32_t>(seq % nslots_);
    if (stripes_[i].fetch_add(1, std::memory_order_acq_rel) + 1 < count) return false;
    stripes_[i].store(0, std::memory_order_relaxed);  // nobody touches slot i until it is reused
    on_slot_done();
    done_[i].store(seq + 1, std::memory_order_release);
    publish_in_order(publish);
    return true;
  }
  /// Slots complete in order so far.
  uint64_t published() const { return next_.load(std::memory_order_acquire); }

 private:
  void publish_in_order(uint64_t* publish);

  const uint32_t nslots_;
  std::unique_ptr<std::atomic<uint32_t>[]> stripes_;  ///< per slot: stripes done
  std::unique_ptr<std::atomic<uint64_t>[]> done_;     ///< per slot: seq + 1 once complete
  std::atomic<uint64_t> next_{0};
};

class ConnectionCore {
 public:
  using Role = NetConnection::Role;
  using State = NetConnection::State;
  using Failure = NetConnection::Failure;

  ConnectionCore(Role role, const SlotRegion& region, std::string name, uint32_t nsocks,
                 uint64_t id, const Token& token);

  const Role role;
  const SlotRegion region;
  const uint32_t nsocks;
  const uint64_t id;  ///< receiving end: its number at this proxy
  const Token token;  ///< receiving end: what the sender's hellos must carry

  /// The caller's name for this end, e.g. "send to rank 3".
  const std::string name;
  /// The peer's address, once known (a receiving end learns it from the first socket).
  void set_peer(const std::string& address);
  /// "send to rank 3 (peer 10.0.0.2:4242)": for messages.
  std::string who() const;

  // ---- data path (proxy threads) ----
  /// Sending end: slots whose stripes have all left (publishes region.head). Receiving end:
  /// slots whose stripes have all arrived (publishes region.tail).
  SlotCompletion completion;
  /// Receiving end, per slot: the slot's total + 1 as its first stripe announced it (0: none).
  std::unique_ptr<std::atomic<uint64_t>[]> slot_total;
  std::atomic<uint64_t> bytes{0};

  // ---- life cycle ----
  /// close() was called: tasks finish their work, say goodbye and leave.
  std::atomic<bool> closing{false};
  /// Ended (failed, closed by the peer, or the linger passed): tasks leave at once.
  std::atomic<bool> ended{false};
  /// close(): when the tasks stop trying to finish their work (steady clock, nanoseconds).
  std::atomic<int64_t> linger_until_ns{0};

  State state() const;
  Failure failure() const;
  Status status() const;
  /// Receiving end: takes socket `index` and reserves its task (false: out of range, taken, or
  /// the connection is closing). Opens the connection once every socket is taken.
  bool take_socket(uint32_t index);
  /// Sending end: reserves a task for a socket (false: closing or ended).
  bool reserve_task();
  /// close(): tasks finish their work and say goodbye until `linger` from now; no task is
  /// reserved any more.
  void begin_close(std::chrono::milliseconds linger);
  /// Sending end: every socket connected.
  void open();
  /// Ends the connection with `failure` (the first call wins; later ones are ignored).
  void fail(Failure failure, const std::string& why);
  /// One socket's goodbye arrived; the connection is closed by the peer once all did.
  void goodbye_from_peer();
  /// This side's close() has finished: kClosed unless it ended otherwise before.
  void closed_here();
  void set_handler(NetConnection::Handler handler);

  /// A task reserved by take_socket or reserve_task left its proxy thread (after its last touch
  /// of the region), or was never started.
  void task_detached();
  /// Blocks until no task is attached or `deadline` passes; returns whether none is.
  bool wait_detached(Deadline deadline);

  Status wait_open(Deadline deadline, const std::atomic<bool>* abort);
  Status wait_for(NetConnection::Counter counter, uint64_t value, Deadline deadline,
                  const std::atomic<bool>* abort);

 private:
  /// Calls the handler (outside mu_) if the connection ended and it was not called yet.
  void report(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string peer_;
  State state_ = State::kConnecting;
  Failure failure_ = Failure::kNone;
  std::string why_;
  std::vector<bool> taken_;
  uint32_t taken_count_ = 0;
  uint32_t goodbyes_ = 0;
  int attached_ = 0;  ///< tasks reserved and not yet detached
  NetConnection::Handler handler_;
  bool reported_ = false;
};

}  // namespace efccl::net
