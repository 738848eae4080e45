#include "efccl/net/slot_region.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace efccl::net {
namespace {

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

Status SlotLayout::check() const {
  if (nslots == 0 || nslots > kMaxSlots)
    return Status::error("a connection has " + std::to_string(nslots) + " slots (1 to " +
                         std::to_string(kMaxSlots) + " allowed)");
  if (slot_bytes == 0 || slot_bytes > kMaxSlotBytes)
    return Status::error("a connection's slots of " + std::to_string(slot_bytes) + " bytes (1 to " +
                         std::to_string(kMaxSlotBytes) + " allowed)");
  return Status::ok();
}

uint64_t SlotLayout::slots_offset() const {
  return round_up(sizes_offset() + uint64_t{nslots} * sizeof(uint32_t), kSlotsOffsetAlign);
}

uint64_t SlotLayout::region_bytes() const {
  return round_up(slots_offset() + uint64_t{nslots} * slot_bytes, kSlotsOffsetAlign);
}

SlotRegion SlotRegion::in(void* block, const SlotLayout& layout) {
  auto* base = static_cast<char*>(block);
  SlotRegion r;
  r.layout = layout;
  r.tail = reinterpret_cast<uint64_t*>(base + layout.tail_offset());
  r.head = reinterpret_cast<uint64_t*>(base + layout.head_offset());
  r.sizes = reinterpret_cast<uint32_t*>(base + layout.sizes_offset());
  r.slots = base + layout.slots_offset();
  std::memset(base, 0, layout.slots_offset());
  return r;
}

void SlotRegion::raise(uint64_t* counter, uint64_t v) {
  std::atomic_ref<uint64_t> c(*counter);
  uint64_t now = c.load(std::memory_order_relaxed);
  while (now < v &&
         !c.compare_exchange_weak(now, v, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void HostSlotMemory::Free::operator()(void* p) const { std::free(p); }

StatusOr<HostSlotMemory> HostSlotMemory::allocate(const SlotLayout& layout) {
  if (Status s = layout.check(); !s) return s;
  void* block = std::aligned_alloc(SlotLayout::kSlotsOffsetAlign, layout.region_bytes());
  if (block == nullptr)
    return Status::error("cannot allocate " + std::to_string(layout.region_bytes()) +
                         " bytes of slot memory");
  HostSlotMemory m;
  m.block_.reset(block);
  m.region_ = SlotRegion::in(block, layout);
  return m;
}

}  // namespace efccl::net
