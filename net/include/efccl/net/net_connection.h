// One end of a network connection: a one-way channel of fixed-size slots from a sender rank on
// one host to a receiver rank on another, carried by the proxy (proxy.h) over one or more TCP
// sockets. The end's memory is a SlotRegion (slot_region.h); the GPU (or, in tests, a thread
// playing it) keeps the FIFO protocol it keeps with a CUDA IPC connection:
//
//   sender GPU:   wait head > pos - nslots; write slot pos % nslots; sizes[pos % nslots] =
//                 bytes (sized layouts); release-store tail = pos + 1
//   sender proxy: acquire tail; write the slot's bytes to the socket(s) (TCP holds them back
//                 while the receiver is full); release-store head once they left the slot
//   recv proxy:   read the slot's bytes into slot pos % nslots once the GPU freed it (head >
//                 pos - nslots); release-store tail = pos + 1
//   recv GPU:     acquire tail > pos; read the slot; store head = pos + 1
//
// A connection ends by close() (a goodbye on every socket, after the sender's posted slots have
// left), by the peer's close (kPeerClosed), or by a failure: the peer's process died or its
// host vanished (an end of stream without goodbye, a reset, TCP_USER_TIMEOUT or keepalive:
// kRemote, which the runtime reports as ncclRemoteError), a peer that broke the protocol
// (kRemote), or a local failure (a socket error, a counter this side's GPU wrote wrong, the
// proxy stopped: kSystem, ncclSystemError).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/slot_region.h"

namespace efccl::net {

class ConnectionCore;
class Proxy;

/// One end (sending or receiving) of a network connection. Made by Proxy::expect (receiving)
/// and Proxy::connect (sending). Thread-safe.
class NetConnection {
 public:
  enum class Role : uint8_t { kSend, kRecv };
  enum class State : uint8_t {
    kConnecting,  ///< receiving end: waiting for the sender's sockets
    kOpen,        ///< every socket is up; the proxy moves slots
    kClosed,      ///< closed by this side or by the peer (failure() says which)
    kFailed,      ///< failure() and status() say why
  };
  enum class Failure : uint8_t {
    kNone,
    kPeerClosed,  ///< the peer closed its end
    kRemote,      ///< the peer died, its host or the link vanished, or it broke the protocol
    kSystem,      ///< a local failure (socket error, bad counter from this side, proxy stopped)
  };
  enum class Counter : uint8_t { kTail, kHead };
  /// Called once, on a proxy thread, when the connection fails or the peer closes it. Must not
  /// block, nor close or destroy the connection.
  using Handler = std::function<void(Failure failure, const std::string& why)>;

  Role role() const;
  /// This end's memory (valid until close() returned).
  const SlotRegion& region() const;
  /// "send to rank 3 at 10.0.0.2:4242" (the caller's name and the peer's address).
  const std::string& name() const;
  /// Sockets carrying the connection.
  int sockets() const;
  State state() const;
  Failure failure() const;
  /// OK while connecting or open, and after this side's close(); otherwise why it ended.
  Status status() const;
  /// Payload bytes moved so far (sent or received).
  uint64_t bytes_moved() const;

  /// Blocks until every socket is up (the receiving end waits for its sender), the connection
  /// fails, `deadline` passes or `*abort` (may be null) becomes true.
  Status wait_open(Deadline deadline, const std::atomic<bool>* abort = nullptr);
  /// Blocks until `counter` of the region reaches `value` (the CPU playing the GPU, and tests),
  /// the connection ends first, `deadline` passes or `*abort` becomes true.
  Status wait_for(Counter counter, uint64_t value, Deadline deadline,
                  const std::atomic<bool>* abort = nullptr);
  /// Sets the handler; a connection that ended before is reported at once (from this call).
  void set_failure_handler(Handler handler);

  /// Ends this side: the sender's slots posted so far are sent first (while the receiver has
  /// room), then every socket says goodbye; at most `linger` for both, then the sockets close
  /// regardless. The region is never touched once it returns. Idempotent; the destructor calls
  /// it. Called on a proxy thread (a handler), it only marks the connection.
  void close(std::chrono::milliseconds linger = std::chrono::milliseconds(1000));

  ~NetConnection();
  NetConnection(const NetConnection&) = delete;
  NetConnection& operator=(const NetConnection&) = delete;

  /// Made by the proxy only.
  NetConnection(std::shared_ptr<Proxy> proxy, std::shared_ptr<ConnectionCore> core);

 private:
  std::shared_ptr<Proxy> proxy_;
  std::shared_ptr<ConnectionCore> core_;
};

}  // namespace efccl::net
