// From plans to programs (efccl/balance/plan_program.h).
#include "efccl/balance/plan_program.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "efccl/ef/validate.h"

namespace efccl::balance {

RouteResolver::RouteResolver(const topo::Topology& topology, std::vector<NodeIndex> rank_gpus,
                             RelayPolicy policy)
    : topology_(topology), policy_(policy), given_ranks_(rank_gpus.size()) {
  binding_.rank_gpus = std::move(rank_gpus);
}

int32_t RouteResolver::rank_on(NodeIndex gpu, bool add) {
  for (std::size_t r = 0; r < binding_.rank_gpus.size(); ++r)
    if (binding_.rank_gpus[r] == gpu) return static_cast<int32_t>(r);
  if (!add) return -1;
  binding_.rank_gpus.push_back(gpu);
  return static_cast<int32_t>(binding_.rank_gpus.size() - 1);
}

int32_t RouteResolver::slot_device_on(NodeIndex gpu) {
  auto& gpus = binding_.slot_device_gpus;
  for (std::size_t k = 0; k < gpus.size(); ++k)
    if (gpus[k] == gpu) return static_cast<int32_t>(k);
  gpus.push_back(gpu);
  return static_cast<int32_t>(gpus.size() - 1);
}

StatusOr<Route> RouteResolver::route(const Candidate& candidate) {
  switch (candidate.kind) {
    case CandidateKind::kLocal:
    case CandidateKind::kDirect:
      return Route::direct();
    case CandidateKind::kHost:
      return Route::host();
    case CandidateKind::kRelay:
    case CandidateKind::kRail:
      break;
    default:
      return Status::error("candidate '" + candidate.via + "' is of an unknown kind");
  }
  Route route;
  RouteHop open;  // the connection being built: it ends at the next forwarding rank
  for (NodeIndex gpu : candidate.relays) {
    if (gpu >= topology_.nodes().size() || topology_.node(gpu).kind != topo::NodeKind::kGpu)
      return Status::error("candidate '" + candidate.via + "' relays through node " +
                           std::to_string(gpu) + ", which is not a GPU of the topology");
    const bool slots_free = open.slots == ef::SlotLocation::kReceiver;
    bool slots_here = false;
    switch (policy_) {
      case RelayPolicy::kForward:
        break;
      case RelayPolicy::kForwardOrSlotDevice:
        slots_here = slots_free && rank_on(gpu, false) < 0;
        break;
      case RelayPolicy::kSlotDevice:
        slots_here = slots_free;
        break;
    }
    if (slots_here) {
      open.slots = ef::SlotLocation::kDevice;
      open.device = slot_device_on(gpu);
      continue;
    }
    open.to = rank_on(gpu, true);
    if (binding_.rank_gpus.size() > 4096)
      return Status::error("forwarding ranks would make more than 4096 program ranks");
    route.hops.push_back(open);
    open = RouteHop{};
  }
  if (binding_.slot_device_gpus.size() > static_cast<std::size_t>(ef::kMaxSlotDevices))
    return Status::error("relays would need more than 64 slot devices");
  route.hops.push_back(open);
  return route;
}

StatusOr<ChunkSplit> split_into_chunks(const PairPlan& pair, uint64_t chunk_bytes) {
  if (chunk_bytes == 0) return Status::error("the chunk size must be at least 1 byte");
  ChunkSplit split;
  const uint64_t chunks = pair.bytes / chunk_bytes;
  if (chunks > static_cast<uint64_t>(ef::kMaxChunks))
    return Status::error("ranks " + std::to_string(pair.src) + " -> " + std::to_string(pair.dst) +
                         ": " + std::to_string(pair.bytes) +
                         " bytes are more than 2^24 chunks of " + std::to_string(chunk_bytes));
  split.chunks = static_cast<int64_t>(chunks);
  split.tail_bytes = pair.bytes % chunk_bytes;
  uint64_t sum = 0;
  for (const PathShare& s : pair.paths) sum += s.bytes;
  if (sum != pair.bytes)
    return Status::error("ranks " + std::to_string(pair.src) + " -> " + std::to_string(pair.dst) +
                         ": the shares add up to " + std::to_string(sum) + " bytes, not " +
                         std::to_string(pair.bytes));
  std::vector<std::pair<uint64_t, std::size_t>> remainders;  // (remainder, share) for leftovers
  uint64_t given = 0;
  for (std::size_t i = 0; i < pair.paths.size(); ++i) {
    const PathShare& s = pair.paths[i];
    split.shares.push_back({s.candidate, static_cast<int64_t>(s.bytes / chunk_bytes)});
    given += s.bytes / chunk_bytes;
    remainders.emplace_back(s.bytes % chunk_bytes, i);
  }
  // Largest remainder first; ties to the lower candidate (shares are candidate ascending).
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < chunks && k < remainders.size(); ++k, ++given)
    ++split.shares[remainders[k].second].chunks;
  std::erase_if(split.shares, [](const ChunkShare& s) { return s.chunks == 0; });
  return split;
}

Plan direct_plan(const Plan& plan) {
  Plan direct = plan;
  std::fill(direct.link_bytes.begin(), direct.link_bytes.end(), 0.0);
  std::vector<PairPlan> pairs;  // listed one by one (the plan's may be listed by class)
  pairs.reserve(plan.pairs.size());
  for (const PairPlan& from : plan.pairs) {
    PairPlan& p = pairs.emplace_back(from);
    p.paths = {{0, p.bytes}};
    if (p.candidates == nullptr || p.candidates->empty()) continue;  // building it reports
    for (LinkIndex l : p.candidates->front().links)
      if (l < direct.link_bytes.size()) direct.link_bytes[l] += static_cast<double>(p.bytes);
  }
  direct.pairs = std::move(pairs);
  direct.max_load_us = plan.direct_max_load_us;
  return direct;
}

uint64_t exact_chunk_bytes(const Plan& plan) {
  uint64_t g = 0;
  for (const PairPlan& p : plan.pairs) {
    g = std::gcd(g, p.bytes);
    for (const PathShare& s : p.paths) g = std::gcd(g, s.bytes);
  }
  return g;
}

uint64_t demand_chunk_bytes(const Plan& plan, uint64_t max_chunks, uint64_t max_chunk_bytes) {
  const uint64_t exact = exact_chunk_bytes(plan);
  if (exact == 0) return 0;
  uint64_t pairs = 0, total = 0;  // the gcd of the pairs' bytes (a multiple of `exact`)
  for (const PairPlan& p : plan.pairs) {
    pairs = std::gcd(pairs, p.bytes);
    total += p.bytes;
  }
  const auto fits = [&](uint64_t chunk) { return total / chunk <= max_chunks; };
  if (exact > max_chunk_bytes) {
    // The largest divisor of `exact` up to the cap: exact too, and finer.
    uint64_t best = 1;
    for (uint64_t k = 1; k <= exact / k; ++k) {
      if (exact % k != 0) continue;
      if (k <= max_chunk_bytes) best = std::max(best, k);
      if (exact / k <= max_chunk_bytes) best = std::max(best, exact / k);
    }
    if (fits(best)) return best;
  }
  if (fits(exact)) return exact;
  // The smallest divisor k of pairs / exact with exact * k fitting: divisors come in pairs
  // (k, ratio / k), the small ones in ascending order and the large ones in descending.
  const uint64_t ratio = pairs / exact;
  std::vector<uint64_t> large;
  for (uint64_t k = 1; k <= ratio / k; ++k) {
    if (ratio % k != 0) continue;
    if (fits(exact * k)) return exact * k;
    large.push_back(ratio / k);
  }
  for (auto it = large.rbegin(); it != large.rend(); ++it)
    if (fits(exact * *it)) return exact * *it;
  return pairs;
}

StatusOr<DemandProgram> build_demand_program(const PathTable& table, const Plan& plan,
                                             uint64_t chunk_bytes,
                                             const DemandProgramOptions& options) {
  if (chunk_bytes == 0) return Status::error("the chunk size must be at least 1 byte");
  if (!(options.channel_gbps > 0) || options.max_channels_per_share < 1)
    return Status::error("channel_gbps and max_channels_per_share must be positive");
  const int32_t n = table.nranks();
  const auto at = [n](int32_t s, int32_t d) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(n) + static_cast<std::size_t>(d);
  };
  std::vector<int64_t> chunks(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0);
  for (const PairPlan& p : plan.pairs) {
    if (p.src < 0 || p.dst < 0 || p.src >= n || p.dst >= n)
      return Status::error("the plan's pair " + std::to_string(p.src) + " -> " +
                           std::to_string(p.dst) + " is outside the table's ranks");
    const std::string pair = "ranks " + std::to_string(p.src) + " -> " + std::to_string(p.dst);
    if (p.bytes % chunk_bytes != 0)
      return Status::error(pair + ": " + std::to_string(p.bytes) +
                           " bytes are not a whole number of " + std::to_string(chunk_bytes) +
                           "-byte chunks");
    chunks[at(p.src, p.dst)] = static_cast<int64_t>(p.bytes / chunk_bytes);
  }
  // Rank r's input: its sends to 0..n-1 in order; its output: its receives from 0..n-1.
  std::vector<int64_t> src_offset(chunks.size()), dst_offset(chunks.size());
  for (int32_t r = 0; r < n; ++r) {
    int64_t in = 0, out = 0;
    for (int32_t q = 0; q < n; ++q) {
      src_offset[at(r, q)] = in;
      dst_offset[at(q, r)] = out;
      in += chunks[at(r, q)];
      out += chunks[at(q, r)];
      if (in > ef::kMaxChunks || out > ef::kMaxChunks)
        return Status::error("rank " + std::to_string(r) + "'s buffers would hold more than 2^24 " +
                             "chunks of " + std::to_string(chunk_bytes) + " bytes");
    }
  }
  std::vector<NodeIndex> rank_gpus;
  for (int32_t r = 0; r < n; ++r) rank_gpus.push_back(table.rank_gpu(r));
  RouteResolver routes(table.topology(), std::move(rank_gpus), options.relays);
  std::vector<ProgramTransfer> transfers;
  for (const PairPlan& p : plan.pairs) {
    StatusOr<ChunkSplit> split = split_into_chunks(p, chunk_bytes);
    if (!split) return split.status();
    ProgramTransfer t;
    t.sender = p.src;
    t.receiver = p.dst;
    t.src_chunk = src_offset[at(p.src, p.dst)];
    t.dst_chunk = dst_offset[at(p.src, p.dst)];
    t.chunks = split->chunks;
    for (const ChunkShare& s : split->shares) {
      if (p.candidates == nullptr || s.candidate >= p.candidates->size())
        return Status::error("pair " + std::to_string(p.src) + " -> " + std::to_string(p.dst) +
                             ": a share on candidate " + std::to_string(s.candidate) + " of " +
                             std::to_string(p.candidates ? p.candidates->size() : 0) + " listed");
      const Candidate& c = (*p.candidates)[s.candidate];
      StatusOr<Route> route = routes.route(c);
      if (!route) return route.status();
      const double wanted = std::ceil(c.gbps / options.channel_gbps);
      const int32_t channels =
          std::isfinite(wanted) && wanted > 1
              ? static_cast<int32_t>(std::min<double>(wanted, options.max_channels_per_share))
              : 1;
      t.shares.push_back({std::move(*route), s.chunks, channels});
    }
    transfers.push_back(std::move(t));
  }
  ProgramBuildOptions build;
  build.nranks = routes.nranks();
  build.slot_devices = routes.slot_devices();
  build.protocol = options.protocol;
  build.name = "balanced alltoallv";
  StatusOr<ef::Program> program = build_program(transfers, build);
  if (!program) return program.status();
  DemandProgram out;
  out.program = std::move(*program);
  out.binding = routes.binding();
  out.chunk_bytes = chunk_bytes;
  return out;
}

}  // namespace efccl::balance
