// Network connections for the connections of a program whose two ends run on different hosts
// (docs/net.md, "The runtime's side"): the kind that joins CUDA IPC connections (same host,
// other process) and peer access (same process).
//
// For every such connection end this process runs, NetworkLinks allocates the end's slot
// region in pinned host memory that the GPU maps (cudaHostAlloc, mapped and portable; or plain
// host memory without a GPU), laid out as net::SlotLayout, and joins it to the peer's end
// through the process's proxy (network_proxy()): receiving ends first expect their sender and
// send it the handle through the bootstrap (leader to leader, tagged by the executor's
// exchange and the connection), sending ends then receive their handle and connect, and every
// receiving end waits for its sender's sockets. The device side then points the connection's
// device handle at end(i).device: slots, sizes and counters at the layout's offsets. A
// connection that fails later calls the failure callback once (network_failure_code says what
// the API reports); a peer that closes its end (its executor went with its communicator) is
// logged (NET) and is not a failure. Every end is logged when connected (INFO NET).
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/deadline.h"
#include "efccl/net/net_connection.h"
#include "efccl/net/proxy.h"
#include "efccl/net/slot_region.h"

namespace efccl::runtime {

/// One end of a connection that crosses hosts, as the device side asks for it.
struct NetworkEndRequest {
  int32_t sender = 0;  ///< communicator ranks
  int32_t receiver = 0;
  int32_t channel = 0;
  bool send = false;  ///< this process runs the sender (else the receiver)
  net::SlotLayout layout;
};

/// The end, connected.
struct NetworkEnd {
  NetworkEndRequest request;
  net::SlotRegion host;    ///< the region as the CPU (proxy) sees it
  char* device = nullptr;  ///< the block as the GPU sees it (the layout's offsets apply)
  net::NetConnection* connection = nullptr;
};

/// What a failed network connection means at the API: the peer's loss (its process died, its
/// host or the link vanished, it broke the protocol) is ncclRemoteError; a local failure (a
/// socket error, the proxy stopped, this side's GPU wrote a counter wrong) is ncclSystemError.
/// (kPeerClosed maps to ncclRemoteError too, but connect() does not report it.)
ncclResult_t network_failure_code(net::NetConnection::Failure failure);

class NetworkLinks {
 public:
  using FailureHandler = std::function<void(ncclResult_t code, const std::string& why)>;
  struct Options {
    bool pinned = true;  ///< cudaHostAlloc (mapped); false: plain host memory (no GPU)
    /// Bootstrap tags: the executor's exchange tag; each connection adds its own bits.
    uint64_t tag = 0;
  };

  /// Creates and connects `requests` (every process running an end of these connections
  /// calls it at the same point, with its own ends). `boot`: this process's leader's
  /// bootstrap; `leader[r]`: the leader rank of rank r's process.
  static StatusOr<std::unique_ptr<NetworkLinks>> connect(
      net::Proxy& proxy, net::Bootstrap& boot, const std::vector<int32_t>& leader,
      const std::vector<NetworkEndRequest>& requests, const Options& options,
      net::Deadline deadline, const std::atomic<bool>* abort, FailureHandler on_failure);

  const std::vector<NetworkEnd>& ends() const { return ends_; }
  /// Ends every connection (goodbyes; their memory is freed after).
  ~NetworkLinks();
  NetworkLinks(const NetworkLinks&) = delete;
  NetworkLinks& operator=(const NetworkLinks&) = delete;

 private:
  NetworkLinks() = default;
  struct Block;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<net::NetConnection>> connections_;
  std::vector<NetworkEnd> ends_;
};

}  // namespace efccl::runtime
