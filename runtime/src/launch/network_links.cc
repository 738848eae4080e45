#include "launch/network_links.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "efccl/common/hash.h"
#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

std::string end_name(const NetworkEndRequest& r) {
  return std::string(r.send ? "send" : "recv") + " rank " + std::to_string(r.sender) + " -> rank " +
         std::to_string(r.receiver) + " channel " + std::to_string(r.channel);
}

/// The bootstrap tag of one connection's handle: the executor's tag and the connection.
uint64_t handle_tag(uint64_t base, const NetworkEndRequest& r) {
  uint64_t h = fnv1a_u64(base);
  h = fnv1a_u64(static_cast<uint64_t>(static_cast<uint32_t>(r.sender)), h);
  h = fnv1a_u64(static_cast<uint64_t>(static_cast<uint32_t>(r.receiver)), h);
  h = fnv1a_u64(static_cast<uint64_t>(static_cast<uint32_t>(r.channel)), h);
  return mix64(h);
}

}  // namespace

/// One end's memory: pinned and mapped (the GPU reaches it), or plain host memory.
struct NetworkLinks::Block {
  void* host = nullptr;
  char* device = nullptr;
  bool pinned = false;
  ~Block() {
    if (host == nullptr) return;
    if (pinned) {
      if (cudaFreeHost(host) != cudaSuccess) (void)cudaGetLastError();
    } else {
      std::free(host);
    }
  }
};

ncclResult_t network_failure_code(net::NetConnection::Failure failure) {
  return failure == net::NetConnection::Failure::kSystem ? ncclSystemError : ncclRemoteError;
}

StatusOr<std::unique_ptr<NetworkLinks>> NetworkLinks::connect(
    net::Proxy& proxy, net::Bootstrap& boot, const std::vector<int32_t>& leader,
    const std::vector<NetworkEndRequest>& requests, const Options& options, net::Deadline deadline,
    const std::atomic<bool>* abort, FailureHandler on_failure) {
  std::unique_ptr<NetworkLinks> links(new NetworkLinks());
  const auto leader_of = [&](int32_t rank) -> StatusOr<int> {
    if (rank < 0 || static_cast<std::size_t>(rank) >= leader.size())
      return Status::error("rank " + std::to_string(rank) + " is not in the communicator");
    return leader[static_cast<std::size_t>(rank)];
  };
  // Memory first: nothing is connected if any allocation fails.
  for (const NetworkEndRequest& r : requests) {
    if (Status s = r.layout.check(); !s) return Status::error(end_name(r) + ": " + s.message());
    auto block = std::make_unique<Block>();
    const uint64_t bytes = r.layout.region_bytes();
    if (options.pinned) {
      if (cudaHostAlloc(&block->host, bytes, cudaHostAllocMapped | cudaHostAllocPortable) !=
          cudaSuccess) {
        const std::string e = cudaGetErrorString(cudaGetLastError());
        block->host = nullptr;
        return Status::error(end_name(r) + ": cannot allocate " + std::to_string(bytes) +
                             " bytes of pinned host memory: " + e);
      }
      block->pinned = true;
      void* device = nullptr;
      if (cudaHostGetDevicePointer(&device, block->host, 0) != cudaSuccess)
        return Status::error(end_name(r) + ": the GPU cannot map pinned host memory: " +
                             cudaGetErrorString(cudaGetLastError()));
      block->device = static_cast<char*>(device);
    } else {
      block->host = std::aligned_alloc(net::SlotLayout::kSlotsOffsetAlign, bytes);
      if (block->host == nullptr)
        return Status::error(end_name(r) + ": cannot allocate " + std::to_string(bytes) +
                             " bytes of slot memory");
      block->device = static_cast<char*>(block->host);
    }
    NetworkEnd end;
    end.request = r;
    end.host = net::SlotRegion::in(block->host, r.layout);
    end.device = block->device;
    links->ends_.push_back(end);
    links->blocks_.push_back(std::move(block));
  }
  links->connections_.resize(requests.size());
  // Receiving ends: expect the sender, send it the handle (never blocks on the peer).
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const NetworkEndRequest& r = requests[i];
    if (r.send) continue;
    auto to = leader_of(r.sender);
    if (!to) return to.status();
    std::string handle;
    auto c = proxy.expect(links->ends_[i].host, end_name(r), &handle);
    if (!c) return c.status();
    links->connections_[i] = std::move(*c);
    if (Status s = boot.send(*to, handle_tag(options.tag, r), handle, deadline, abort); !s)
      return Status::error(end_name(r) + ": sending its handle to rank " + std::to_string(*to) +
                           ": " + s.message());
  }
  // Sending ends: the receiver's handle, then the sockets.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const NetworkEndRequest& r = requests[i];
    if (!r.send) continue;
    auto from = leader_of(r.receiver);
    if (!from) return from.status();
    auto handle = boot.recv(*from, handle_tag(options.tag, r), deadline, abort);
    if (!handle)
      return Status::error(end_name(r) + ": receiving the receiver's handle from rank " +
                           std::to_string(*from) + ": " + handle.status().message());
    auto c = proxy.connect(links->ends_[i].host, end_name(r), *handle, deadline, abort);
    if (!c) return c.status();
    links->connections_[i] = std::move(*c);
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    net::NetConnection& c = *links->connections_[i];
    if (!requests[i].send)
      if (Status s = c.wait_open(deadline, abort); !s) return s;
    links->ends_[i].connection = &c;
    // A goodbye is the peer's executor going (its communicator destroyed), not a failure: the
    // data it sent before has arrived, and a kernel that still waits for more times out.
    c.set_failure_handler(
        [on_failure, name = c.name()](net::NetConnection::Failure f, const std::string& why) {
          if (f == net::NetConnection::Failure::kPeerClosed) {
            EFCCL_INFO(kLogNet, -1, "network connection " + name + " closed by its peer");
            return;
          }
          if (on_failure) on_failure(network_failure_code(f), why);
        });
    const NetworkEndRequest& r = requests[i];
    EFCCL_INFO(kLogNet | kLogInit, -1,
               "channel " + std::to_string(r.channel) + ": rank " + std::to_string(r.sender) +
                   " -> rank " + std::to_string(r.receiver) + (r.send ? " [send]" : " [receive]") +
                   " via NET/Socket/" + std::to_string(c.sockets()) + " (" + c.name() + ", " +
                   std::to_string(r.layout.nslots) + " slots of " +
                   std::to_string(r.layout.slot_bytes) + " bytes)");
  }
  EFCCL_INFO(kLogNet | kLogInit, -1,
             "network connections: " + std::to_string(requests.size()) +
                 " end(s) of this process connected through the proxy at " +
                 proxy.listen_address());
  return links;
}

NetworkLinks::~NetworkLinks() {
  for (auto& c : connections_)
    if (c != nullptr) c->close();
  connections_.clear();  // before the blocks they point into
}

}  // namespace efccl::runtime
