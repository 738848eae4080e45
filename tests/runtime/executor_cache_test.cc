// The executor cache's rules (executor_cache.h) with stand-in executors: least recently used
// first out, pinned executors (used by a captured CUDA graph) never, and evictable again once
// every pin is released, from any thread, even after the cache itself is gone.
#include "launch/executor_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace efccl::runtime {
namespace {

/// Counts the live stand-ins, so that a test sees which ones were destroyed.
struct FakeExecutor {
  explicit FakeExecutor(std::string n, int* live) : name(std::move(n)), live(live) { ++*live; }
  ~FakeExecutor() { --*live; }
  std::string name;
  int* live;
};

TEST(ExecutorCache, EvictsTheLeastRecentlyUsed) {
  int live = 0;
  ExecutorCache<FakeExecutor> cache(2);
  cache.insert("a", std::make_unique<FakeExecutor>("a", &live));
  cache.insert("b", std::make_unique<FakeExecutor>("b", &live));
  EXPECT_NE(cache.find("a"), nullptr);  // a is now the more recent
  std::unique_ptr<FakeExecutor> victim = cache.evict_one();
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->name, "b");
  EXPECT_EQ(cache.evict_one(), nullptr);  // room again
  EXPECT_EQ(cache.find("b"), nullptr);
  EXPECT_EQ(cache.size(), 1u);
  victim.reset();
  EXPECT_EQ(live, 1);
}

TEST(ExecutorCache, APinnedExecutorIsNeverEvicted) {
  int live = 0;
  ExecutorCache<FakeExecutor> cache(1);
  FakeExecutor* captured =
      cache.insert("captured", std::make_unique<FakeExecutor>("captured", &live));
  void* pin = cache.pin(captured);
  ASSERT_NE(pin, nullptr);
  EXPECT_EQ(cache.pinned(), 1u);
  EXPECT_EQ(cache.evict_one(), nullptr);  // full, but everything is pinned
  cache.insert("next", std::make_unique<FakeExecutor>("next", &live));
  EXPECT_EQ(cache.size(), 2u);  // over capacity rather than freeing what a graph uses
  std::unique_ptr<FakeExecutor> victim = cache.evict_one();
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->name, "next");  // newer, but the only one not pinned
  EXPECT_EQ(cache.find("captured"), captured);

  // The graph is destroyed: CUDA releases the pin on one of its own threads.
  std::thread cuda_internal([pin] { ExecutorCache<FakeExecutor>::release_pin(pin); });
  cuda_internal.join();
  EXPECT_EQ(cache.pinned(), 0u);
  victim = cache.evict_one();
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->name, "captured");
}

TEST(ExecutorCache, PinsCountEveryCapture) {
  int live = 0;
  ExecutorCache<FakeExecutor> cache(1);
  FakeExecutor* e = cache.insert("e", std::make_unique<FakeExecutor>("e", &live));
  void* first = cache.pin(e);
  void* second = cache.pin(e);  // a second graph captured the same executor
  ExecutorCache<FakeExecutor>::release_pin(first);
  EXPECT_EQ(cache.pinned(), 1u);
  EXPECT_EQ(cache.evict_one(), nullptr);
  ExecutorCache<FakeExecutor>::release_pin(second);
  EXPECT_NE(cache.evict_one(), nullptr);
}

TEST(ExecutorCache, APinMayOutliveTheCache) {
  int live = 0;
  void* pin = nullptr;
  {
    ExecutorCache<FakeExecutor> cache(4);
    FakeExecutor* e = cache.insert("e", std::make_unique<FakeExecutor>("e", &live));
    pin = cache.pin(e);
    EXPECT_EQ(cache.pin(nullptr), nullptr);  // not cached: no pin
  }
  EXPECT_EQ(live, 0);
  ExecutorCache<FakeExecutor>::release_pin(pin);  // a graph destroyed after its communicators
}

}  // namespace
}  // namespace efccl::runtime
