// DeviceExecutor::run_batch: several calls, of one or more executors, in as few launches as
// possible (fused launches, fused_kernel.cu), and what happens when a launch fails.
#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_status.h"
#include "device_executor_impl.h"
#include "fused_overlap.h"
#include "interpreter_kernel.h"
#include "launch_events.h"
#include "resident_grid.h"

namespace efccl::device {
namespace {

/// Occupancy of the fused kernel per (device, dtype, reduction, threads), queried once.
StatusOr<int> fused_capacity(int device, int sm_count, int dtype, int reduction, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, dtype, reduction, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  DeviceScope scope(device);
  EFCCL_CUDA_RETURN(fused_blocks_per_sm(dtype, reduction, threads, &per_sm),
                    "cudaOccupancyMaxActiveBlocksPerMultiprocessor (fused kernel)");
  return cache[key] = per_sm * sm_count;
}

/// Calls waiting to be launched on one (device, stream): consecutive parts of one kernel.
struct PendingLaunch {
  std::size_t first_call = 0;  ///< batch index of its first call (launches go out in call order)
  int device = 0;
  cudaStream_t stream = nullptr;
  int dtype = 0, reduction = 0;
  std::size_t ranks = 0;
  std::vector<std::pair<PreparedCall*, PreparedPart*>> parts;
};

}  // namespace

Status DeviceExecutor::Impl::launch_fused_parts(
    int device, int sm_count, cudaStream_t stream, int dtype, int reduction,
    const std::vector<std::pair<PreparedCall*, PreparedPart*>>& parts, uint32_t max_ctas,
    BatchReport* report) {
  int threads = kMaxThreadsPerBlock;
  uint32_t widest = 0;
  for (const auto& [call, part] : parts) {
    threads = std::min(threads, part->threads);
    widest = std::max(widest, call->executor->impl_->locals[part->device_index].nblocks);
  }
  // Where ranks of other processes share the GPU, their launches of the same calls must be
  // co-resident with this one: it takes the share of the GPU its own threadblocks have among
  // all of theirs (LocalDevice::gpu_nblocks; the processes run the same programs).
  const auto own_share = [&parts](int c) {
    int64_t share = c;
    for (const auto& [call, part] : parts) {
      const LocalDevice& local = call->executor->impl_->locals[part->device_index];
      share = std::min<int64_t>(share, static_cast<int64_t>(c) * local.nblocks /
                                           std::max<uint32_t>(local.gpu_nblocks, 1));
    }
    return static_cast<int>(share);
  };
  int capacity = 0;
  for (; threads >= 64; threads /= 2) {
    auto c = fused_capacity(device, sm_count, dtype, reduction, threads);
    if (!c) return c.status();
    capacity = own_share(*c);
    if (static_cast<uint32_t>(capacity) >= widest) break;
  }
  // Direct transfers read and write other ranks' buffers until the call's last CTA ends, and a
  // CTA may go on to its next call before that: calls whose buffers overlap another call's keep
  // their slots, whether that other call is direct or not (a direct call's push into a buffer
  // that a slots-only call still reads). An mrc has no slots to fall back on, so such a call
  // makes the whole batch go out one launch at a time (stream order then separates them).
  std::vector<const std::vector<ByteRange>*> call_ranges(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) call_ranges[i] = &parts[i].second->buffer_ranges;
  const std::vector<bool> overlapping = calls_overlapping_others(call_ranges);
  bool multi_overlaps = false;
  for (std::size_t i = 0; i < parts.size(); ++i)
    multi_overlaps |= overlapping[i] &&
                      parts[i].first->executor->impl_->locals[parts[i].second->device_index].multi_ops;
  if (threads < 64 || static_cast<uint32_t>(capacity) < widest || multi_overlaps) {
    // The fused kernel's grid cannot hold the widest call, or an mrc call overlaps another:
    // launch them one by one.
    for (const auto& [call, part] : parts) {
      if (Status s = call->executor->impl_->launch_part(*part, dtype, reduction); !s) return s;
      ++report->launches;
    }
    return Status::ok();
  }

  if (max_ctas >= widest) capacity = std::min(capacity, static_cast<int>(max_ctas));
  // Eagerly, the device's resident grid runs the calls when they fit its CTAs (resident.h).
  const uint32_t resident = parts.front().second->eager ? resident_capacity(device) : 0;
  if (resident >= widest) capacity = std::min(capacity, static_cast<int>(resident));
  // Placement: calls side by side while they fit, then again from CTA 0; every use of an
  // executor on the CTAs of its first (fused_kernel.cu).
  FusedParams params{};
  std::map<const Impl*, uint32_t> placed;
  uint32_t offset = 0, grid = 0;
  for (const auto& [call, part] : parts) {
    Impl& m = *call->executor->impl_;
    const uint32_t ntb = m.locals[part->device_index].nblocks;
    uint32_t begin = 0;
    if (auto it = placed.find(&m); it != placed.end()) {
      begin = it->second;
    } else {
      if (offset + ntb > static_cast<uint32_t>(capacity)) offset = 0;
      begin = offset;
      offset += ntb;
      placed.emplace(&m, begin);
    }
    FusedCall& fc = params.calls[params.ncalls];
    static_cast<CallParams&>(fc) = part->call;
    fc.cta_begin = begin;
    fc.nthreadblocks = ntb;
    fc.rank_begin = 0;
    fc.flagged = m.flagged ? 1 : 0;
    grid = std::max(grid, begin + ntb);
    ++params.ncalls;
  }
  for (uint32_t i = 0; i < params.ncalls; ++i)
    if (overlapping[i]) params.calls[i].direct_shift = kDirectOff;
  uint32_t rank_cursor = 0;
  for (uint32_t i = 0; i < params.ncalls; ++i) {
    const PreparedPart& part = *parts[i].second;
    params.calls[i].rank_begin = rank_cursor;
    std::copy(part.ranks.begin(), part.ranks.end(), params.ranks + rank_cursor);
    rank_cursor += static_cast<uint32_t>(part.ranks.size());
  }

  DeviceScope scope(device);
  for (const auto& [call, part] : parts)
    if (Status s = call->executor->impl_->order_after_last_launch(*part); !s) return s;
  bool posted = false;
  if (resident >= widest && grid <= resident) {
    auto post = post_resident(device, stream, params.calls, params.ncalls, params.ranks,
                              rank_cursor, grid, dtype, reduction);
    if (!post) return post.status();
    posted = *post;
  }
  if (!posted)
    EFCCL_CUDA_RETURN(
        launch_fused(params, dtype, reduction, static_cast<int>(grid), threads, stream),
        "launching the fused interpreter (" + std::to_string(parts.size()) + " calls) on device " +
            std::to_string(device));
  count_interpreter_launch();
  for (const auto& [call, part] : parts) part->launched = true;
  ++report->launches;
  report->fused_calls += parts.size();
  // Eagerly (the parts share the stream, so all or none are captured): the divisions, then one
  // event after the whole launch for every executor in it.
  if (parts.front().second->eager) {
    for (const auto& [call, part] : parts)
      if (part->integer_avg)
        EFCCL_CUDA_RETURN(launch_divide(part->divide, call->dtype, stream),
                          "launching avg's division on device " + std::to_string(device));
    auto event = LaunchEvents::acquire(device);
    if (!event) return event.status();
    auto e = (*event)->get(device);
    if (!e) return e.status();
    EFCCL_CUDA_RETURN(cudaEventRecord(*e, stream), "cudaEventRecord");
    for (const auto& [call, part] : parts)
      if (Status s = call->executor->impl_->after_launch(*part, call->dtype, &*event); !s) return s;
    return Status::ok();
  }
  for (const auto& [call, part] : parts)
    if (Status s = call->executor->impl_->after_launch(*part, call->dtype); !s) return s;
  return Status::ok();
}

Status DeviceExecutor::run_batch(const std::vector<BatchCall>& calls, BatchReport* report,
                                 const BatchOptions& options) {
  BatchReport local_report;
  if (report == nullptr) report = &local_report;
  *report = BatchReport{};
  // Data-movement collectives only copy, so their element type is free: each runs as the
  // kernel of a neighbouring reducing call where its bytes and buffers allow (so that a group
  // mixing them fuses into one launch), else as bytes (one kernel for all of them).
  std::vector<RunArgs> byte_args(calls.size());
  std::vector<const RunArgs*> args(calls.size());
  std::vector<char> moves(calls.size(), 0);  // 1: a data-movement call, now in bytes
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const BatchCall& c = calls[i];
    if (c.executor == nullptr || c.args == nullptr)
      return Status::error("batch call " + std::to_string(i) + " has no executor or arguments");
    if (Status s = c.executor->error_status(); !s)
      return Status::error("executor of batch call " + std::to_string(i) +
                           " stopped by an earlier failure (call reset()): " + s.message());
    args[i] = c.args;
    const ef::Program& p = c.executor->impl_->program;
    if (!ef::collective_reduces(p.collective) &&
        c.args->count <= std::numeric_limits<uint64_t>::max() / ef::size_of(c.args->dtype) &&
        ef::check_call(p, c.args->count, c.args->dtype, c.args->op, c.args->inplace,
                       c.args->premul_scalars.size())) {
      byte_args[i] = *c.args;
      byte_args[i].count = c.args->count * ef::size_of(c.args->dtype);
      byte_args[i].dtype = ef::DataType::kInt8;
      byte_args[i].op = ef::RedOp::kSum;
      args[i] = &byte_args[i];
      moves[i] = 1;
    }
  }
  // The kernel a call's arguments select: (datatype, operator as the kernel reduces).
  const auto kernel_of = [](const RunArgs& a) {
    ef::RedOp op = a.op;
    if (op == ef::RedOp::kAvg || op == ef::RedOp::kPreMulSum) op = ef::RedOp::kSum;
    return std::pair<ef::DataType, ef::RedOp>{a.dtype, op};
  };
  // Re-expresses data-movement call i (in bytes) in `kernel` when the bytes divide into its
  // elements, the program's granularity holds and every buffer is aligned to an element.
  const auto adopt = [&](std::size_t i, std::pair<ef::DataType, ef::RedOp> kernel) {
    const std::size_t size = ef::size_of(kernel.first);
    const RunArgs& b = byte_args[i];
    if (size == 1 || b.count % size != 0) return false;
    // Tiles of slot_bytes / size elements carry the same bytes as in int8 only when the slot
    // divides (across processes, a peer may have kept bytes for its own pointers' sake).
    if (calls[i].executor->impl_->slot_bytes % size != 0) return false;
    const ef::Program& p = calls[i].executor->impl_->program;
    if (!ef::check_call(p, b.count / size, kernel.first, kernel.second, b.inplace, 0)) return false;
    const auto aligned = [size](const void* ptr) {
      return reinterpret_cast<std::uintptr_t>(ptr) % size == 0;
    };
    if (!std::all_of(b.inputs.begin(), b.inputs.end(), aligned) ||
        !std::all_of(b.outputs.begin(), b.outputs.end(), aligned))
      return false;
    // The adopted kernel's CTAs must all be co-resident too (a wider type's kernel may need
    // more registers than the bytes kernel): otherwise keep bytes rather than fail the batch.
    Impl& m = *calls[i].executor->impl_;
    const int reduction = reduction_of(kernel.second);
    for (LocalDevice& local : m.locals) {
      int threads = 0;
      if (!m.choose_threads(local, static_cast<int>(kernel.first), reduction, &threads))
        return false;
    }
    byte_args[i].count = b.count / size;
    byte_args[i].dtype = kernel.first;
    byte_args[i].op = kernel.second;
    return true;
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (!moves[i]) continue;
    // The previous call's kernel (possibly adopted itself), else the next reducing call's.
    bool done = i > 0 && adopt(i, kernel_of(*args[i - 1]));
    for (std::size_t j = i + 1; !done && j < calls.size(); ++j)
      if (!moves[j]) {
        done = adopt(i, kernel_of(*args[j]));
        break;
      }
  }
  std::map<Impl*, Impl::PrivateUse> uses;  // per executor: how many uses, the largest need
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const BatchCall& c = calls[i];
    Impl::PrivateUse& use =
        uses.try_emplace(c.executor->impl_.get(), Impl::PrivateUse{0, 0, 0}).first->second;
    ++use.instances;
    // Already aligned (owned_memory_layout aligns every part); checked for overflow.
    auto need = c.executor->impl_->largest_private_bytes(*args[i]);
    if (!need)
      return Status::error("batch call " + std::to_string(i) + " (program '" +
                           c.executor->impl_->program.name + "'): " + need.status().message());
    use.stride = std::max(use.stride, *need);
  }

  std::vector<PreparedCall> prepared(calls.size());
  std::map<Impl*, uint32_t> next_instance;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    Impl* m = calls[i].executor->impl_.get();
    Impl::PrivateUse use = uses[m];
    use.offset = next_instance[m]++ * use.stride;
    if (Status s = m->prepare(calls[i].executor, *args[i], use, &prepared[i]); !s)
      return Status::error("batch call " + std::to_string(i) + " (program '" + m->program.name +
                           "'): " + s.message());
  }

  // Per (device, stream): consecutive parts of one kernel are fused (in call order, at most
  // kMaxFusedCalls calls and kMaxFusedRanks ranks per launch); a part of another kernel
  // launches what is pending first, so every device runs the calls in the batch's order.
  std::map<std::pair<int, cudaStream_t>, PendingLaunch> pending;
  std::map<std::pair<const Impl*, std::size_t>, std::pair<int, cudaStream_t>> waiting_in;
  std::size_t flushes = 0;
  const auto flush = [&](PendingLaunch& l) -> Status {
    if (l.parts.empty()) return Status::ok();
    for (const auto& [call, part] : l.parts)
      waiting_in.erase({call->executor->impl_.get(), part->device_index});
    Status s = Status::ok();
    if (flushes++ == options.fail_launch) {
      s = Status::error("launch " + std::to_string(options.fail_launch) +
                        " of the batch failed on purpose (BatchOptions::fail_launch)");
    } else if (l.parts.size() == 1) {
      auto [call, part] = l.parts.front();
      s = call->executor->impl_->launch_part(*part, call->dtype, call->reduction);
      if (s) ++report->launches;
    } else {
      const Impl& first = *l.parts.front().first->executor->impl_;
      const int sm_count = first.locals[l.parts.front().second->device_index].sm_count;
      s = Impl::launch_fused_parts(l.device, sm_count, l.stream, l.dtype, l.reduction, l.parts,
                                   options.max_ctas, report);
    }
    l.parts.clear();
    l.ranks = 0;
    return s;
  };
  Status failure = Status::ok();
  // Everything pending, in call order (a later call's launch must not take the GPU before an
  // earlier call's: a fused grid may fill it).
  const auto flush_all = [&]() -> Status {
    std::vector<PendingLaunch*> left;
    for (auto& [key, l] : pending)
      if (!l.parts.empty()) left.push_back(&l);
    std::sort(left.begin(), left.end(), [](const PendingLaunch* a, const PendingLaunch* b) {
      return a->first_call < b->first_call;
    });
    for (PendingLaunch* l : left)
      if (Status s = flush(*l); !s) return s;
    return Status::ok();
  };
  for (std::size_t ci = 0; ci < prepared.size() && failure; ++ci) {
    PreparedCall& call = prepared[ci];
    for (PreparedPart& part : call.parts) {
      Impl& m = *call.executor->impl_;
      const int device = m.locals[part.device_index].device;
      const std::pair<int, cudaStream_t> key{device, part.stream};
      if (part.xproc.active != 0) {
        // It meets other processes' launches (XprocParams): a launch of its own, after every
        // earlier call's.
        if (failure = flush_all(); !failure) break;
        PendingLaunch& l = pending[key];
        l.first_call = ci;
        l.device = device;
        l.stream = part.stream;
        l.dtype = call.dtype;
        l.reduction = call.reduction;
        l.parts.emplace_back(&call, &part);
        waiting_in[{&m, part.device_index}] = key;
        if (failure = flush(l); !failure) break;
        continue;
      }
      // The executor's previous use on this device waits on another stream: launch it first
      // (launches of one executor on different streams are ordered by events).
      if (auto it = waiting_in.find({&m, part.device_index});
          it != waiting_in.end() && it->second != key)
        if (failure = flush(pending[it->second]); !failure) break;
      PendingLaunch& l = pending[key];
      const bool fits = l.parts.size() < static_cast<std::size_t>(kMaxFusedCalls) &&
                        l.ranks + part.ranks.size() <= static_cast<std::size_t>(kMaxFusedRanks);
      if (!l.parts.empty() && (l.dtype != call.dtype || l.reduction != call.reduction || !fits))
        if (failure = flush(l); !failure) break;
      if (l.parts.empty()) l.first_call = ci;
      l.device = device;
      l.stream = part.stream;
      l.dtype = call.dtype;
      l.reduction = call.reduction;
      l.ranks += part.ranks.size();
      l.parts.emplace_back(&call, &part);
      waiting_in[{&m, part.device_index}] = key;
    }
  }
  if (failure) failure = flush_all();  // what is left
  if (failure) return Status::ok();

  // A failed launch: nothing more is launched. A call with some parts launched and others not
  // would leave the launched ones waiting for their peers until the deadline: its executor is
  // aborted. Executors whose calls launched whole, or not at all, are left alone (an aborted
  // multi-process executor cannot be reset).
  std::set<DeviceExecutor*> aborted;
  std::string not_run;
  for (std::size_t ci = 0; ci < prepared.size(); ++ci) {
    const PreparedCall& call = prepared[ci];
    const auto launched = static_cast<std::size_t>(
        std::count_if(call.parts.begin(), call.parts.end(),
                      [](const PreparedPart& part) { return part.launched; }));
    if (launched == call.parts.size()) continue;
    report->not_run.push_back(ci);
    not_run += (not_run.empty() ? "" : ", ") + std::to_string(ci);
    if (launched > 0 && aborted.insert(call.executor).second) call.executor->abort();
  }
  std::string message = failure.message();
  if (!not_run.empty()) message += "; batch calls not run: " + not_run;
  if (!aborted.empty())
    message += " (" + std::to_string(aborted.size()) +
               " executor(s) aborted: their calls were launched on some devices only)";
  return Status::error(message);
}

}  // namespace efccl::device
