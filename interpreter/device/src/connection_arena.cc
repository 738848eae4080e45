// Connection memory and handles.
#include "connection_arena.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_status.h"

namespace efccl::device {
namespace {

std::string connection_name(const ConnectionPlan& c) {
  return "connection " + std::to_string(c.sender) + "->" + std::to_string(c.receiver) + " ch " +
         std::to_string(c.channel);
}

/// Writes `value` at `at`: host memory (`device` -1) directly, device memory through a private
/// stream, waited for (the executor's launches come after).
Status store_counter(char* at, int device, uint64_t value) {
  if (device < 0) {
    std::memcpy(at, &value, sizeof(value));
    return Status::ok();
  }
  DeviceScope scope(device);
  cudaStream_t stream = nullptr;
  EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaError_t e = cudaMemcpyAsync(at, &value, sizeof(uint64_t), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  EFCCL_CUDA_RETURN(e,
                    "writing the first connection positions on device " + std::to_string(device));
  return Status::ok();
}

}  // namespace

ConnectionArena::~ConnectionArena() {
  for (const auto& [key, bases] : remote_) {
    DeviceScope scope(key.second);
    cudaIpcCloseMemHandle(bases.first);
    cudaIpcCloseMemHandle(bases.second);
  }
  for (const auto& [device, base] : remote_ipc_placed_) {
    DeviceScope scope(device);
    cudaIpcCloseMemHandle(base);
  }
}

Status ConnectionArena::allocate(const ConnectionLayout& layout, const std::vector<int>& devices,
                                 const std::vector<int64_t>& locations,
                                 const std::vector<int>& slot_devices) {
  layout_ = layout;
  locals_.clear();
  locals_.resize(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    Local& l = locals_[i];
    l.device = devices[i];
    l.location = locations[i];
    if (Status s = l.fifo.allocate(l.device, layout.fifo_bytes.at(l.location)); !s) return s;
    // The counter arena ends with the location's board (direct transfers between processes).
    if (Status s = l.counters.allocate(
            l.device, xproc_board_offset(layout.counter_bytes.at(l.location)) + sizeof(XprocBoard));
        !s)
      return s;
  }
  own_.clear();
  for (const Local& l : locals_) own_[l.location] = &l;

  // The placed arenas of connections received here, reached from every local device.
  for (const auto& [key, bytes] : layout.placed_bytes) {
    if (!own_.count(key.receiver)) continue;
    auto p = std::make_unique<Placed>();
    p->key = key;
    p->bytes = bytes;
    if (key.slot_device >= 0) {
      if (static_cast<std::size_t>(key.slot_device) >= slot_devices.size())
        return Status::error("slot device " + std::to_string(key.slot_device) +
                             " has no CUDA device (ExecutorConfig::slot_devices)");
      p->device = slot_devices[static_cast<std::size_t>(key.slot_device)];
      if (Status s = p->device_memory.allocate(p->device, bytes); !s)
        return Status::error("slot device " + std::to_string(key.slot_device) + ": " + s.message());
      for (const Local& l : locals_) placed_reach_[{key, l.device}] = p->device_memory.get();
    } else {
      if (own_.count(key.sender)) {
        if (Status s = p->host_memory.allocate(bytes); !s) return s;
        p->host = p->host_memory.get();
      } else {
        auto segment = SharedHostSegment::create(bytes);
        if (!segment) return segment.status();
        p->segment = std::move(*segment);
        if (Status s = p->registration.register_range(p->segment->data(), bytes); !s) return s;
        p->host = p->segment->data();
      }
      for (const Local& l : locals_) {
        auto reach = HostRegistration::device_pointer(p->host, l.device);
        if (!reach) return reach.status();
        placed_reach_[{key, l.device}] = *reach;
      }
    }
    placed_.push_back(std::move(p));
  }
  return Status::ok();
}

void ConnectionArena::add_remote(int64_t location, int device, char* fifo, char* counters) {
  remote_[{location, device}] = {fifo, counters};
}

void ConnectionArena::add_remote_placed(const PlacedArenaKey& key, int device, char* base) {
  remote_ipc_placed_.emplace_back(device, base);
  placed_reach_[{key, device}] = base;
}

Status ConnectionArena::add_remote_host(const PlacedArenaKey& key, int device,
                                        SharedHostSegment segment) {
  auto remote = std::make_unique<RemoteHost>();
  remote->segment = std::move(segment);
  if (Status s =
          remote->registration.register_range(remote->segment.data(), remote->segment.bytes());
      !s)
    return s;
  auto reach = HostRegistration::device_pointer(remote->segment.data(), device);
  if (!reach) return reach.status();
  placed_reach_[{key, device}] = *reach;
  remote_hosts_.push_back(std::move(remote));
  return Status::ok();
}

char* ConnectionArena::fifo_base(int64_t location, int device) const {
  if (auto it = own_.find(location); it != own_.end()) return it->second->fifo.get();
  auto it = remote_.find({location, device});
  return it == remote_.end() ? nullptr : it->second.first;
}

char* ConnectionArena::counter_base(int64_t location, int device) const {
  if (auto it = own_.find(location); it != own_.end()) return it->second->counters.get();
  auto it = remote_.find({location, device});
  return it == remote_.end() ? nullptr : it->second.second;
}

XprocBoard* ConnectionArena::board(int64_t location, int device) const {
  char* base = counter_base(location, device);
  auto bytes = layout_.counter_bytes.find(location);
  if (base == nullptr || bytes == layout_.counter_bytes.end()) return nullptr;
  return reinterpret_cast<XprocBoard*>(base + xproc_board_offset(bytes->second));
}

char* ConnectionArena::placed_base(const PlacedArenaKey& key, int device) const {
  auto it = placed_reach_.find({key, device});
  return it == placed_reach_.end() ? nullptr : it->second;
}

char* ConnectionArena::fifo_entry(const ConnectionPlan& c, const std::vector<int64_t>& location,
                                  int device) const {
  char* base = c.placed() ? placed_base(c.placed_arena(location), device)
                          : fifo_base(location[c.receiver], device);
  return base == nullptr ? nullptr : base + c.recv_offset;
}

void ConnectionArena::add_network_end(const ConnectionPlan& c, const NetworkEndMemory& memory) {
  network_ends_[{c.sender, c.receiver, c.channel}] = memory;
}

StatusOr<SendConnectionDeviceHandle> ConnectionArena::send_handle(
    const ConnectionPlan& c, const std::vector<int64_t>& location, int device) const {
  SendConnectionDeviceHandle s{};
  s.slot_stride = layout_.slot_stride;
  s.nslots = layout_.nslots;
  s.peer = c.receiver;
  s.channel = c.channel;
  s.wire = c.wire;
  if (c.network) {
    auto it = network_ends_.find({c.sender, c.receiver, c.channel});
    char* counters = counter_base(location[c.sender], device);
    if (it == network_ends_.end() || counters == nullptr)
      return Status::error("internal: the network end of " + connection_name(c) +
                           " is not connected on device " + std::to_string(device) + " (sender)");
    const NetworkEndMemory& m = it->second;
    s.slots = m.device + m.slots_offset;
    s.tail = reinterpret_cast<uint64_t*>(m.device + m.tail_offset);
    s.head = reinterpret_cast<uint64_t*>(m.device + m.head_offset);  // raised by the proxy
    s.sizes = reinterpret_cast<uint32_t*>(m.device + m.sizes_offset);
    s.position = reinterpret_cast<uint64_t*>(counters + c.send_offset + kSendPositionOffset);
    return s;
  }
  char* fifo = fifo_entry(c, location, device);
  char* counters = counter_base(location[c.sender], device);
  if (fifo == nullptr || counters == nullptr)
    return Status::error("internal: the memory of " + connection_name(c) +
                         " is not mapped on device " + std::to_string(device) + " (sender)");
  counters += c.send_offset;
  s.slots = fifo + kSlotsOffset;
  s.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
  s.head =
      reinterpret_cast<uint64_t*>(c.placed() ? fifo + kPlacedHeadOffset : counters + kHeadOffset);
  s.position = reinterpret_cast<uint64_t*>(counters + kSendPositionOffset);
  return s;
}

StatusOr<RecvConnectionDeviceHandle> ConnectionArena::recv_handle(
    const ConnectionPlan& c, const std::vector<int64_t>& location, int device) const {
  RecvConnectionDeviceHandle r{};
  r.slot_stride = layout_.slot_stride;
  r.nslots = layout_.nslots;
  r.peer = c.sender;
  r.channel = c.channel;
  r.wire = c.wire;
  if (c.network) {
    auto it = network_ends_.find({c.sender, c.receiver, c.channel});
    char* counters = counter_base(location[c.receiver], device);
    if (it == network_ends_.end() || counters == nullptr)
      return Status::error("internal: the network end of " + connection_name(c) +
                           " is not connected on device " + std::to_string(device) + " (receiver)");
    const NetworkEndMemory& m = it->second;
    r.slots = m.device + m.slots_offset;
    r.tail = reinterpret_cast<uint64_t*>(m.device + m.tail_offset);  // raised by the proxy
    r.head = reinterpret_cast<uint64_t*>(m.device + m.head_offset);
    r.position = reinterpret_cast<uint64_t*>(counters + c.recv_end_offset + kRecvEndPositionOffset);
    r.network = 1;
    return r;
  }
  char* fifo = fifo_entry(c, location, device);
  // A placed connection's head lies with its slots, and its receiver's position here; else
  // head is at the sender and the position in the FIFO entry.
  char* counters = counter_base(location[c.placed() ? c.receiver : c.sender], device);
  if (fifo == nullptr || counters == nullptr)
    return Status::error("internal: the memory of " + connection_name(c) +
                         " is not mapped on device " + std::to_string(device) + " (receiver)");
  r.slots = fifo + kSlotsOffset;
  r.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
  if (c.placed()) {
    r.head = reinterpret_cast<uint64_t*>(fifo + kPlacedHeadOffset);
    r.position = reinterpret_cast<uint64_t*>(counters + c.recv_end_offset + kRecvEndPositionOffset);
  } else {
    r.head = reinterpret_cast<uint64_t*>(counters + c.send_offset + kHeadOffset);
    r.position = reinterpret_cast<uint64_t*>(fifo + kRecvPositionOffset);
  }
  return r;
}

Status ConnectionArena::write_first_positions(uint64_t first,
                                              const std::vector<ConnectionPlan>& connections,
                                              const std::vector<int64_t>& location,
                                              const std::vector<bool>& local) {
  if (first == 0) return Status::ok();
  // The placed arenas this process owns, by key.
  std::map<PlacedArenaKey, const Placed*> placed;
  for (const auto& p : placed_) placed[p->key] = p.get();
  for (const ConnectionPlan& c : connections) {
    if (local[c.receiver]) {
      const Local& l = *own_.at(location[c.receiver]);
      if (c.placed()) {
        const Placed& p = *placed.at(c.placed_arena(location));
        char* entry = (p.device >= 0 ? p.device_memory.get() : p.host) + c.recv_offset;
        for (std::size_t offset : {kTailOffset, kPlacedHeadOffset})
          if (Status s = store_counter(entry + offset, p.device, first); !s) return s;
        if (Status s = store_counter(l.counters.get() + c.recv_end_offset + kRecvEndPositionOffset,
                                     l.device, first);
            !s)
          return s;
      } else {
        for (std::size_t offset : {kTailOffset, kRecvPositionOffset})
          if (Status s = store_counter(l.fifo.get() + c.recv_offset + offset, l.device, first); !s)
            return s;
      }
    }
    if (local[c.sender]) {
      const Local& l = *own_.at(location[c.sender]);
      char* end = l.counters.get() + c.send_offset;
      if (Status s = store_counter(end + kSendPositionOffset, l.device, first); !s) return s;
      if (!c.placed())
        if (Status s = store_counter(end + kHeadOffset, l.device, first); !s) return s;
    }
  }
  return Status::ok();
}

Status ConnectionArena::zero() {
  for (Local& l : locals_)
    for (DeviceBuffer* b : {&l.fifo, &l.counters})
      if (Status s = b->zero(); !s) return s;
  for (auto& p : placed_) {
    if (p->device >= 0) {
      if (Status s = p->device_memory.zero(); !s) return s;
    } else {
      std::memset(p->host, 0, p->bytes);
    }
  }
  return Status::ok();
}

std::size_t ConnectionArena::most_bytes() const {
  std::map<int, std::size_t> per_device;
  for (const Local& l : locals_) per_device[l.device] += l.fifo.bytes() + l.counters.bytes();
  for (const auto& p : placed_)
    if (p->device >= 0) per_device[p->device] += p->bytes;
  std::size_t most = 0;
  for (const auto& [device, bytes] : per_device) most = std::max(most, bytes);
  return most;
}

}  // namespace efccl::device
