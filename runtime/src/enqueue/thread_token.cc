#include "enqueue/thread_token.h"

#include <mutex>
#include <unordered_set>

namespace efccl::runtime {
namespace {

/// The tokens of the threads alive now (never destroyed: threads exit during static destruction).
struct LiveThreads {
  std::mutex mu;
  std::unordered_set<uint64_t> tokens;
  uint64_t next = 0;
};
LiveThreads& live_threads() {
  static auto* l = new LiveThreads();
  return *l;
}

/// Registers the thread's token on its first use and removes it when the thread exits.
struct ThreadToken {
  ThreadToken() {
    LiveThreads& l = live_threads();
    std::lock_guard<std::mutex> lock(l.mu);
    value = ++l.next;
    l.tokens.insert(value);
  }
  ~ThreadToken() {
    LiveThreads& l = live_threads();
    std::lock_guard<std::mutex> lock(l.mu);
    l.tokens.erase(value);
  }
  uint64_t value = 0;
};

}  // namespace

uint64_t this_thread_token() {
  thread_local ThreadToken token;
  return token.value;
}

bool thread_exited(uint64_t token) {
  LiveThreads& l = live_threads();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.tokens.count(token) == 0;
}

}  // namespace efccl::runtime
