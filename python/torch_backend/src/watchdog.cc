#include "watchdog.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace efccl::torch_backend {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kPoll(50);
/// Past a work's deadline before the watchdog fails it itself: efccl's own timeout (the
/// group's, given at creation) normally fires first, with its diagnostic.
constexpr std::chrono::seconds kGrace(2);

/// How long before its deadline an unfinished work is published for the report.
std::chrono::milliseconds report_lead(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(std::chrono::seconds(3), timeout / 2);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string pending_key(int rank) { return "efccl/pending/" + std::to_string(rank); }

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace

bool warnings_enabled() {
  for (const char* name : {"EFCCL_DEBUG", "NCCL_DEBUG"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    std::string level(v);
    for (char& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (level == "WARN" || level == "INFO" || level == "TRACE") return true;
  }
  return false;
}

Watchdog::Watchdog(std::shared_ptr<GroupState> group, c10::intrusive_ptr<c10d::Store> store)
    : group_(std::move(group)), store_(std::move(store)) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { loop(); });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Watchdog::add_communicator(std::shared_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.push_back(std::move(comm));
}

void Watchdog::track(c10::intrusive_ptr<WorkEfccl> work) {
  if (group_->failed()) {  // raced with a failure: the work cannot be trusted either
    if (!work->gpu_finished()) work->fail("efccl " + work->describe() + ": " + group_->failure());
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  works_.push_back(std::move(work));
}

int Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(works_.size());
}

bool Watchdog::drain(std::chrono::milliseconds limit) {
  const Clock::time_point until = Clock::now() + limit;
  while (true) {
    std::deque<c10::intrusive_ptr<WorkEfccl>> works;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      works = works_;
    }
    bool all = true;
    for (const auto& w : works) all = all && w->isCompleted();
    if (all) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Watchdog::loop() {
  // Queries of events from this thread must not invalidate a capture another thread runs in
  // cudaStreamCaptureModeGlobal (PyTorch's default for CUDA graphs).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      check();
    } catch (const std::exception& e) {
      if (warnings_enabled())
        std::fprintf(stderr, "efccl.torch WARN watchdog of %s: %s\n",
                     group_->identity().describe().c_str(), e.what());
    }
    lock.lock();
    cv_.wait_for(lock, kPoll, [this] { return stopping_; });
  }
}

void Watchdog::check() {
  std::deque<c10::intrusive_ptr<WorkEfccl>> works;
  std::vector<std::shared_ptr<Communicator>> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    works.swap(works_);
    comms = comms_;
  }
  std::string efccl_error;
  if (!group_->failed()) {
    for (const auto& c : comms) {
      efccl_error = c->async_error();
      if (!efccl_error.empty()) break;
    }
  }
  std::deque<c10::intrusive_ptr<WorkEfccl>> unfinished;
  const WorkEfccl* oldest = nullptr;
  for (auto& w : works) {
    if (w->has_failed()) {
      w->release_stash();
      continue;
    }
    if (w->gpu_finished()) {
      if (published_seq_ != 0 && published_seq_ == w->getSequencenumber()) publish_pending(nullptr);
      w->release_stash();
      continue;
    }
    if (oldest == nullptr || w->deadline() < oldest->deadline()) oldest = w.get();
    unfinished.push_back(std::move(w));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Works tracked meanwhile come after the older ones.
    for (auto it = unfinished.rbegin(); it != unfinished.rend(); ++it) works_.push_front(*it);
  }
  if (group_->failed()) return;

  const Clock::time_point now = Clock::now();
  if (oldest != nullptr) {
    const auto lead = report_lead(oldest->timeout());
    const bool near_deadline = now + lead >= oldest->deadline();
    if (!efccl_error.empty()) {
      std::string reason = "efccl " + oldest->describe() + " failed: " + efccl_error;
      if (near_deadline)
        reason += missing_ranks_report(oldest->getSequencenumber(), oldest->name());
      fail_group(reason);
      return;
    }
    if (now > oldest->deadline() + kGrace) {
      fail_group("efccl " + oldest->describe() + " did not finish within " +
                 std::to_string(oldest->timeout().count()) + " ms (the group's timeout)" +
                 missing_ranks_report(oldest->getSequencenumber(), oldest->name()));
      return;
    }
    if (near_deadline && published_seq_ != oldest->getSequencenumber()) publish_pending(oldest);
  } else if (!efccl_error.empty()) {
    fail_group("efccl reported an error on " + group_->identity().describe() + ": " + efccl_error);
    return;
  }

  // A host call into efccl that does not return (it waits for the other processes).
  const int64_t started = call_.started_ns.load(std::memory_order_acquire);
  if (started != 0) {
    const auto timeout = std::chrono::milliseconds(call_.timeout_ms.load());
    const auto elapsed = std::chrono::nanoseconds(now_ns() - started);
    const uint64_t seq = call_.seq.load();
    if (elapsed > timeout + kGrace) {
      fail_group("efccl " + std::string(call_.op.load()) + " #" + std::to_string(seq) + " on " +
                 group_->identity().describe() + ": the call did not return within " +
                 std::to_string(timeout.count()) + " ms (the group's timeout)" +
                 missing_ranks_report(seq, call_.op.load()));
    } else if (elapsed + report_lead(timeout) >= timeout && published_seq_ != seq &&
               oldest == nullptr) {
      // Published like a work (the call gets its own sequence number before it starts).
      try {
        report_store().set(pending_key(group_->identity().rank),
                           std::to_string(seq) + " " + call_.op.load());
        published_seq_ = seq;
      } catch (const std::exception&) {  // the report is best effort
      }
    }
  }
}

void Watchdog::publish_pending(const WorkEfccl* work) {
  const std::string key = pending_key(group_->identity().rank);
  try {
    if (work == nullptr) {
      report_store().deleteKey(key);
      published_seq_ = 0;
    } else {
      report_store().set(key, std::to_string(work->getSequencenumber()) + " " + work->name());
      published_seq_ = work->getSequencenumber();
    }
  } catch (const std::exception&) {  // best effort: the failure itself is still reported
    published_seq_ = work != nullptr ? work->getSequencenumber() : 0;
  }
}

c10d::Store& Watchdog::report_store() {
  std::lock_guard<std::mutex> lock(report_mutex_);
  if (!report_store_) {
    try {
      report_store_ = store_->clone();  // its own connection: never queued behind the user's
    } catch (const std::exception&) {
      report_store_ = store_;
    }
  }
  return *report_store_;
}

std::string Watchdog::report_for(uint64_t seq, const char* op) {
  return missing_ranks_report(seq, op);
}

std::string Watchdog::missing_ranks_report(uint64_t seq, const char* op) {
  const GroupIdentity& id = group_->identity();
  std::vector<std::string> missing, stuck, elsewhere;
  try {
    c10d::Store& store = report_store();
    for (int r = 0; r < id.size; ++r) {
      if (r == id.rank) continue;
      const std::string key = pending_key(r);
      if (!store.check({key})) {
        missing.push_back(id.describe_rank(r));
        continue;
      }
      const std::vector<uint8_t> bytes = store.get(key);
      // "SEQ OP" (pending_key's value), parsed without iostreams (see stats_json).
      const std::string value(bytes.begin(), bytes.end());
      char* rest = nullptr;
      const uint64_t their_seq = std::strtoull(value.c_str(), &rest, 10);
      std::string their_op(rest != nullptr ? rest : "");
      their_op.erase(0, their_op.find_first_not_of(' '));
      their_op.erase(std::min(their_op.size(), their_op.find_first_of(" \n")));
      if (their_seq == seq && their_op == op)
        stuck.push_back(id.describe_rank(r));
      else
        elsewhere.push_back(id.describe_rank(r) + " in " + their_op + " #" +
                            std::to_string(their_seq));
    }
  } catch (const std::exception& e) {
    return ". (The other ranks' reports could not be read from the store: " +
           std::string(e.what()) + ")";
  }
  std::string text;
  if (!missing.empty())
    text += ". Missing: " + join(missing) + " never reached " + op + " #" + std::to_string(seq) +
            " (no report from " + (missing.size() == 1 ? "it" : "them") +
            " within the timeout: not called there, or stuck outside this group)";
  if (!stuck.empty()) text += ". Also waiting in it: " + join(stuck);
  if (!elsewhere.empty())
    text += ". Waiting in other collectives of the group (the ranks' calls do not match): " +
            join(elsewhere);
  return text;
}

std::string Watchdog::fail_for(const WorkEfccl& work, const std::string& efccl_error) {
  std::string reason = "efccl " + work.describe() + " failed: " + efccl_error;
  if (Clock::now() + report_lead(work.timeout()) >= work.deadline())
    reason += missing_ranks_report(work.getSequencenumber(), work.name());
  fail_group(reason);
  const std::string first = group_->failure();
  return first == reason ? reason : "efccl " + work.describe() + ": " + first;
}

void Watchdog::fail_group(const std::string& reason) {
  const bool first = group_->fail(reason);
  const std::string failure = group_->failure();
  std::deque<c10::intrusive_ptr<WorkEfccl>> works;
  std::vector<std::shared_ptr<Communicator>> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    works.swap(works_);
    comms = comms_;
  }
  for (const auto& w : works) {
    if (!w->gpu_finished()) w->fail(first ? reason : "efccl " + w->describe() + ": " + failure);
    w->release_stash();
  }
  for (const auto& c : comms) c->revoke();
  if (first && warnings_enabled()) {
    char host[256] = {0};
    (void)gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "%s:%d [%s] EFCCL WARN torch: %s\n", host, static_cast<int>(getpid()),
                 comms.empty() ? "-" : comms.front()->device().str().c_str(), reason.c_str());
  }
}

}  // namespace efccl::torch_backend
