#include "comm/regroup.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "base/device_guard.h"
#include "base/pointer_text.h"
#include "base/settings.h"
#include "comm/comm_config.h"
#include "comm/comm_init.h"
#include "comm/communicator.h"
#include "comm/grouped_init.h"
#include "comm/in_process_meeting.h"
#include "efccl/common/hash.h"
#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"
#include "enqueue/group.h"

namespace efccl::runtime {
namespace {

/// One rank's ncclCommSplit / ncclCommShrink, with what it needs from the parent copied out so
/// that a grouped one can finish at ncclGroupEnd. The `participants` (ascending parent ranks,
/// the caller among them) exchange (color, key); ranks of the caller's color, ordered by (key,
/// parent rank), form a new communicator, initialized like ncclCommInitRank with an id made by
/// its new rank 0 (multi-process: shared through the parent's bootstrap; single process: an
/// in-process id no root serves), on the parent's GPU.
struct Regroup {
  const char* fn = "";
  std::shared_ptr<Clique> clique;
  std::shared_ptr<net::Bootstrap> bootstrap;  ///< multi-process parents only
  std::string parent_name;                    ///< for the log
  int rank = 0;
  int device = 0;
  bool blocking = true;
  std::vector<int> participants;
  int color = 0;
  int key = 0;
  uint64_t seq = 0;  ///< which regroup of these participants (every participant counts alike)
  uint64_t set_hash = 0;
  uint64_t tag = 0;  ///< the exchange's tag
  /// The thread that called ncclCommSplit/Shrink (the one that ends its group): the child's
  /// driver, also when the split finishes on a helper thread.
  uint64_t driver = 0;
  ncclComm_t* newcomm = nullptr;
  bool has_config = false;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;  ///< a copy of the caller's (has_config)
};

/// Checks `config` and copies what the split needs from `parent` (counts the regroup).
ApiStatus start_regroup(const char* fn, ncclComm_t parent, std::vector<int> participants, int color,
                        int key, ncclComm_t* newcomm, const ncclConfig_t* config, Regroup* out) {
  Regroup& g = *out;
  if (config != nullptr) {
    CommConfig checked;
    if (ApiStatus s = parse_config(config, &checked); !s) return s;
    std::size_t size = 0;
    std::memcpy(&size, config, sizeof(size));
    std::memcpy(static_cast<void*>(&g.config), config, std::min(size, sizeof(ncclConfig_t)));
    g.has_config = true;
  }
  g.fn = fn;
  g.clique = parent->clique;
  g.bootstrap = parent->bootstrap;
  g.parent_name = pointer_text(parent);
  g.rank = parent->rank;
  g.device = parent->device;
  g.blocking = parent->blocking;
  g.participants = std::move(participants);
  g.color = color;
  g.key = key;
  g.newcomm = newcomm;
  g.driver = this_thread_token();
  {
    std::lock_guard<std::mutex> lock(parent->ops_mu);
    g.seq = parent->regroups[g.participants]++;
  }
  g.set_hash = efccl::kFnv1aOffset;
  for (int p : g.participants) g.set_hash = efccl::fnv1a_u64(static_cast<uint64_t>(p), g.set_hash);
  // Tags of the parent's bootstrap for its regroups (executors use other namespaces).
  g.tag = (uint64_t{3} << 62) | ((g.set_hash & 0xffffffffull) << 24) | ((g.seq & 0x7fffff) << 1);
  return ApiStatus::ok();
}

std::string color_and_key(const Regroup& g) {
  const int32_t ck[2] = {g.color, g.key};
  return std::string(reinterpret_cast<const char*>(ck), sizeof(ck));
}

/// The participants' contributions under tag `tag` (outside a group: waits for all).
StatusOr<std::vector<std::string>> gather(const Regroup& g, uint64_t tag, std::string mine,
                                          std::chrono::steady_clock::time_point deadline) {
  if (g.bootstrap != nullptr)
    return g.bootstrap->allgather(g.participants, tag, std::move(mine), deadline, nullptr);
  return meet_in_process(g.clique.get(), tag, g.participants, g.rank, std::move(mine), deadline);
}

/// With every participant's (color, key): the new communicator of this rank, if any.
ApiStatus finish_regroup(const Regroup& g, const std::vector<std::string>& entries,
                         std::chrono::steady_clock::time_point deadline,
                         std::shared_ptr<Rendezvous>* joined) {
  const char* fn = g.fn;
  struct Member {
    int32_t key;
    int parent_rank;
  };
  std::vector<Member> group;
  for (std::size_t i = 0; i < g.participants.size(); ++i) {
    int32_t ck[2] = {0, 0};
    if (entries[i].size() != sizeof(ck))
      return ApiStatus::system(std::string(fn) + ": rank " + std::to_string(g.participants[i]) +
                               " sent a malformed color");
    std::memcpy(ck, entries[i].data(), sizeof(ck));
    if (ck[0] == g.color && g.color != NCCL_SPLIT_NOCOLOR)
      group.push_back({ck[1], g.participants[i]});
  }
  std::sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.parent_rank < b.parent_rank;
  });
  int new_rank = -1;
  for (std::size_t i = 0; i < group.size(); ++i)
    if (group[i].parent_rank == g.rank) new_rank = static_cast<int>(i);

  // The new communicator's id: made by its rank 0, or derived in-process.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (g.bootstrap != nullptr) {
    std::string offer;
    if (new_rank == 0) {
      net::UniqueId made;
      if (Status s = net::create_unique_id(&made, init_timeout()); !s)
        return ApiStatus::system(std::string(fn) + ": " + s.message());
      static_assert(sizeof(made) == sizeof(id));
      std::memcpy(id.internal, made.internal, sizeof(id.internal));
      offer.assign(id.internal, sizeof(id.internal));
    }
    auto offers = gather(g, g.tag | 1, offer, deadline);
    if (!offers)
      return ApiStatus::system(std::string(fn) +
                               ": the ranks could not exchange ids: " + offers.status().message());
    if (new_rank >= 0) {
      const auto at =
          std::lower_bound(g.participants.begin(), g.participants.end(), group[0].parent_rank) -
          g.participants.begin();
      const std::string& theirs = (*offers)[static_cast<std::size_t>(at)];
      if (theirs.size() != sizeof(id.internal))
        return ApiStatus::system(std::string(fn) + ": the new communicator's rank 0 sent no id");
      std::memcpy(id.internal, theirs.data(), sizeof(id.internal));
    }
  } else if (new_rank >= 0) {
    const auto clique = reinterpret_cast<uintptr_t>(g.clique.get());
    std::memcpy(id.internal, "efccl-split", 11);
    std::memcpy(id.internal + 16, &clique, sizeof(clique));
    std::memcpy(id.internal + 24, &g.seq, sizeof(g.seq));
    std::memcpy(id.internal + 32, &g.color, sizeof(g.color));
    std::memcpy(id.internal + 40, &g.set_hash, sizeof(g.set_hash));
  }
  if (new_rank < 0) return ApiStatus::ok();  // NCCL_SPLIT_NOCOLOR (or excluded): no communicator

  ncclConfig_t inherited = NCCL_CONFIG_INITIALIZER;
  inherited.blocking = g.blocking ? 1 : 0;
  EFCCL_INFO(efccl::kLogInit, g.device,
             std::string(fn) + ": comm " + g.parent_name + " rank " + std::to_string(g.rank) +
                 " color " + std::to_string(g.color) + " key " + std::to_string(g.key) +
                 " -> rank " + std::to_string(new_rank) + " of " + std::to_string(group.size()));
  // The child lives on the parent's GPU, whichever device the calling thread has current.
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(g.device); e != cudaSuccess)
    return ApiStatus::cuda(std::string(fn) + ": cudaSetDevice(" + std::to_string(g.device) +
                           "): " + cudaGetErrorString(e));
  return init_rank(g.newcomm, static_cast<int>(group.size()), id, new_rank,
                   g.has_config ? &g.config : &inherited, g.bootstrap == nullptr, joined, g.driver);
}

/// Every participant's color (collected after offer_in_process when `offered`, else exchanged
/// now), then the new communicator, within EFCCL_INIT_TIMEOUT_MS.
ApiStatus exchange_and_finish(const Regroup& g, bool offered, std::shared_ptr<Rendezvous>* joined) {
  const auto deadline = std::chrono::steady_clock::now() + init_timeout();
  auto entries = offered ? collect_in_process(g.clique.get(), g.tag, g.participants, deadline)
                         : gather(g, g.tag, color_and_key(g), deadline);
  if (!entries)
    return ApiStatus::system(
        std::string(g.fn) + ": the ranks could not exchange colors: " + entries.status().message());
  return finish_regroup(g, *entries, deadline, joined);
}

}  // namespace

/// ncclCommSplit / ncclCommShrink of rank `parent`: at once outside a group; inside one, left
/// to the outermost ncclGroupEnd (group.h).
ApiStatus regroup(const char* fn, ncclComm_t parent, std::vector<int> participants, int color,
                  int key, ncclComm_t* newcomm, const ncclConfig_t* config) {
  const bool grouped = in_group();
  auto g = std::make_shared<Regroup>();
  if (ApiStatus s =
          start_regroup(fn, parent, std::move(participants), color, key, newcomm, config, g.get());
      !s)
    return s;
  if (!grouped) return exchange_and_finish(*g, false, nullptr);
  // Grouped: finished at the outermost ncclGroupEnd. An in-process parent offers its color
  // first and collects the others' there; a parent spanning processes exchanges colors over
  // its bootstrap, on a thread of its own alongside the other grouped splits (this thread may
  // hold several ranks of the parent, whose exchanges need each other).
  const bool across = g->bootstrap != nullptr;
  DeferredRegroup deferred;
  deferred.concurrent = across;
  deferred.offer = [g, across] {
    if (!across)
      offer_in_process(g->clique.get(), g->tag, g->participants, g->rank, color_and_key(*g));
    return ApiStatus::ok();
  };
  deferred.finish = [g, across](std::shared_ptr<Rendezvous>* joined) {
    return exchange_and_finish(*g, !across, joined);
  };
  defer_regroup(std::move(deferred));
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
