#include "launch/p2p_runner.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "efccl/common/log.h"
#include "select/selection_observer.h"
#include "select/tuning.h"

namespace efccl::runtime {
namespace {

/// Pair plans kept before the table is cleared (their executors stay cached).
constexpr std::size_t kMaxCachedPairPlans = 4096;

/// One direction of a group's transfers: the sends of its sender and the receives of its
/// receiver, in call order (only those of this process's ranks).
struct Direction {
  std::vector<const Call*> sends, recvs;
};
using DirectionKey = std::pair<int32_t, int32_t>;  ///< (sender, receiver)

/// A round ready to launch: its plan, the buffers of its program ranks, and (across
/// processes) where its prepared executor is kept.
struct ReadyRound {
  const P2pRound* round = nullptr;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  ExchangeName exchange;
  device::DeviceExecutor** prepared = nullptr;  ///< null: look it up in the store
};

ApiStatus cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(what + ": " + cudaGetErrorString(e));
}

/// Matches the calls per direction and checks what this process can check: one stream per
/// rank, and equal counts and sizes where both ends are its ranks. `*bytes` receives, per
/// direction, the size of each message (known from whichever end is here).
ApiStatus match(const LaunchContext& ctx, const std::vector<Call>& calls,
                std::map<DirectionKey, Direction>* directions,
                std::map<DirectionKey, std::vector<uint64_t>>* bytes,
                std::map<int32_t, cudaStream_t>* stream_of) {
  for (const Call& c : calls) {
    auto [it, fresh] = stream_of->emplace(c.rank, c.stream);
    if (!fresh && it->second != c.stream)
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(c.rank) +
          " uses different streams for its sends/receives "
          "of one group; efccl needs one stream per rank and group for point-to-point calls");
    if (c.kind == CallKind::kSend)
      (*directions)[{c.rank, c.peer}].sends.push_back(&c);
    else
      (*directions)[{c.peer, c.rank}].recvs.push_back(&c);
  }
  for (const auto& [dir, d] : *directions) {
    const auto [from, to] = dir;
    const bool both = ctx.is_local(from) && ctx.is_local(to);
    if (both && d.sends.size() != d.recvs.size())
      return ApiStatus::invalid_usage("rank " + std::to_string(from) + " posts " +
                                      std::to_string(d.sends.size()) + " ncclSend to rank " +
                                      std::to_string(to) + " but rank " + std::to_string(to) +
                                      " posts " + std::to_string(d.recvs.size()) +
                                      " ncclRecv from rank " + std::to_string(from) +
                                      " in this group (sends and receives between ranks of one "
                                      "process are matched within one group)");
    const auto& known = ctx.is_local(from) ? d.sends : d.recvs;
    std::vector<uint64_t>& sizes = (*bytes)[dir];
    for (std::size_t k = 0; k < known.size(); ++k) {
      const uint64_t b = call_bytes(*known[k]);
      if (both && call_bytes(*d.recvs[k]) != b)
        return ApiStatus::invalid_usage(
            "send #" + std::to_string(k) + " from rank " + std::to_string(from) + " to rank " +
            std::to_string(to) + " has " + std::to_string(b) + " bytes (" + describe(*d.sends[k]) +
            ") but the matching receive has " + std::to_string(call_bytes(*d.recvs[k])) + " (" +
            describe(*d.recvs[k]) + ")");
      sizes.push_back(b);
    }
  }
  return ApiStatus::ok();
}

/// Sends to self: a copy on the rank's stream.
ApiStatus copy_to_self(const LaunchContext& ctx, const std::map<DirectionKey, Direction>& dirs,
                       const std::map<int32_t, cudaStream_t>& stream_of, std::size_t* copies) {
  for (const auto& [dir, d] : dirs) {
    if (dir.first != dir.second) continue;
    for (std::size_t k = 0; k < d.sends.size(); ++k) {
      const uint64_t b = call_bytes(*d.sends[k]);
      if (b == 0) continue;
      cudaSetDevice(ctx.device(dir.first));
      if (ApiStatus s =
              cuda_status(cudaMemcpyAsync(d.recvs[k]->recvbuff, d.sends[k]->sendbuff, b,
                                          cudaMemcpyDeviceToDevice, stream_of.at(dir.first)),
                          "ncclSend/ncclRecv to self on rank " + std::to_string(dir.first));
          !s)
        return s;
      ++*copies;
    }
  }
  return ApiStatus::ok();
}

/// Adds the run of one balanced transfer: `src` on its sender, `dst` on its receiver (null
/// where the rank is another process's).
ApiStatus add_balanced(LaunchContext& ctx, const BalancedTransfer& t, const void* src, void* dst,
                       const std::map<int32_t, cudaStream_t>& stream_of, bool capturing,
                       const ExchangeName& exchange, device::DeviceExecutor** cached,
                       LaunchBatch& batch) {
  device::DeviceExecutor* executor = cached != nullptr ? *cached : nullptr;
  if (executor == nullptr) {
    device::ExecutorConfig config;
    config.slot_bytes = t.slot_bytes;
    config.slot_devices = ctx.balancer->slot_devices(t, ctx.is_local(t.ranks[1]));
    if (ApiStatus s = ctx.executors->get(t.program, t.signature, t.ranks, capturing, t.chunk_bytes,
                                         ef::DataType::kInt8, exchange, batch, &executor, config);
        !s)
      return s;
    if (cached != nullptr) *cached = executor;
  }
  Launch l;
  l.executor = executor;
  l.args.count = t.chunk_bytes;  // nchunksperloop 1: one chunk of chunk_bytes int8
  l.args.dtype = ef::DataType::kInt8;
  l.args.op = ef::RedOp::kSum;
  l.args.inplace = false;
  l.args.timeout = ctx.timeout;
  l.args.direct = ctx.direct;
  l.args.inputs.assign(t.ranks.size(), nullptr);
  l.args.outputs.assign(t.ranks.size(), nullptr);
  l.args.inputs[0] = src;
  l.args.outputs[1] = dst;
  for (int32_t rank : t.ranks) {
    if (!ctx.is_local(rank)) continue;
    l.ranks.push_back(rank);
    l.rank_streams.push_back(stream_of.at(rank));
  }
  return batch.add(std::move(l), capturing);
}

/// One stream per device among `ranks` (statistics' events).
std::vector<std::pair<int, cudaStream_t>> device_streams(
    const LaunchContext& ctx, const std::map<int32_t, cudaStream_t>& stream_of) {
  std::vector<std::pair<int, cudaStream_t>> out;
  for (const auto& [rank, stream] : stream_of) {
    const int device = ctx.device(rank);
    if (std::none_of(out.begin(), out.end(), [&](const auto& e) { return e.first == device; }))
      out.push_back({device, stream});
  }
  return out;
}

/// A balancing failure is not the call's: the transfers run on their default paths.
void balance_failed(const LaunchContext& ctx, const Status& s) {
  EFCCL_INFO(kLogBalance, -1, "balancing skipped: " + s.message());
}

}  // namespace

ApiStatus run_send_recv(LaunchContext& ctx, const std::vector<Call>& calls, LaunchBatch& batch,
                        uint64_t alltoall_bytes) {
  std::map<DirectionKey, Direction> directions;
  std::map<DirectionKey, std::vector<uint64_t>> bytes;
  std::map<int32_t, cudaStream_t> stream_of;
  if (ApiStatus s = match(ctx, calls, &directions, &bytes, &stream_of); !s) return s;

  std::vector<cudaStream_t> streams;
  for (const auto& [rank, stream] : stream_of) streams.push_back(stream);
  StatusOr<bool> capturing = any_capturing(streams);
  if (!capturing) return ApiStatus::cuda(capturing.status().message());

  std::size_t to_self = 0;
  if (ApiStatus s = copy_to_self(ctx, directions, stream_of, &to_self); !s) return s;

  const auto protocol_for = [&ctx](uint64_t b) { return ctx.registry->p2p_protocol(b); };
  std::vector<P2pRound> local_rounds;  // one process: the group's rounds
  std::vector<ReadyRound> ready;
  std::size_t transfers = 0;
  std::size_t balanced = 0;
  const bool balancing = ctx.balancer != nullptr && ctx.balancer->active();
  if (ctx.processes == nullptr) {
    std::vector<Transfer> list;
    for (const auto& [dir, d] : directions) {
      if (dir.first == dir.second) continue;
      for (std::size_t k = 0; k < d.sends.size(); ++k)
        if (const uint64_t b = call_bytes(*d.sends[k]); b > 0)
          list.push_back({dir.first, dir.second, d.sends[k]->sendbuff, d.recvs[k]->recvbuff, b});
    }
    transfers = list.size();
    if (balancing && !list.empty()) {
      std::vector<Balancer::TransferKey> keys;
      for (const Transfer& t : list) keys.push_back({t.sender, t.receiver, t.bytes});
      StatusOr<const Balancer::Prepared*> prepared =
          ctx.balancer->prepare_group(keys, alltoall_bytes > 0 ? "alltoall" : "p2p");
      if (!prepared) balance_failed(ctx, prepared.status());
      if (prepared && (*prepared)->plan >= 0) {
        ctx.balancer->stats().begin_run((*prepared)->plan, device_streams(ctx, stream_of),
                                        *capturing);
        std::vector<Transfer> rest;
        for (std::size_t i = 0; i < list.size(); ++i) {
          const BalancedTransfer* t = (*prepared)->transfers[i].get();
          if (t == nullptr) {
            rest.push_back(list[i]);
            continue;
          }
          if (ApiStatus s = add_balanced(ctx, *t, list[i].src, list[i].dst, stream_of, *capturing,
                                         ExchangeName{}, nullptr, batch);
              !s)
            return s;
          ++balanced;
          if (list[i].bytes > t->main_bytes)  // the tail: on the default path
            rest.push_back({list[i].sender, list[i].receiver,
                            static_cast<const char*>(list[i].src) + t->main_bytes,
                            static_cast<char*>(list[i].dst) + t->main_bytes,
                            list[i].bytes - t->main_bytes});
        }
        list = std::move(rest);
      }
    }
    // Programs are built only for signatures without a prepared executor: a group repeated
    // with the same layout (every training step) skips building them.
    local_rounds = plan_p2p_rounds(std::move(list), &p2p_channels, protocol_for,
                                   /*build_programs=*/false);
    for (const P2pRound& round : local_rounds)
      ready.push_back({&round, round.inputs, round.outputs, ExchangeName{}, nullptr});
  } else {
    // Plans are kept across calls; the table is emptied before a call, never during one (the
    // rounds below point into it until they are launched).
    if (ctx.pair_rounds.size() >= kMaxCachedPairPlans) ctx.pair_rounds.clear();
    // Pairs in one global order; each side of a message is known here from its local end.
    std::map<DirectionKey, std::size_t> messages;
    for (const auto& [dir, sizes] : bytes)
      if (dir.first != dir.second) {
        auto& n = messages[{std::min(dir.first, dir.second), std::max(dir.first, dir.second)}];
        n = std::max(n, sizes.size());
      }
    for (const auto& [pair, count] : messages) {
      const auto [a, b] = pair;
      const std::vector<uint64_t>& ab = bytes[{a, b}];
      const std::vector<uint64_t>& ba = bytes[{b, a}];
      const Direction& dab = directions[{a, b}];
      const Direction& dba = directions[{b, a}];
      for (std::size_t k = 0; k < count; ++k) {
        const uint64_t bytes_ab = k < ab.size() ? ab[k] : 0, bytes_ba = k < ba.size() ? ba[k] : 0;
        if (bytes_ab == 0 && bytes_ba == 0) continue;
        transfers += (bytes_ab > 0) + (bytes_ba > 0);
        // The pair's four buffers (a's send, b's receive, b's send, a's receive); those of
        // the other process's ranks stay null.
        void* slot[4] = {
            bytes_ab > 0 && ctx.is_local(a) ? const_cast<void*>(dab.sends[k]->sendbuff) : nullptr,
            bytes_ab > 0 && ctx.is_local(b) ? dab.recvs[k]->recvbuff : nullptr,
            bytes_ba > 0 && ctx.is_local(b) ? const_cast<void*>(dba.sends[k]->sendbuff) : nullptr,
            bytes_ba > 0 && ctx.is_local(a) ? dba.recvs[k]->recvbuff : nullptr};
        const auto key = std::make_tuple(a, b, bytes_ab, bytes_ba, alltoall_bytes);
        auto cached = ctx.pair_rounds.find(key);
        if (cached == ctx.pair_rounds.end()) {
          LaunchContext::PreparedPair prepared;
          if (balancing) {
            auto b_plan = ctx.balancer->prepare_pair(a, b, bytes_ab, bytes_ba, alltoall_bytes);
            if (!b_plan) balance_failed(ctx, b_plan.status());
            if (b_plan && (*b_plan)->plan >= 0) {
              prepared.balanced = *b_plan;
              for (int i = 0; i < 2; ++i)
                if (const BalancedTransfer* t = prepared.balanced->transfers[i].get())
                  prepared.main_bytes[i] = t->main_bytes;
            }
          }
          prepared.plan =
              plan_pair_rounds(a, b, bytes_ab - prepared.main_bytes[0],
                               bytes_ba - prepared.main_bytes[1], &p2p_channels, protocol_for);
          prepared.executors.assign(prepared.plan.rounds.size(), nullptr);
          cached = ctx.pair_rounds.emplace(key, std::move(prepared)).first;
        }
        LaunchContext::PreparedPair& pair = cached->second;
        if (pair.balanced != nullptr) {
          std::map<int32_t, cudaStream_t> pair_streams;
          for (int32_t r : {a, b})
            if (ctx.is_local(r)) pair_streams.emplace(r, stream_of.at(r));
          ctx.balancer->stats().begin_run(pair.balanced->plan, device_streams(ctx, pair_streams),
                                          *capturing);
          for (int i = 0; i < 2; ++i) {
            const BalancedTransfer* t = pair.balanced->transfers[i].get();
            if (t == nullptr) continue;
            if (ApiStatus s =
                    add_balanced(ctx, *t, slot[2 * i], slot[2 * i + 1], stream_of, *capturing,
                                 ExchangeName::pair(a, b), &pair.balanced_executors[i], batch);
                !s)
              return s;
            ++balanced;
          }
          // The rounds carry what follows the balanced part (the tails).
          for (int i = 0; i < 2; ++i)
            for (int side = 0; side < 2; ++side)
              if (void*& p = slot[2 * i + side]; p != nullptr)
                p = static_cast<char*>(p) + pair.main_bytes[i];
        }
        const PairRounds& plan = pair.plan;
        for (std::size_t i = 0; i < plan.rounds.size(); ++i) {
          ReadyRound r{&plan.rounds[i], {}, {}, ExchangeName::pair(a, b), &pair.executors[i]};
          for (int s : plan.input_slot[i]) r.inputs.push_back(s < 0 ? nullptr : slot[s]);
          for (int s : plan.output_slot[i]) r.outputs.push_back(s < 0 ? nullptr : slot[s]);
          ready.push_back(std::move(r));
        }
      }
    }
  }

  if (ready.empty() && balanced == 0) return ApiStatus::ok();  // only copies to self, or nothing
  const uint64_t op_count = ctx.launches++;
  const bool logged = log_enabled(LogLevel::kInfo, kLogP2p);
  if (logged || selection_observed()) {
    const std::string reason =
        std::to_string(transfers) + " transfer(s) between ranks and " + std::to_string(to_self) +
        " to self -> " +
        (balanced > 0 ? std::to_string(balanced) + " balanced program(s) + " : "") +
        std::to_string(ready.size()) + " launch(es) of generated 'p2p' programs" +
        (ready.empty()
             ? std::string()
             : " (channels per transfer: " + std::to_string(ready.front().round->channels) + ")") +
        (ctx.processes != nullptr ? ", pairs in one global order across processes" : "");
    if (logged)
      log_line(LogLevel::kInfo, kLogP2p, ctx.device(stream_of.begin()->first),
               "ncclSend/ncclRecv group: opCount " + std::to_string(op_count) + " " + reason +
                   (*capturing ? " (captured)" : ""));
    notify_selection({"p2p", "p2p", "runtime", reason, false, transfers, ctx.nranks()});
  }

  for (ReadyRound& r : ready) {
    const P2pRound& round = *r.round;
    device::DeviceExecutor* executor = r.prepared != nullptr ? *r.prepared : nullptr;
    if (executor == nullptr)
      executor = ctx.executors->find(ctx.executors->cache_key(round.signature, round.ranks));
    if (executor == nullptr) {
      const P2pRound* planned = &round;
      P2pRound built;
      if (round.program.ranks.empty()) {  // planned without its program (one process)
        built = round;
        build_p2p_program(built);
        planned = &built;
      }
      device::ExecutorConfig config;
      config.slot_bytes = planned->slot_bytes;
      if (ApiStatus s = ctx.executors->get(planned->program, planned->signature, planned->ranks,
                                           *capturing, planned->chunk_bytes, ef::DataType::kInt8,
                                           r.exchange, batch, &executor, config);
          !s)
        return s;
    }
    if (r.prepared != nullptr) *r.prepared = executor;
    Launch l;
    l.executor = executor;
    l.args.count = round.chunk_bytes;  // nchunksperloop 1: one chunk of chunk_bytes int8
    l.args.dtype = ef::DataType::kInt8;
    l.args.op = ef::RedOp::kSum;
    l.args.inplace = false;
    l.args.timeout = ctx.timeout;
    l.args.direct = ctx.direct;
    l.args.inputs = std::move(r.inputs);
    l.args.outputs = std::move(r.outputs);
    for (int32_t rank : round.ranks) {
      if (!ctx.is_local(rank)) continue;
      l.ranks.push_back(rank);
      l.rank_streams.push_back(stream_of.at(rank));
    }
    if (ApiStatus s = batch.add(std::move(l), *capturing); !s) return s;
  }
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
