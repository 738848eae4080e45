#include "select/balance_prediction.h"

#include <algorithm>
#include <map>

#include "efccl/balance/program_builder.h"
#include "efccl/host/timing.h"
#include "efccl/host/topology_model.h"

namespace efccl::runtime {
namespace {

/// The prediction's program has at most about this many chunks in all (its cost grows with
/// them; the model is approximate at this grain anyway).
constexpr uint64_t kPredictionChunks = 1u << 15;
constexpr uint64_t kMinUnitBytes = 4096;
/// Channels of a transfer on its default path (a send/receive round's, for large ones).
constexpr int32_t kDirectChannels = 16;

int64_t units(uint64_t bytes, uint64_t unit) {
  if (bytes == 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>((bytes + unit / 2) / unit));
}

StatusOr<double> predict(const BalanceMachine& machine,
                         const std::vector<PredictedTransfer>& transfers, bool direct) {
  uint64_t total = 0;
  for (const PredictedTransfer& t : transfers)
    if (t.sender != t.receiver) total += t.bytes;
  if (total == 0) return 0.0;
  // One chunk size for the whole program: the largest balanced transfer's (the hot pairs set
  // the time; the model charges a handoff per tile, so the chunks should be the real ones).
  uint64_t unit = std::max(kMinUnitBytes, total / kPredictionChunks);
  for (const PredictedTransfer& t : transfers)
    if (t.balanced != nullptr) unit = std::max(unit, t.balanced->chunk_bytes);
  const int32_t n = machine.nranks();
  std::vector<int64_t> in(static_cast<std::size_t>(n), 0), out(static_cast<std::size_t>(n), 0);
  std::vector<topo::NodeIndex> slot_gpus;
  std::vector<balance::ProgramTransfer> program;
  for (const PredictedTransfer& t : transfers) {
    if (t.sender == t.receiver || t.bytes == 0) continue;
    balance::ProgramTransfer p;
    p.sender = t.sender;
    p.receiver = t.receiver;
    p.src_chunk = in[static_cast<std::size_t>(t.sender)];
    p.dst_chunk = out[static_cast<std::size_t>(t.receiver)];
    const bool split = !direct && t.balanced != nullptr;
    if (split) {
      const BalancedTransfer& b = *t.balanced;
      for (const BalancedTransfer::Share& s : b.shares) {
        balance::Route route;
        for (balance::RouteHop hop : s.route.hops) {
          if (hop.to >= 0) hop.to = b.ranks[static_cast<std::size_t>(hop.to)];
          if (hop.slots == ef::SlotLocation::kDevice) {
            const topo::NodeIndex gpu = b.slot_device_gpus[static_cast<std::size_t>(hop.device)];
            auto at = std::find(slot_gpus.begin(), slot_gpus.end(), gpu);
            if (at == slot_gpus.end()) at = slot_gpus.insert(slot_gpus.end(), gpu);
            hop.device = static_cast<int32_t>(at - slot_gpus.begin());
          }
          route.hops.push_back(hop);
        }
        const int64_t c = units(static_cast<uint64_t>(s.chunks) * b.chunk_bytes, unit);
        p.shares.push_back({std::move(route), c, s.channels});
        p.chunks += c;
      }
      if (const int64_t tail = units(t.bytes - b.main_bytes, unit); tail > 0) {
        p.shares.push_back({balance::Route::direct(), tail, 1});
        p.chunks += tail;
      }
    } else {
      p.chunks = units(t.bytes, unit);
      p.shares.push_back({balance::Route::direct(), p.chunks, kDirectChannels});
    }
    in[static_cast<std::size_t>(t.sender)] += p.chunks;
    out[static_cast<std::size_t>(t.receiver)] += p.chunks;
    program.push_back(std::move(p));
  }
  balance::ProgramBuildOptions options;
  options.nranks = n;
  options.slot_devices = static_cast<int32_t>(slot_gpus.size());
  options.name = "balance prediction";
  StatusOr<ef::Program> built = balance::build_program(program, options);
  if (!built) return built.status();
  std::vector<topo::NodeIndex> rank_gpus;
  for (int32_t r = 0; r < n; ++r) rank_gpus.push_back(machine.rank_gpu(r));
  auto model =
      host::model_for_topology(machine.table->topology(), std::move(rank_gpus), {}, slot_gpus);
  if (!model) return model.status();
  host::ExecOptions call;
  call.count = unit;
  call.dtype = ef::DataType::kInt8;
  const host::TimingResult time = host::predict_time(*built, call, *model);
  if (!time.status) return Status::error("timing model: " + time.status.message());
  return time.time_us;
}

}  // namespace

StatusOr<Prediction> predict_group(const BalanceMachine& machine,
                                   const std::vector<PredictedTransfer>& transfers) {
  Prediction p;
  auto balanced = predict(machine, transfers, false);
  if (!balanced) return balanced.status();
  auto direct = predict(machine, transfers, true);
  if (!direct) return direct.status();
  p.balanced_us = *balanced;
  p.direct_us = *direct;
  return p;
}

}  // namespace efccl::runtime
