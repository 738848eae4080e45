// The memory of one end of a network connection (docs/net.md, "The proxy transport"): a ring of
// fixed-size slots and the two counters that hand them between the GPU and the proxy. The
// sender's GPU fills slots and advances `tail`; its proxy sends them and advances `head` once a
// slot's bytes have left. The receiver's proxy fills slots from the sockets and advances `tail`;
// its GPU consumes them and advances `head`, and the proxy reads into a slot only once it is
// free (TCP's flow control then holds the sender back).
//
// One block of SlotLayout::region_bytes() bytes holds it all: the counters first (each on its
// own 128-byte line, so that the GPU's and the proxy's writes never share a line), the slots'
// sizes, then the slots at a 4096-byte offset. The runtime allocates the block in pinned host
// memory that the GPU maps (same offsets on the device); tests use HostSlotMemory. Counters only
// grow; they are read and written as 64-bit atomics (acquire loads, release stores).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "efccl/common/status.h"

namespace efccl::net {

/// The shape of a connection's slot ring; both ends of a connection use the same.
struct SlotLayout {
  static constexpr uint32_t kMaxSlots = 1024;
  static constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 30;
  static constexpr uint64_t kCounterLine = 128;
  static constexpr uint64_t kSlotsOffsetAlign = 4096;

  uint32_t nslots = 8;
  uint64_t slot_bytes = 512 * 1024;
  /// The sender writes each slot's byte count into sizes[] before advancing `tail`, and only
  /// that many bytes travel (else every slot travels whole).
  bool sized = true;

  /// nslots in 1..kMaxSlots, slot_bytes in 1..kMaxSlotBytes.
  Status check() const;
  uint64_t tail_offset() const { return 0; }
  uint64_t head_offset() const { return kCounterLine; }
  uint64_t sizes_offset() const { return 2 * kCounterLine; }
  uint64_t slots_offset() const;
  /// Bytes of the whole block (a multiple of 4096).
  uint64_t region_bytes() const;
  bool operator==(const SlotLayout&) const = default;
};

/// One end's memory, laid out in a block (pointers into it).
struct SlotRegion {
  SlotLayout layout;
  uint64_t* tail = nullptr;   ///< slots filled (sender end: the GPU writes; receiver: the proxy)
  uint64_t* head = nullptr;   ///< slots freed (sender end: the proxy writes; receiver: the GPU)
  uint32_t* sizes = nullptr;  ///< nslots entries: bytes in each slot (sized layouts)
  char* slots = nullptr;      ///< nslots * slot_bytes

  /// The region laid out in `block` (region_bytes() bytes, 4096-aligned); zeroes the counters
  /// and sizes, not the slots.
  static SlotRegion in(void* block, const SlotLayout& layout);
  bool valid() const { return tail != nullptr; }

  char* slot(uint64_t position) const {
    return slots + (position % layout.nslots) * layout.slot_bytes;
  }
  uint64_t load_tail() const {
    return std::atomic_ref<uint64_t>(*tail).load(std::memory_order_acquire);
  }
  uint64_t load_head() const {
    return std::atomic_ref<uint64_t>(*head).load(std::memory_order_acquire);
  }
  void store_tail(uint64_t v) const {
    std::atomic_ref<uint64_t>(*tail).store(v, std::memory_order_release);
  }
  void store_head(uint64_t v) const {
    std::atomic_ref<uint64_t>(*head).store(v, std::memory_order_release);
  }
  /// Raises `*counter` to `v` unless it is higher already (several proxy threads publish).
  static void raise(uint64_t* counter, uint64_t v);
};

/// Ordinary host memory for a region (the CPU plays the GPU: tests, benchmarks).
class HostSlotMemory {
 public:
  static StatusOr<HostSlotMemory> allocate(const SlotLayout& layout);
  const SlotRegion& region() const { return region_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> block_;
  SlotRegion region_;
};

}  // namespace efccl::net
