#include "comm/grouped_init.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/settings.h"
#include "comm/rendezvous.h"

namespace efccl::runtime {
namespace {

struct GroupedInits {
  std::vector<std::shared_ptr<Rendezvous>> inits;  ///< deduplicated
  std::vector<DeferredRegroup> regroups;           ///< in call order
};

GroupedInits& state() {
  thread_local GroupedInits s;
  return s;
}

}  // namespace

void defer_init(std::shared_ptr<Rendezvous> rendezvous) {
  GroupedInits& g = state();
  if (std::find(g.inits.begin(), g.inits.end(), rendezvous) == g.inits.end())
    g.inits.push_back(std::move(rendezvous));
}

void defer_regroup(DeferredRegroup regroup) { state().regroups.push_back(std::move(regroup)); }

ApiStatus finish_grouped_inits(const ApiStatus& group_failure) {
  GroupedInits& g = state();
  std::vector<std::shared_ptr<Rendezvous>> inits = std::move(g.inits);
  g.inits.clear();
  std::vector<DeferredRegroup> regroups = std::move(g.regroups);
  g.regroups.clear();
  if (!group_failure) {
    for (const auto& r : inits) cancel_rendezvous(r, group_failure);
    return group_failure;
  }
  ApiStatus first;
  // Every split offers its color before any waits for the others' (one thread may hold all).
  std::vector<bool> offered(regroups.size(), false);
  for (std::size_t i = 0; i < regroups.size(); ++i) {
    ApiStatus s = regroups[i].offer();
    offered[i] = s.is_ok();
    if (!s && first) first = s;
  }
  // Splits across processes all at once, each on its own thread (their exchanges may need
  // each other: this thread can hold several ranks of one parent); the others here.
  std::vector<ApiStatus> finished(regroups.size());
  std::vector<std::shared_ptr<Rendezvous>> joins(regroups.size());
  const auto finish = [&regroups, &finished, &joins](std::size_t i) {
    try {
      finished[i] = regroups[i].finish(&joins[i]);
    } catch (const std::exception& e) {
      finished[i] =
          ApiStatus::system(std::string("ncclGroupEnd: a grouped split failed: ") + e.what());
    }
  };
  {
    std::vector<std::jthread> workers;  // joined on every way out of this block
    workers.reserve(regroups.size());
    for (std::size_t i = 0; i < regroups.size(); ++i) {
      if (!offered[i] || !regroups[i].concurrent) continue;
      try {
        workers.emplace_back(finish, i);
      } catch (const std::system_error& e) {
        finished[i] = ApiStatus::system(
            std::string("ncclGroupEnd: could not start a thread for a grouped split: ") + e.what());
      }
    }
    for (std::size_t i = 0; i < regroups.size(); ++i)
      if (offered[i] && !regroups[i].concurrent) finish(i);
  }
  for (std::size_t i = 0; i < regroups.size(); ++i) {
    if (!offered[i]) continue;
    if (!finished[i] && first) first = finished[i];
    if (joins[i] != nullptr && std::find(inits.begin(), inits.end(), joins[i]) == inits.end())
      inits.push_back(std::move(joins[i]));
  }
  if (!inits.empty()) {
    const auto timeout = init_timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& r : inits) {
      ApiStatus s = complete_rendezvous(r, deadline, timeout);
      if (!s && first) first = s;
    }
  }
  return first;
}

}  // namespace efccl::runtime
