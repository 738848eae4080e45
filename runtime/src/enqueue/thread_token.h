// Names for threads that are never reused (std::thread::id values are, once a thread exited),
// so that the call queue can tell which thread drives a rank and whether it is still alive.
#pragma once

#include <cstdint>

namespace efccl::runtime {

/// A number naming the calling thread, never 0 and never reused in the process.
uint64_t this_thread_token();
/// Whether the thread named `token` has exited (0 names no thread: true).
bool thread_exited(uint64_t token);

}  // namespace efccl::runtime
