#include "root_server.h"

#include <poll.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <thread>

#include "bootstrap_root.h"
#include "efccl/common/log.h"
#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunk = std::size_t{64} << 10;  // bytes read from a socket at once
constexpr std::chrono::milliseconds kLongestSleep{250};    // timers are this precise at worst

}  // namespace

RootServer& RootServer::instance() {
  static RootServer* server = [] {
    auto* s = new RootServer();  // NOLINT: never destroyed, see the header
    pthread_atfork(lock_for_fork, unlock_after_fork, reset_in_child);
    return s;
  }();
  return *server;
}

void RootServer::lock_for_fork() { instance().mu_.lock(); }
void RootServer::unlock_after_fork() { instance().mu_.unlock(); }

void RootServer::reset_in_child() {
  // Only flags here (a forked child may not allocate safely yet); add() cleans up.
  RootServer& s = instance();
  s.running_ = false;
  s.inherited_ = true;
  s.mu_.unlock();
}

Status RootServer::add(std::shared_ptr<BootstrapRoot> root) {
  std::lock_guard<std::mutex> lock(mu_);
  if (inherited_) {
    // The parent's roots are served by the parent; their descriptors here are /dev/null.
    for (auto& r : roots_) r->close();
    roots_.clear();
    waker_.reset();
    inherited_ = false;
  }
  if (!waker_) {
    auto w = Waker::create();
    if (!w) return Status::error("the rendezvous roots' thread: " + w.status().message());
    waker_ = std::make_unique<Waker>(std::move(*w));
  }
  roots_.push_back(std::move(root));
  if (running_) {
    waker_->wake();
    return Status::ok();
  }
  try {
    std::thread([this] { run(); }).detach();
  } catch (const std::exception& e) {
    roots_.back()->close();
    roots_.pop_back();
    return Status::error(std::string("cannot start the rendezvous roots' thread: ") + e.what());
  }
  running_ = true;
  return Status::ok();
}

void RootServer::wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (waker_) waker_->wake();
}

void RootServer::run() {
  std::vector<char> buffer;
  std::vector<pollfd> fds;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::vector<std::shared_ptr<BootstrapRoot>> roots;
  int waker_fd = -1;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Clock::time_point now = Clock::now();
      for (auto& r : roots_)
        if (r->finished(now)) {
          r->close();
          r.reset();
        }
      std::erase(roots_, nullptr);
      if (roots_.empty()) {
        running_ = false;
        return;
      }
      roots = roots_;
      waker_fd = waker_->fd();
    }
    try {
      if (buffer.empty()) buffer.resize(kReadChunk);
      const Clock::time_point now = Clock::now();
      Clock::time_point next = now + kLongestSleep;
      fds.clear();
      ranges.clear();
      fds.push_back({waker_fd, POLLIN, 0});
      for (const auto& r : roots) {
        const std::size_t begin = fds.size();
        r->add_poll_fds(&fds);
        ranges.emplace_back(begin, fds.size() - begin);
        next = std::min(next, r->next_timer(now));
      }
      const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
      const int rc =
          ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, wait_ms)));
      if (rc < 0 && errno != EINTR) {
        EFCCL_WARN(-1, "bootstrap roots: poll(): " + errno_text(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if ((fds[0].revents & POLLIN) != 0) {
        std::lock_guard<std::mutex> lock(mu_);
        if (waker_) waker_->drain();
      }
      for (std::size_t i = 0; i < roots.size(); ++i) {
        try {
          roots[i]->step(&fds[ranges[i].first], ranges[i].second, buffer, Clock::now());
        } catch (const std::exception& e) {
          roots[i]->crash(e.what());
        } catch (...) {
          roots[i]->crash("an unknown exception");
        }
      }
    } catch (...) {
      // Not even the loop's own bookkeeping could allocate: give every root up, cleanly.
      for (auto& r : roots) r->crash("the serving thread ran out of memory");
    }
    roots.clear();
  }
}

}  // namespace efccl::net
