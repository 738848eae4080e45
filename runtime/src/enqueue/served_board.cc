#include "enqueue/served_board.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "efccl/ef/datatype.h"
#include "launch/call.h"

namespace efccl::runtime {

struct ServedBoard::Record {
  std::atomic<uint64_t> seq{0};  ///< the call it holds; written after the fields (release)
  ServedCall call;
};

struct ServedBoard::Row {
  std::atomic<uint64_t> consumed{0};  ///< the rank decided every call up to this one
  char pad[56] = {};                  // the row's writer and its readers on other cache lines
  Record ring[kRing];
};

struct ServedBoard::Header {
  uint64_t magic = 0;
  uint32_t nranks = 0;
  uint32_t ring = 0;
  std::atomic<int32_t> failed_by{0};
  char pad[44] = {};
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the board's atomics are shared between processes");

namespace {

/// Waits (spinning briefly, then yielding, then sleeping) until `ready` or the deadline/abort.
template <typename Ready>
Status wait_until(Ready ready, net::Deadline deadline, const std::atomic<bool>* abort,
                  const std::atomic<int32_t>& failed_by, const std::string& what) {
  for (uint64_t polls = 0;; ++polls) {
    if (ready()) return Status::ok();
    if ((polls & 63) == 63) {
      if (const int32_t f = failed_by.load(std::memory_order_relaxed); f != 0)
        return Status::error("rank " + std::to_string(f - 1) +
                             "'s served calls failed while waiting for " + what);
      if (abort != nullptr && abort->load(std::memory_order_relaxed))
        return Status::error("aborted while waiting for " + what);
      if (deadline.expired())
        return Status::error("waited " + std::to_string(deadline.budget().count()) + " ms for " +
                             what + " (EFCCL_TIMEOUT_MS)");
    }
    if (polls > 20000)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else if (polls > 2000)
      std::this_thread::yield();
  }
}

}  // namespace

Status check_served_call(const ServedCall& c, int nranks) {
  if (c.kind > static_cast<uint8_t>(CallKind::kScatter))
    return Status::error("collective kind " + std::to_string(c.kind) + " is not one efccl knows");
  if (c.dtype >= ef::kNumDataTypes)
    return Status::error("datatype " + std::to_string(c.dtype) + " is not one efccl knows");
  if (c.op >= ef::kNumRedOps)
    return Status::error("operator " + std::to_string(c.op) + " is not one efccl knows");
  if (c.servable > 1) return Status::error("servable flag " + std::to_string(c.servable));
  if (c.captured > 1) return Status::error("captured flag " + std::to_string(c.captured));
  if (c.root < 0 || c.root >= nranks)
    return Status::error("root " + std::to_string(c.root) + " is not a rank of the " +
                         std::to_string(nranks) + "-rank communicator");
  return Status::ok();
}

bool served_together(const std::vector<ServedCall>& calls) {
  if (calls.empty()) return false;
  const ServedCall& a = calls.front();
  return std::all_of(calls.begin(), calls.end(), [&](const ServedCall& c) {
    return c.servable == 1 && c.kind == a.kind && c.count == a.count && c.dtype == a.dtype &&
           c.op == a.op && c.root == a.root && c.captured == a.captured && c.slot == a.slot;
  });
}

std::size_t ServedBoard::bytes_for(int nranks) {
  return sizeof(Header) + static_cast<std::size_t>(std::max(nranks, 0)) * sizeof(Row);
}

Status ServedBoard::format(void* memory, std::size_t bytes, int nranks) {
  if (nranks < 1 || bytes < bytes_for(nranks))
    return Status::error("a served board of " + std::to_string(nranks) + " ranks needs " +
                         std::to_string(bytes_for(nranks)) + " bytes, not " +
                         std::to_string(bytes));
  auto* h = new (memory) Header();
  h->nranks = static_cast<uint32_t>(nranks);
  h->ring = kRing;
  for (int r = 0; r < nranks; ++r)
    new (static_cast<char*>(memory) + sizeof(Header) + static_cast<std::size_t>(r) * sizeof(Row))
        Row();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return Status::ok();
}

StatusOr<ServedBoard> ServedBoard::attach(void* memory, std::size_t bytes, int nranks) {
  if (nranks < 1 || bytes < bytes_for(nranks))
    return Status::error("the served board's mapping has " + std::to_string(bytes) + " bytes; " +
                         std::to_string(nranks) + " ranks need " +
                         std::to_string(bytes_for(nranks)));
  const auto* h = static_cast<const Header*>(memory);
  if (h->magic != kMagic || h->nranks != static_cast<uint32_t>(nranks) || h->ring != kRing)
    return Status::error("the served board's header is not one this efccl wrote for " +
                         std::to_string(nranks) + " ranks (magic, ranks or ring differ)");
  return ServedBoard(memory, nranks);
}

ServedBoard::ServedBoard(void* memory, int nranks)
    : header_(static_cast<Header*>(memory)), nranks_(nranks) {}

ServedBoard::Row* ServedBoard::row(int rank) const {
  return reinterpret_cast<Row*>(reinterpret_cast<char*>(header_) + sizeof(Header) +
                                static_cast<std::size_t>(rank) * sizeof(Row));
}

Status ServedBoard::post(int rank, uint64_t seq, const ServedCall& call, net::Deadline deadline,
                         const std::atomic<bool>* abort) {
  if (rank < 0 || rank >= nranks_ || seq == 0)
    return Status::error("internal: post of rank " + std::to_string(rank) + " call " +
                         std::to_string(seq));
  if (seq > kRing) {
    const uint64_t reused = seq - kRing;
    for (int r = 0; r < nranks_; ++r) {
      Row* other = row(r);
      if (Status s =
              wait_until([&] { return other->consumed.load(std::memory_order_acquire) >= reused; },
                         deadline, abort, header_->failed_by,
                         "rank " + std::to_string(r) + " to decide collective " +
                             std::to_string(reused) + " (the served board's ring is full)");
          !s)
        return s;
    }
  }
  Record& slot = row(rank)->ring[seq % kRing];
  slot.call = call;
  slot.seq.store(seq, std::memory_order_release);
  return Status::ok();
}

Status ServedBoard::read(int rank, uint64_t seq, ServedCall* out, net::Deadline deadline,
                         const std::atomic<bool>* abort) const {
  if (rank < 0 || rank >= nranks_)
    return Status::error("internal: read of rank " + std::to_string(rank));
  const Record& slot = row(rank)->ring[seq % kRing];
  if (Status s = wait_until([&] { return slot.seq.load(std::memory_order_acquire) == seq; },
                            deadline, abort, header_->failed_by,
                            "rank " + std::to_string(rank) + " to issue collective " +
                                std::to_string(seq) + " (served board)");
      !s)
    return s;
  *out = slot.call;
  if (Status s = check_served_call(*out, nranks_); !s)
    return Status::error("rank " + std::to_string(rank) + "'s collective " + std::to_string(seq) +
                         " on the served board: " + s.message());
  return Status::ok();
}

void ServedBoard::consume(int rank, uint64_t seq) {
  if (rank >= 0 && rank < nranks_) row(rank)->consumed.store(seq, std::memory_order_release);
}

void ServedBoard::set_failed(int rank) {
  int32_t none = 0;
  header_->failed_by.compare_exchange_strong(none, rank + 1);
}

int ServedBoard::failed_by() const { return header_->failed_by.load(std::memory_order_acquire); }

}  // namespace efccl::runtime
