// Connection memory and handles.
#include "connection_arena.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "cuda_status.h"

namespace efccl::device {

ConnectionArena::~ConnectionArena() {
  for (const auto& [key, bases] : remote_) {
    DeviceScope scope(key.second);
    cudaIpcCloseMemHandle(bases.first);
    cudaIpcCloseMemHandle(bases.second);
  }
}

Status ConnectionArena::allocate(const ConnectionLayout& layout, const std::vector<int>& devices,
                                 const std::vector<int64_t>& locations) {
  layout_ = layout;
  locals_.clear();
  locals_.resize(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    Local& l = locals_[i];
    l.device = devices[i];
    l.location = locations[i];
    if (Status s = l.fifo.allocate(l.device, layout.fifo_bytes.at(l.location)); !s) return s;
    if (Status s = l.counters.allocate(l.device, layout.counter_bytes.at(l.location)); !s) return s;
  }
  own_.clear();
  for (const Local& l : locals_) own_[l.location] = &l;
  return Status::ok();
}

void ConnectionArena::add_remote(int64_t location, int device, char* fifo, char* counters) {
  remote_[{location, device}] = {fifo, counters};
}

char* ConnectionArena::fifo_base(int64_t location, int device) const {
  if (auto it = own_.find(location); it != own_.end()) return it->second->fifo.get();
  return remote_.at({location, device}).first;
}

char* ConnectionArena::counter_base(int64_t location, int device) const {
  if (auto it = own_.find(location); it != own_.end()) return it->second->counters.get();
  return remote_.at({location, device}).second;
}

SendConnectionDeviceHandle ConnectionArena::send_handle(const ConnectionPlan& c,
                                                        const std::vector<int64_t>& location,
                                                        int device) const {
  char* fifo = fifo_base(location[c.receiver], device) + c.recv_offset;
  char* counters = counter_base(location[c.sender], device) + c.send_offset;
  SendConnectionDeviceHandle s{};
  s.slots = fifo + kSlotsOffset;
  s.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
  s.head = reinterpret_cast<uint64_t*>(counters + kHeadOffset);
  s.position = reinterpret_cast<uint64_t*>(counters + kSendPositionOffset);
  s.slot_stride = layout_.slot_stride;
  s.nslots = layout_.nslots;
  s.peer = c.receiver;
  s.channel = c.channel;
  s.wire = c.wire;
  return s;
}

RecvConnectionDeviceHandle ConnectionArena::recv_handle(const ConnectionPlan& c,
                                                        const std::vector<int64_t>& location,
                                                        int device) const {
  char* fifo = fifo_base(location[c.receiver], device) + c.recv_offset;
  char* counters = counter_base(location[c.sender], device) + c.send_offset;
  RecvConnectionDeviceHandle r{};
  r.slots = fifo + kSlotsOffset;
  r.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
  r.head = reinterpret_cast<uint64_t*>(counters + kHeadOffset);
  r.position = reinterpret_cast<uint64_t*>(fifo + kRecvPositionOffset);
  r.slot_stride = layout_.slot_stride;
  r.nslots = layout_.nslots;
  r.peer = c.sender;
  r.channel = c.channel;
  r.wire = c.wire;
  return r;
}

Status ConnectionArena::write_first_positions(uint64_t first,
                                              const std::vector<ConnectionPlan>& connections,
                                              const std::vector<int64_t>& location,
                                              const std::vector<bool>& local) {
  if (first == 0) return Status::ok();
  for (const ConnectionPlan& c : connections) {
    for (const bool receiving : {true, false}) {
      const int rank = receiving ? c.receiver : c.sender;
      if (!local[rank]) continue;
      const Local& l = *own_.at(location[rank]);
      char* at = receiving ? l.fifo.get() + c.recv_offset : l.counters.get() + c.send_offset;
      const std::size_t offsets[2] = {receiving ? kTailOffset : kHeadOffset,
                                      receiving ? kRecvPositionOffset : kSendPositionOffset};
      DeviceScope scope(l.device);
      cudaStream_t stream = nullptr;
      EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                        "cudaStreamCreate");
      cudaError_t e = cudaSuccess;
      for (std::size_t offset : offsets)
        if (e == cudaSuccess)
          e = cudaMemcpyAsync(at + offset, &first, sizeof(uint64_t), cudaMemcpyHostToDevice,
                              stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
      EFCCL_CUDA_RETURN(e, "writing the first connection positions");
    }
  }
  return Status::ok();
}

Status ConnectionArena::zero() {
  for (Local& l : locals_)
    for (DeviceBuffer* b : {&l.fifo, &l.counters})
      if (Status s = b->zero(); !s) return s;
  return Status::ok();
}

std::size_t ConnectionArena::most_bytes() const {
  std::size_t most = 0;
  for (const Local& l : locals_) most = std::max(most, l.fifo.bytes() + l.counters.bytes());
  return most;
}

}  // namespace efccl::device
