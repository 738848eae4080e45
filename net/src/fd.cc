#include "efccl/net/fd.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <utility>

namespace efccl::net {
namespace {

// A lock-free table, as any thread may hold any lock at fork time. Slots hold fd + 1; 0 is free.
constexpr int kTrackedFds = 4096;
std::atomic<int> g_tracked_fds[kTrackedFds];

void release_fds_in_child() {
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (auto& slot : g_tracked_fds) {
    const int v = slot.load(std::memory_order_relaxed);
    if (v <= 0) continue;
    if (devnull >= 0) ::dup3(devnull, v - 1, O_CLOEXEC);  // an exec'd program inherits nothing
    slot.store(0, std::memory_order_relaxed);
  }
  if (devnull >= 0) ::close(devnull);
}

void track(int fd) {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, release_fds_in_child); });
  for (auto& slot : g_tracked_fds) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, fd + 1)) return;
  }  // table full: this descriptor is simply not released in forked children
}

void untrack(int fd) {
  for (auto& slot : g_tracked_fds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

}  // namespace

Fd::Fd(int fd) : fd_(fd), tracked_(fd >= 0) {
  if (tracked_) track(fd_);
}

Fd Fd::untracked(int fd) {
  Fd out;
  out.fd_ = fd;
  return out;
}

Fd::Fd(Fd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), tracked_(std::exchange(other.tracked_, false)) {}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
    tracked_ = std::exchange(other.tracked_, false);
  }
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) {
    if (tracked_) untrack(fd_);
    ::close(fd_);
  }
  fd_ = fd;
  tracked_ = fd >= 0;
  if (tracked_) track(fd_);
}

int Fd::release() {
  if (fd_ >= 0 && tracked_) untrack(fd_);
  tracked_ = false;
  return std::exchange(fd_, -1);
}

}  // namespace efccl::net
