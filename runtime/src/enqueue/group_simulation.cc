#include "enqueue/group_simulation.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "efccl/common/log.h"
#include "efccl/device/device_executor.h"
#include "enqueue/clique.h"
#include "enqueue/group.h"
#include "select/tuning.h"

namespace efccl::runtime {
namespace {

/// NCCL_SIM_INFO_INITIALIZER's values, for the checks.
const ncclSimInfo_t kInitialized = NCCL_SIM_INFO_INITIALIZER;

/// One launch's call as the host model takes it, with the GPU interpreter's tiles and slots
/// (the clique creates its executors with the default configuration).
host::ExecOptions launch_options(const ef::Program& program, uint64_t count, ef::DataType dtype,
                                 bool inplace) {
  const device::ExecutorConfig config;
  host::ExecOptions o;
  o.count = count;
  o.dtype = dtype;
  o.inplace = inplace;
  o.slot_bytes =
      config.slot_bytes != 0 ? config.slot_bytes : device::default_slot_bytes(program.protocol);
  o.connection_slots = config.connection_slots;
  return o;
}

/// `model` for a program whose rank i is communicator rank ranks[i].
host::LinkCostModel for_ranks(const host::LinkCostModel& model, const std::vector<int32_t>& ranks) {
  host::LinkCostModel m = model;
  m.rank_devices.clear();
  if (!model.rank_devices.empty())
    for (const int32_t r : ranks) m.rank_devices.push_back(model.device_of(r));
  return m;
}

StatusOr<double> predict(const ef::Program& program, const host::ExecOptions& options,
                         const host::LinkCostModel& model) {
  const host::TimingResult t = host::predict_time(program, options, model);
  if (!t.status)
    return Status::error("predicting program '" + program.name + "': " + t.status.message());
  return t.time_us;
}

/// The model for a clique: the defaults, with the ranks' GPUs when every rank is in this
/// process (device ordinals of other processes say nothing about which GPU they name).
host::LinkCostModel model_for(const Clique& clique) {
  host::LinkCostModel model;
  for (int32_t r = 0; r < clique.nranks(); ++r)
    if (!clique.is_local(r)) return model;
  for (int32_t r = 0; r < clique.nranks(); ++r) model.rank_devices.push_back(clique.device(r));
  return model;
}

/// The transfers of a group's send/receive calls on one clique, the k-th send from s to d
/// paired with the k-th receive on d from s (as the clique pairs them). Where the group has
/// only one side (the peer's call is in another thread's group), the other side's buffer is a
/// stand-in, laid out contiguously per rank (the usual layout), so that it packs into rounds
/// as a real one would.
std::vector<Transfer> transfers_of(const std::vector<const Call*>& p2p) {
  std::map<std::pair<int32_t, int32_t>, std::vector<const Call*>> sends, recvs;
  for (const Call* c : p2p)
    (c->kind == CallKind::kSend ? sends[{c->rank, c->peer}] : recvs[{c->peer, c->rank}])
        .push_back(c);
  std::set<std::pair<int32_t, int32_t>> pairs;
  for (const auto& [pair, list] : sends) pairs.insert(pair);
  for (const auto& [pair, list] : recvs) pairs.insert(pair);

  std::map<int32_t, uintptr_t> send_cursor, recv_cursor;
  const auto stand_in = [](std::map<int32_t, uintptr_t>& cursors, int32_t rank, uint64_t bytes) {
    auto [it, fresh] = cursors.try_emplace(rank, (uintptr_t{1} << 60) + (uintptr_t(rank) << 40));
    const uintptr_t at = it->second;
    it->second += bytes;
    return at;
  };
  std::vector<Transfer> transfers;
  for (const auto& pair : pairs) {
    const auto& s = sends[pair];
    const auto& r = recvs[pair];
    for (std::size_t k = 0; k < std::max(s.size(), r.size()); ++k) {
      const Call* send = k < s.size() ? s[k] : nullptr;
      const Call* recv = k < r.size() ? r[k] : nullptr;
      const Call* known = send != nullptr ? send : recv;
      Transfer t;
      t.sender = pair.first;
      t.receiver = pair.second;
      t.bytes = known->count * ef::size_of(known->dtype);
      t.src = send != nullptr
                  ? send->sendbuff
                  : reinterpret_cast<const void*>(stand_in(send_cursor, t.sender, t.bytes));
      t.dst = recv != nullptr ? recv->recvbuff
                              : reinterpret_cast<void*>(stand_in(recv_cursor, t.receiver, t.bytes));
      transfers.push_back(t);
    }
  }
  return transfers;
}

}  // namespace

ApiStatus check_sim_info(const ncclSimInfo_t* sim_info) {
  if (sim_info == nullptr) return ApiStatus::invalid_argument("simInfo is NULL");
  constexpr std::size_t kMagicEnd = offsetof(ncclSimInfo_t, magic) + sizeof(sim_info->magic);
  if (sim_info->size >= kMagicEnd && sim_info->magic == kInitialized.magic) return ApiStatus::ok();
  char found[96];
  if (sim_info->size < kMagicEnd)
    std::snprintf(found, sizeof(found), "size %zu, too small to hold the magic", sim_info->size);
  else
    std::snprintf(found, sizeof(found), "magic 0x%08x, expected 0x%08x", sim_info->magic,
                  kInitialized.magic);
  return ApiStatus::invalid_argument(
      std::string("simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER (") + found + ")");
}

StatusOr<double> estimate_collective(ProgramRegistry& registry, const CallShape& call,
                                     const host::LinkCostModel& model) {
  if (call.count == 0) return 0.0;  // the clique launches nothing
  StatusOr<Plan> plan = registry.select(call);
  if (!plan) return plan.status();
  return estimate_plan(*plan, call, model);
}

StatusOr<double> estimate_plan(const Plan& plan, const CallShape& call,
                               const host::LinkCostModel& model) {
  if (call.count == 0) return 0.0;
  double total = 0;
  for (const PlanPiece& piece : plan.pieces) {
    StatusOr<double> t =
        predict(*piece.program,
                launch_options(*piece.program, piece.count, call.dtype, call.inplace), model);
    if (!t) return t.status();
    total += *t;
  }
  return total;
}

StatusOr<double> estimate_transfers(
    std::vector<Transfer> transfers, const host::LinkCostModel& model,
    const std::function<ef::Protocol(uint64_t bytes)>& protocol_for) {
  double total = 0;
  std::vector<Transfer> between;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    if (t.sender == t.receiver) {
      // A copy to self is a cudaMemcpyAsync on the rank's device, not a launch.
      total += model.same_device.latency_us +
               static_cast<double>(t.bytes) / (model.same_device.bandwidth_gbps * 1e3);
      continue;
    }
    between.push_back(t);
  }
  if (between.empty()) return total;
  for (const P2pRound& round : plan_p2p_rounds(std::move(between), &p2p_channels, protocol_for)) {
    StatusOr<double> t = predict(
        round.program, launch_options(round.program, round.chunk_bytes, ef::DataType::kInt8, false),
        for_ranks(model, round.ranks));
    if (!t) return t.status();
    total += *t;
  }
  return total;
}

StatusOr<double> estimate_group(const std::vector<GroupedCall>& calls) {
  std::vector<Clique*> order;
  for (const GroupedCall& c : calls)
    if (std::find(order.begin(), order.end(), c.clique.get()) == order.end())
      order.push_back(c.clique.get());
  double total = 0;
  for (Clique* clique : order) {
    const host::LinkCostModel model = model_for(*clique);
    std::map<int32_t, std::vector<const Call*>> collectives;  // per rank, in call order
    std::vector<const Call*> p2p;
    for (const GroupedCall& g : calls) {
      if (g.clique.get() != clique) continue;
      const Call& c = g.call;
      if (is_p2p(c.kind))
        p2p.push_back(&c);
      else
        collectives[c.rank].push_back(&c);
    }
    // The k-th collective of every rank is one call; its shape from the first rank that has
    // one, its mode from the root's call (rooted) or that call (others), as the clique runs it.
    std::size_t sets = 0;
    for (const auto& [rank, list] : collectives) sets = std::max(sets, list.size());
    for (std::size_t k = 0; k < sets; ++k) {
      const Call* ref = nullptr;
      const Call* mode = nullptr;
      for (const auto& [rank, list] : collectives) {
        if (k >= list.size()) continue;
        if (ref == nullptr) ref = list[k];
        if (is_rooted(list[k]->kind) && list[k]->rank == list[k]->root) mode = list[k];
      }
      CallShape shape;
      shape.collective = collective_of(ref->kind);
      shape.nranks = clique->nranks();
      shape.root = is_rooted(ref->kind) ? ref->root : 0;
      shape.count = ref->count;
      shape.dtype = ref->dtype;
      shape.inplace = is_inplace(mode != nullptr ? *mode : *ref);
      // The clique's own registry: the plan its call would run.
      StatusOr<Plan> plan = clique->select(shape);
      StatusOr<double> t =
          plan ? estimate_plan(*plan, shape, model) : StatusOr<double>(plan.status());
      if (!t) return Status::error(describe(*ref) + ": " + t.status().message());
      total += *t;
    }
    if (!p2p.empty()) {
      StatusOr<double> t = estimate_transfers(transfers_of(p2p), model, [clique](uint64_t bytes) {
        return clique->p2p_protocol(bytes);
      });
      if (!t) return Status::error("send/receive: " + t.status().message());
      total += *t;
    }
  }
  return total;
}

}  // namespace efccl::runtime
