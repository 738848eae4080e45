#include "comm/in_process_meeting.h"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

namespace efccl::runtime {
namespace {

struct Meeting {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::string> contributions;
  int left = 0;  ///< participants that have not yet taken the result
};

std::mutex& meetings_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<const void*, uint64_t>, std::shared_ptr<Meeting>>& meetings() {
  static auto* m = new std::map<std::pair<const void*, uint64_t>, std::shared_ptr<Meeting>>();
  return *m;
}

}  // namespace

void offer_in_process(const void* parent, uint64_t seq, const std::vector<int>& participants,
                      int rank, std::string mine) {
  std::shared_ptr<Meeting> m;
  {
    std::lock_guard<std::mutex> lock(meetings_mutex());
    auto& slot = meetings()[std::make_pair(parent, seq)];
    if (slot == nullptr) {
      slot = std::make_shared<Meeting>();
      slot->left = static_cast<int>(participants.size());
    }
    m = slot;
  }
  std::lock_guard<std::mutex> lock(m->mu);
  m->contributions[rank] = std::move(mine);
  m->cv.notify_all();
}

StatusOr<std::vector<std::string>> collect_in_process(
    const void* parent, uint64_t seq, const std::vector<int>& participants,
    std::chrono::steady_clock::time_point deadline) {
  const auto key = std::make_pair(parent, seq);
  std::shared_ptr<Meeting> m;
  {
    std::lock_guard<std::mutex> lock(meetings_mutex());
    auto it = meetings().find(key);
    if (it != meetings().end()) m = it->second;
  }
  if (m == nullptr)
    return Status::error("another rank gave up waiting for this one (EFCCL_INIT_TIMEOUT_MS)");
  std::unique_lock<std::mutex> lock(m->mu);
  const bool all = m->cv.wait_until(lock, deadline,
                                    [&] { return m->contributions.size() == participants.size(); });
  std::vector<std::string> out;
  if (all)
    for (int p : participants) out.push_back(m->contributions[p]);
  const std::size_t arrived = m->contributions.size();
  if (--m->left == 0 || !all) {
    lock.unlock();
    std::lock_guard<std::mutex> registry_lock(meetings_mutex());
    auto it = meetings().find(key);
    if (it != meetings().end() && it->second == m) meetings().erase(it);
  }
  if (!all)
    return Status::error("only " + std::to_string(arrived) + " of " +
                         std::to_string(participants.size()) +
                         " ranks called it in time (EFCCL_INIT_TIMEOUT_MS); in a single-process "
                         "communicator every rank must call it, each from its own thread or "
                         "several from one thread inside ncclGroupStart/ncclGroupEnd");
  return out;
}

StatusOr<std::vector<std::string>> meet_in_process(const void* parent, uint64_t seq,
                                                   const std::vector<int>& participants, int rank,
                                                   std::string mine,
                                                   std::chrono::steady_clock::time_point deadline) {
  offer_in_process(parent, seq, participants, rank, std::move(mine));
  return collect_in_process(parent, seq, participants, deadline);
}

}  // namespace efccl::runtime
