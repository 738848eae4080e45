#include "proxy_thread.h"

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "efccl/common/log.h"

namespace efccl::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// Waiting for a counter: sleeps 5 us doubling up to 50 us while the thread moved bytes within
// the last 10 ms (the GPU is likely to post or free a slot soon), up to 1 ms after that.
constexpr int64_t kActiveNs = 10'000'000;
constexpr int64_t kFirstSleepNs = 5'000;
constexpr int64_t kActiveSleepNs = 50'000;
constexpr int64_t kIdleSleepNs = 1'000'000;
constexpr int64_t kSocketWaitNs = 100'000'000;

int64_t now_ns() {
  return std::chrono::duration_cast<nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

ProxyThread::ProxyThread(int index, Waker waker, std::unique_ptr<ProxyListener> listener)
    : index_(index), waker_(std::move(waker)), listener_(std::move(listener)) {}

ProxyThread::~ProxyThread() { stop(); }

Status ProxyThread::start() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::exception& e) {
    return Status::error(std::string("cannot start a network proxy thread: ") + e.what());
  }
  id_ = thread_.get_id();
  return Status::ok();
}

void ProxyThread::stop() {
  stop_.store(true);
  if (getpid() != owner_pid_) {
    // An inherited copy in a forked child: the thread does not exist here, the descriptors are
    // /dev/null already (fd.h), and the fork may have caught the thread's structures or locks
    // mid-change. Forget all of it without touching it.
    new std::thread(std::move(thread_));                              // NOLINT: leaked
    new std::vector<std::unique_ptr<SocketTask>>(std::move(tasks_));  // NOLINT: leaked
    new std::vector<std::unique_ptr<SocketTask>>(std::move(inbox_));  // NOLINT: leaked
    (void)listener_.release();                                        // NOLINT: leaked
    return;
  }
  waker_.wake();
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == id_)
      thread_.detach();  // cannot happen through the API (handlers must not destroy the proxy)
    else
      thread_.join();
  }
  std::vector<std::unique_ptr<SocketTask>> left;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    stopped_ = true;
    left.swap(inbox_);
  }
  for (auto& t : left) t->abandon("the network proxy stopped");
}

void ProxyThread::add(std::unique_ptr<SocketTask> task) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    if (!stopped_) {
      inbox_.push_back(std::move(task));
      task = nullptr;
    }
  }
  if (task != nullptr) task->abandon("the network proxy stopped");
  waker_.wake();
}

void ProxyThread::kick(int64_t until_ns) {
  int64_t now = hot_until_ns_.load();
  while (now < until_ns && !hot_until_ns_.compare_exchange_weak(now, until_ns)) {
  }
  waker_.wake();
}

void ProxyThread::drop_all(const std::string& why) {
  for (auto& t : tasks_) t->abandon(why);
  tasks_.clear();
}

void ProxyThread::run() {
  // The short sleeps below are meant short: without this, Linux stretches each by up to 50 us.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  try {
    serve();
    drop_all("the network proxy stopped");
  } catch (const std::exception& e) {
    // E.g. out of memory: this thread's connections fail; the others go on.
    const std::string why =
        std::string("network proxy thread ") + std::to_string(index_) + " failed: " + e.what();
    EFCCL_WARN(-1, why);
    drop_all(why);
    std::lock_guard<std::mutex> lock(inbox_mu_);
    stopped_ = true;
    for (auto& t : inbox_) t->abandon(why);
    inbox_.clear();
  }
  listener_.reset();
}

void ProxyThread::serve() {
  std::vector<pollfd> fds;
  int64_t sleep_ns = 0;
  int64_t last_progress = now_ns();
  while (!stop_.load()) {
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      for (auto& t : inbox_) tasks_.push_back(std::move(t));
      inbox_.clear();
    }
    fds.clear();
    fds.push_back({waker_.fd(), POLLIN, 0});
    const std::size_t listen_at = fds.size();
    const std::size_t listen_count = listener_ ? listener_->add_pollfds(fds) : 0;
    const std::size_t tasks_at = fds.size();
    for (const auto& t : tasks_) fds.push_back({t->poll_fd(), t->events(), 0});
    timespec wait{sleep_ns / 1'000'000'000, sleep_ns % 1'000'000'000};
    if (::ppoll(fds.data(), fds.size(), &wait, nullptr) < 0 && errno != EINTR) {
      EFCCL_WARN(-1, std::string("network proxy: ppoll(): ") + std::strerror(errno));
      wait = {0, 1'000'000};
      ::nanosleep(&wait, nullptr);
      continue;
    }
    if (fds[0].revents != 0) waker_.drain();
    if (listener_) listener_->service(&fds[listen_at], listen_count);
    bool progressed = false, counter_wait = false;
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      const SocketTask::Step s = tasks_[i]->step(fds[tasks_at + i].revents);
      progressed |= s.progressed;
      counter_wait |= s.counter_wait;
      if (s.finished) tasks_[i].reset();  // closes the socket, detaches from the connection
    }
    std::erase(tasks_, nullptr);
    const int64_t now = now_ns();
    if (progressed) {
      last_progress = now;
      sleep_ns = 0;
    } else if (counter_wait) {
      if (now < hot_until_ns_.load())
        sleep_ns = 0;
      else
        sleep_ns = std::clamp(sleep_ns * 2, kFirstSleepNs,
                              now - last_progress < kActiveNs ? kActiveSleepNs : kIdleSleepNs);
    } else {
      sleep_ns = kSocketWaitNs;
    }
  }
}

}  // namespace efccl::net
