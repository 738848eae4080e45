#include "cross_process.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace efccl::device {

XprocPlan plan_xproc(const ef::Program& program, const std::vector<int>& local_ranks,
                     const std::vector<int64_t>& location, const std::vector<std::string>& gpus,
                     const std::vector<ConnectionPlan>& connections, std::string* why) {
  XprocPlan plan;
  if (local_ranks.empty() || gpus.size() != location.size()) return plan;
  const std::string& gpu = gpus[static_cast<std::size_t>(local_ranks.front())];
  const int64_t mine = location[static_cast<std::size_t>(local_ranks.front())];
  if (gpu.empty()) return plan;
  // Every location on the GPU with its ranks (the slots: locations in ascending order).
  std::map<int64_t, std::vector<int>> on_gpu;
  for (std::size_t r = 0; r < gpus.size(); ++r)
    if (gpus[r] == gpu) on_gpu[location[r]].push_back(static_cast<int>(r));
  if (on_gpu.size() < 2) return plan;  // no other process on the GPU
  if (program.protocol != ef::Protocol::kSimple) return plan;  // direct transfers are Simple's
  if (on_gpu.size() > static_cast<std::size_t>(kMaxXprocSlots)) {
    *why = std::to_string(on_gpu.size()) + " processes share the GPU (at most " +
           std::to_string(kMaxXprocSlots) + " meet)";
    return plan;
  }
  for (const auto& [loc, ranks] : on_gpu)
    if (ranks.size() > static_cast<std::size_t>(kMaxXprocLocalRanks)) {
      *why = "a process runs " + std::to_string(ranks.size()) + " ranks on the GPU (at most " +
             std::to_string(kMaxXprocLocalRanks) + ")";
      return plan;
    }
  // The locations the local ranks have connections with (symmetric: both sides see them).
  std::set<int64_t> met;
  for (const ConnectionPlan& c : connections) {
    if (c.network || c.placed()) continue;
    const int64_t a = location[static_cast<std::size_t>(c.sender)];
    const int64_t b = location[static_cast<std::size_t>(c.receiver)];
    if (a == mine && b != mine && on_gpu.count(b)) met.insert(b);
    if (b == mine && a != mine && on_gpu.count(a)) met.insert(a);
  }
  if (met.empty()) return plan;
  // Every location decides from every other's publication whether the call runs direct (each
  // publishes one verdict for all readers), so all of them must meet: a full mesh.
  for (const auto& [a, ranks_a] : on_gpu)
    for (const auto& [b, ranks_b] : on_gpu) {
      if (a >= b) continue;
      bool joined = false;
      for (const ConnectionPlan& c : connections) {
        if (c.network || c.placed()) continue;
        const int64_t s = location[static_cast<std::size_t>(c.sender)];
        const int64_t t = location[static_cast<std::size_t>(c.receiver)];
        if ((s == a && t == b) || (s == b && t == a)) {
          joined = true;
          break;
        }
      }
      if (!joined) {
        *why = "the program joins not every two of the " + std::to_string(on_gpu.size()) +
               " processes on the GPU by a connection (their launches could not all meet)";
        return plan;
      }
    }
  uint32_t slot = 0;
  for (const auto& [loc, ranks] : on_gpu) {
    if (loc == mine) plan.my_slot = slot;
    if (met.count(loc)) {
      plan.locations.push_back(loc);
      plan.slots.push_back(slot);
      plan.rank_begin.push_back(static_cast<uint32_t>(plan.remote_ranks.size()));
      plan.rank_count.push_back(static_cast<uint32_t>(ranks.size()));
      plan.reader.push_back(ranks.front());
      for (int r : ranks) plan.remote_ranks.push_back(r);
    }
    ++slot;
  }
  plan.enabled = true;
  return plan;
}

void publish_xproc(
    const XprocPlan& plan, const std::vector<int>& local_ranks, uint32_t ctas,
    const std::vector<std::vector<XprocBuffer>>& ranges, int32_t direct_shift,
    const std::function<std::optional<uint64_t>(int, const void*, std::size_t, int)>& translate,
    XprocParams* out) {
  *out = XprocParams{};
  out->active = 1;
  out->nlocations = static_cast<uint32_t>(plan.locations.size());
  out->my_slot = plan.my_slot;
  out->my_ctas = ctas;
  bool valid = direct_shift != kDirectOff;
  out->mine = plan.mine;
  for (std::size_t m = 0; m < plan.locations.size(); ++m) {
    out->remote[m] = plan.remote[m];
    out->remote_slot[m] = plan.slots[m];
    out->remote_rank_begin[m] = plan.rank_begin[m];
    out->remote_rank_count[m] = plan.rank_count[m];
    XprocPublication& pub = out->published[m];
    pub.direct_shift = direct_shift;
    for (std::size_t li = 0; li < local_ranks.size() && valid; ++li)
      for (const XprocBuffer& b : ranges[li]) {
        const std::optional<uint64_t> there =
            translate ? translate(local_ranks[li], b.address, b.bytes, plan.reader[m])
                      : std::nullopt;
        if (!there) {
          valid = false;
          break;
        }
        pub.buffers[li][b.kind] = reinterpret_cast<char*>(*there);
      }
  }
  // One verdict for every reader: every location then decides from the same verdicts.
  for (std::size_t m = 0; m < plan.locations.size(); ++m) {
    XprocPublication& pub = out->published[m];
    pub.valid = valid ? 1 : 0;
    if (!valid)
      for (auto& rank : pub.buffers)
        for (char*& p : rank) p = nullptr;
  }
}

}  // namespace efccl::device
