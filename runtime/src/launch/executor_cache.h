// The executors of one clique, by key (program and ranks). A bounded cache: when it is full
// the least recently used executor goes, except one that a CUDA graph still uses. A capture
// pins the executors it launches (a CUDA user object retained by the captured graph holds the
// pin); the pin ends when CUDA destroys that object, after the graph and every executable
// instantiated from it are gone. The release runs on a CUDA-internal thread, which may call no
// CUDA function and should not block: it only decrements an atomic count.
//
// Capacity: EFCCL_EXECUTOR_CACHE executors per clique (default 256). A template so that the
// eviction rules are tested on the CPU with stand-in executors.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace efccl::runtime {

template <typename Executor>
class ExecutorCache {
 public:
  explicit ExecutorCache(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const { return entries_.size(); }
  /// Entries that a CUDA graph still uses.
  std::size_t pinned() const {
    return static_cast<std::size_t>(std::count_if(
        entries_.begin(), entries_.end(),
        [](const auto& e) { return e.second.pins->load(std::memory_order_acquire) > 0; }));
  }

  /// The executor under `key` (marked as just used), or null.
  Executor* find(const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    it->second.last_use = ++clock_;
    return it->second.executor.get();
  }

  /// Stores `executor` under `key` (absent) and returns it.
  Executor* insert(const std::string& key, std::unique_ptr<Executor> executor) {
    Entry& e = entries_[key];
    e.executor = std::move(executor);
    e.last_use = ++clock_;
    return e.executor.get();
  }

  /// When the cache is full: removes the least recently used unpinned executor and hands it
  /// over (the caller destroys it); null when there is room or everything is pinned.
  std::unique_ptr<Executor> evict_one() {
    if (entries_.size() < capacity_) return nullptr;
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.pins->load(std::memory_order_acquire) == 0 &&
          (victim == entries_.end() || it->second.last_use < victim->second.last_use))
        victim = it;
    if (victim == entries_.end()) return nullptr;
    std::unique_ptr<Executor> out = std::move(victim->second.executor);
    entries_.erase(victim);
    return out;
  }

  /// A new pin on the entry holding `executor` (null when it is not cached): an opaque handle
  /// that keeps it from eviction until release_pin(handle), which any thread may call.
  void* pin(const Executor* executor) {
    for (auto& [key, e] : entries_) {
      if (e.executor.get() != executor) continue;
      e.pins->fetch_add(1, std::memory_order_acq_rel);
      return new std::shared_ptr<std::atomic<int64_t>>(e.pins);
    }
    return nullptr;
  }
  /// Ends a pin from pin(). Lock-free apart from freeing the handle; valid after the cache is gone.
  static void release_pin(void* handle) {
    auto* pins = static_cast<std::shared_ptr<std::atomic<int64_t>>*>(handle);
    (*pins)->fetch_sub(1, std::memory_order_acq_rel);
    delete pins;
  }

  /// Destroys every executor (the clique's end).
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    std::unique_ptr<Executor> executor;
    uint64_t last_use = 0;
    /// Shared with the pin handles, which may outlive the entry (a graph outliving its clique).
    std::shared_ptr<std::atomic<int64_t>> pins = std::make_shared<std::atomic<int64_t>>(0);
  };

  const std::size_t capacity_;
  std::map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace efccl::runtime
