// The MPI shim's transport: this rank's TCP connection to every other rank of the job (found
// through efccl-mprun's rendezvous server), carrying tagged messages. A message is tagged with
// its communicator, the collective's sequence number on it, the MPI call and two arguments
// that all ranks must agree on (root, datatype, op); one that arrives before it is asked for
// waits in a per-peer stash, and a tag that disagrees is reported as the usage error it is.
//
// Meeting the peers: lower ranks are dialled; connections from higher ranks are accepted all at
// once (poll), each authenticated by a handshake (magic, job key, rank) read within a short
// deadline of its own. A connection that is wrong or silent is dropped (reported at most once a
// second) and never blocks the others or ends the job; only the job's own deadline does.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/fd.h"
#include "efccl/net/socket_address.h"

namespace efccl::mpishim {

/// The MPI call a message belongs to.
enum class CallKind : uint32_t {
  kBarrier = 1,
  kBcast,
  kGather,
  kAllgather,
  kAllreduce,
  kCommSplit,
  kFinalize,
};
const char* call_name(CallKind kind);

/// What identifies a message (besides its sender).
struct Tag {
  uint64_t comm_id = 0;
  uint64_t seq = 0;  ///< the collective's number on its communicator
  CallKind kind = CallKind::kBarrier;
  int32_t arg0 = 0;  ///< e.g. the root
  int32_t arg1 = 0;  ///< e.g. the datatype or op

  bool same_call(const Tag& other) const { return comm_id == other.comm_id && seq == other.seq; }
};

class PeerMesh {
 public:
  /// How long one accepted connection may take to identify itself.
  static constexpr std::chrono::milliseconds kHandshakeTimeout{5000};

  /// Registers rank `rank` of `size` with the rendezvous server at `server` for job `job`, then
  /// connects to every peer (lower ranks dial, higher ranks are accepted).
  static StatusOr<std::unique_ptr<PeerMesh>> connect(const std::string& job, int rank, int size,
                                                     const net::SocketAddress& server,
                                                     net::Deadline deadline);

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Sends `bytes` bytes to world rank `peer`.
  Status send(int peer, const Tag& tag, const void* data, size_t bytes, net::Deadline deadline);
  /// The payload of message `tag` from world rank `peer`.
  StatusOr<std::vector<char>> recv(int peer, const Tag& tag, net::Deadline deadline);
  /// Asks efccl-mprun to stop the job (MPI_Abort); best effort.
  void send_abort(int errorcode);

 private:
  struct Message {
    Tag tag;
    std::vector<char> payload;
  };

  int rank_ = 0;
  int size_ = 1;
  /// Accepts the `count` higher ranks' connections on `listener` (see above).
  Status accept_peers(const std::string& job, int listener, int count, net::Deadline deadline);

  net::Fd server_;                          ///< kept open for ABORT
  std::vector<net::Fd> peers_;              ///< by world rank; none for this rank
  std::vector<std::deque<Message>> stash_;  ///< by world rank: arrived, not yet asked for
  size_t stashed_bytes_ = 0;
};

}  // namespace efccl::mpishim
