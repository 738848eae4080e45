// DeviceExecutor: one call turned into kernel parameters (prepare) and launched, one interpreter
// launch per device, ordered after the executor's previous launch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_status.h"
#include "device_executor_impl.h"
#include "efccl/host/numeric.h"
#include "interpreter_kernel.h"
#include "launch_events.h"
#include "owned_memory_layout.h"
#include "resident_grid.h"

namespace efccl::device {
namespace {

std::atomic<uint64_t> g_interpreter_launches{0};

}  // namespace

uint64_t interpreter_launch_count() {
  return g_interpreter_launches.load(std::memory_order_relaxed);
}

void count_interpreter_launch() { g_interpreter_launches.fetch_add(1, std::memory_order_relaxed); }

int reduction_of(ef::RedOp op) {
  switch (op) {
    case ef::RedOp::kProd:
      return kReduceProd;
    case ef::RedOp::kMin:
      return kReduceMin;
    case ef::RedOp::kMax:
      return kReduceMax;
    default:
      return kReduceSum;  // sum, and avg and premulsum after scaling
  }
}

Status DeviceExecutor::Impl::choose_threads(LocalDevice& local, int dtype, int reduction,
                                            int* threads) {
  int& chosen = local.threads[dtype][reduction];
  if (chosen == 0) {
    DeviceScope scope(local.device);
    chosen = -1;
    for (int t = config.max_threads_per_block; t >= 64; t /= 2) {
      int per_sm = 0;
      EFCCL_CUDA_RETURN(interpreter_blocks_per_sm(dtype, reduction, flagged, t, &per_sm),
                        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      local.max_blocks_seen[dtype][reduction] =
          std::max(local.max_blocks_seen[dtype][reduction], per_sm * local.sm_count);
      if (static_cast<int64_t>(per_sm) * local.sm_count >=
          static_cast<int64_t>(local.gpu_nblocks)) {
        chosen = t;
        break;
      }
    }
  }
  if (chosen < 0)
    return Status::error(
        "device " + std::to_string(local.device) + " must run " +
        std::to_string(local.gpu_nblocks) +
        " threadblocks at once (the interpreter's CTAs wait on each other" +
        (local.gpu_nblocks > local.nblocks
             ? std::string(", and ") + std::to_string(local.gpu_nblocks - local.nblocks) +
                   " of them belong to the launches of other processes on the same GPU"
             : std::string()) +
        "), but at most " + std::to_string(local.max_blocks_seen[dtype][reduction]) +
        " fit even with 64 threads per CTA; map fewer ranks to this GPU");
  *threads = chosen;
  return Status::ok();
}

namespace {

/// The byte ranges [begin, end) of the API buffers (input, output, scratch where a caller gives
/// one) of the device's ranks in this call, with each range's local rank.
struct BufferRange {
  std::size_t rank;
  uintptr_t begin, end;
  int kind;  ///< BufferIndex
};
std::vector<BufferRange> buffer_ranges(const ef::Program& p, const std::vector<int>& ranks,
                                       const std::vector<RankCallArgs>& args,
                                       uint64_t chunk_bytes) {
  std::vector<BufferRange> ranges;
  for (std::size_t li = 0; li < ranks.size(); ++li) {
    const ef::Rank& rank = p.ranks[static_cast<std::size_t>(ranks[li])];
    const int64_t chunks[3] = {rank.input_chunks, rank.output_chunks, rank.scratch_chunks};
    for (int k = 0; k < 3; ++k) {
      if (chunks[k] <= 0 || args[li].buffers[k] == nullptr) continue;
      const auto begin = reinterpret_cast<uintptr_t>(args[li].buffers[k]);
      ranges.push_back({li, begin, begin + static_cast<uintptr_t>(chunks[k]) * chunk_bytes, k});
    }
  }
  return ranges;
}

/// Whether the direct transfers of ranks sharing a launch may run (kernel_params.h,
/// DirectBits; `nranks`: the ranks that address each other, those of other processes' launches
/// met included): no two ranks' program buffers overlap, nor one rank's buffers out of
/// place (the analysis assumed NCCL's buffers; a call that shares memory between ranks keeps
/// the slots). Premultiplying calls keep them too: a pulled send would skip the sender's scale.
bool direct_buffers_apart(const std::vector<BufferRange>& ranges, std::size_t nranks,
                          bool inplace) {
  if (nranks < 2) return false;
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      if (inplace && ranges[i].rank == ranges[j].rank) continue;  // NCCL's aliasing
      // (scratch is the executor's own memory, apart from the API buffers)
      if (ranges[i].begin < ranges[j].end && ranges[j].begin < ranges[i].end) return false;
    }
  return true;
}

/// Programs with mrc ops write other ranks' outputs with nothing to fall back on: a call where
/// a rank's output meets another rank's buffer (or, out of place, its own input) would race
/// inside one op. Reads of shared inputs are fine. Empty when apart, else what meets what.
std::string multi_buffers_clash(const std::vector<BufferRange>& ranges,
                                const std::vector<int>& ranks, bool inplace) {
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const BufferRange& a = ranges[i];
      const BufferRange& b = ranges[j];
      if (a.kind != kBufferOutput && b.kind != kBufferOutput) continue;
      if (a.rank == b.rank && inplace) continue;  // NCCL's aliasing
      if (a.begin < b.end && b.begin < a.end) {
        const char* names[kNumBuffers] = {"input", "output", "scratch"};
        return std::string("rank ") + std::to_string(ranks[a.rank]) + "'s " + names[a.kind] +
               " buffer overlaps rank " + std::to_string(ranks[b.rank]) + "'s " +
               names[b.kind] + " buffer";
      }
    }
  return {};
}

}  // namespace

Status DeviceExecutor::Impl::prepare(DeviceExecutor* self, const RunArgs& args,
                                     const PrivateUse& use, PreparedCall* out) {
  const ef::Program& p = program;
  const int n = p.nranks;
  out->executor = self;
  out->parts.clear();
  if (Status s = ef::check_call(p, args.count, args.dtype, args.op, args.inplace,
                                args.premul_scalars.size());
      !s)
    return s;
  const int dtype = static_cast<int>(args.dtype);
  if (args.timeout.count() <= 0) return Status::error("timeout must be positive");
  if (args.inputs.size() != static_cast<std::size_t>(n) ||
      args.outputs.size() != static_cast<std::size_t>(n))
    return Status::error("inputs and outputs need one entry per rank (" + std::to_string(n) + ")");
  if (args.streams.size() != devices.size())
    return Status::error("streams needs one entry per device of devices() (" +
                         std::to_string(devices.size()) + ")");
  const auto chunk = ef::chunk_elements(p, args.count);
  const uint64_t b = *chunk;
  if (b == 0) return Status::ok();  // nothing runs (§5)
  const std::size_t size = ef::size_of(args.dtype);
  if (b > std::numeric_limits<uint64_t>::max() / size / static_cast<uint64_t>(p.nchunksperloop) / 2)
    return Status::error("count " + std::to_string(args.count) + " overflows the buffer size");
  const uint64_t tile = std::max<uint64_t>(1, slot_bytes / size);
  const uint64_t iterations = (b + tile - 1) / tile;
  if (iterations >= std::numeric_limits<uint32_t>::max())
    return Status::error("too many tiles per chunk (" + std::to_string(iterations) + ")");

  // Every buffer's byte size (program and API, every local rank) fits in 64 bits: checked by
  // owned_memory_layout here and again in map_buffers.
  auto uses = owned_bytes_for_uses(use.instances, use.stride);
  if (!uses) return uses.status();
  if (Status s = ensure_private_memory(b, args.count, size, *uses); !s) return s;

  // Collectives that only move data ignore the operator (as the host executor does).
  const bool reduces = ef::collective_reduces(p.collective);
  const bool integer = !ef::is_floating(args.dtype);
  const bool integer_avg = reduces && args.op == ef::RedOp::kAvg && integer;
  const bool premul =
      reduces && (args.op == ef::RedOp::kPreMulSum || (args.op == ef::RedOp::kAvg && !integer));
  if (premul && !premul_mixed[args.inplace ? 1 : 0].empty())
    return Status::error(premul_mixed[args.inplace ? 1 : 0]);
  const int reduction = reduction_of(args.op);
  out->dtype = dtype;
  out->reduction = reduction;

  out->parts.resize(locals.size());
  for (std::size_t di = 0; di < locals.size(); ++di) {
    LocalDevice& local = locals[di];
    PreparedPart& part = out->parts[di];
    part.device_index = di;
    part.stream = args.streams[di];
    if (Status s = choose_threads(local, dtype, reduction, &part.threads); !s) return s;
    {
      DeviceScope scope(local.device);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      EFCCL_CUDA_RETURN(cudaStreamGetCaptureInfo(part.stream, &capture, &part.capture_id),
                        "cudaStreamGetCaptureInfo");
      if (capture == cudaStreamCaptureStatusInvalidated)
        return Status::error("the launch stream's CUDA graph capture has been invalidated");
      part.eager = capture == cudaStreamCaptureStatusNone;
    }

    CallParams& params = part.call;
    params.threadblocks = local.threadblocks.get<ThreadblockDesc>();
    params.ops = local.ops.get<OpDesc>();
    params.deps = local.deps.get<DepDesc>();
    params.operands = local.operands.get<MultiOperand>();
    params.flags = local.flags.get<uint64_t>();
    params.sends = local.sends.get<SendConnectionDeviceHandle>();
    params.recvs = local.recvs.get<RecvConnectionDeviceHandle>();
    params.epochs = local.epochs.get<uint64_t>();
    params.bound.state = local.state.get<LaunchState>();
    params.bound.error = record(di);
    params.bound.signals = signals();
    params.bound.timeout_ns = static_cast<uint64_t>(args.timeout.count());
    params.chunk_elements = b;
    params.tile_elements = tile;
    params.iterations = iterations;
    params.premul_shift = args.inplace ? kPremulShiftInPlace : kPremulShiftOutOfPlace;
    params.premul = premul ? 1 : 0;

    DivideParams& divide = part.divide;
    divide.segments = local.divide_segments.get<DivideSegment>();
    divide.nsegments = local.ndivide_segments;
    divide.chunk_elements = b;
    // Within the rank's output, whose byte size owned_memory_layout checked.
    divide.largest_segment_elements = static_cast<uint64_t>(local.largest_divide_chunks) * b;
    divide.divisor = static_cast<uint64_t>(n);
    part.integer_avg = integer_avg;
    part.ranks.assign(local.ranks.size(), RankCallArgs{});
    for (std::size_t li = 0; li < local.ranks.size(); ++li) {
      const int r = local.ranks[li];
      RankCallArgs& ra = part.ranks[li];
      if (Status st = map_buffers(local, li, args, b, size, use.offset, ra); !st) return st;

      double scalar = 1.0;
      if (args.op == ef::RedOp::kPreMulSum && !args.premul_scalars.empty())
        scalar = args.premul_scalars[r];
      if (args.op == ef::RedOp::kAvg) scalar = 1.0 / static_cast<double>(n);
      ra.scalar_f64 = scalar;
      ra.scalar_f32 = static_cast<float>(scalar);
      // As an integer type sees it: the host executor's conversion, wrapped to the type by the
      // kernel.
      ra.scalar_i64 = host::premulsum_integer_scalar(scalar);

      divide.outputs[li] = static_cast<char*>(args.outputs[r]);
    }
    const std::vector<BufferRange> ranges = buffer_ranges(p, local.ranks, part.ranks, b * size);
    if (local.multi_ops)
      if (std::string clash = multi_buffers_clash(ranges, local.ranks, args.inplace);
          !clash.empty())
        return Status::error("program '" + p.name + "' reads and writes every rank's buffers in "
                             "one op (mrc), but " + clash + "; give each rank its own buffers");
    part.buffer_ranges.clear();
    for (const BufferRange& r : ranges) part.buffer_ranges.emplace_back(r.begin, r.end);
    // Between ranks of one launch: two or more ranks. With other processes' launches on the
    // GPU (XprocPlan), one rank suffices; their meeting decides (XprocPublication).
    const bool meets = local.xproc.enabled && args.count >= kXprocMinBytes / size;
    const std::size_t addressing = local.ranks.size() + (meets ? 1 : 0);
    params.direct_shift =
        args.direct && !premul && direct_buffers_apart(ranges, addressing, args.inplace)
            ? (args.inplace ? kDirectShiftInPlace : kDirectShiftOutOfPlace)
            : kDirectOff;
    part.xproc = XprocParams{};
    if (meets) {
      std::vector<std::vector<XprocBuffer>> reach(local.ranks.size());
      for (const BufferRange& r : ranges)
        reach[r.rank].push_back({r.kind, reinterpret_cast<char*>(r.begin), r.end - r.begin});
      publish_xproc(local.xproc, local.ranks, local.nblocks, reach, params.direct_shift,
                    translate, &part.xproc);
    }
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::order_after_last_launch(PreparedPart& part) {
  LocalDevice& local = locals[part.device_index];
  // Two launches of one executor share FIFOs, flags and launch counts: a launch on another
  // stream than the previous one waits for it. Eagerly, for the previous eager launch; within
  // one capture, for the previous launch captured in it (different graphs are ordered by
  // whoever replays them).
  if (part.eager && local.launched_before && local.last_stream != part.stream) {
    auto event = local.last_launch->get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaStreamWaitEvent(part.stream, *event, 0), "cudaStreamWaitEvent");
  }
  if (!part.eager && local.captured_before && local.last_capture_id == part.capture_id &&
      local.last_captured_stream != part.stream) {
    auto event = local.last_captured_launch.get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaStreamWaitEvent(part.stream, *event, 0),
                      "cudaStreamWaitEvent (ordering two captured launches of one program)");
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::after_launch(PreparedPart& part, int dtype,
                                          const std::shared_ptr<DeviceEvent>* recorded) {
  LocalDevice& local = locals[part.device_index];
  if (part.integer_avg && recorded == nullptr)
    EFCCL_CUDA_RETURN(launch_divide(part.divide, dtype, part.stream),
                      "launching avg's division on device " + std::to_string(local.device));
  if (part.eager) {
    if (recorded != nullptr) {
      local.last_launch = *recorded;
    } else {
      auto event = LaunchEvents::acquire(local.device);
      if (!event) return event.status();
      auto e = (*event)->get(local.device);
      if (!e) return e.status();
      EFCCL_CUDA_RETURN(cudaEventRecord(*e, part.stream), "cudaEventRecord");
      local.last_launch = std::move(*event);
    }
    local.last_stream = part.stream;
    local.launched_before = true;
  } else {
    auto event = local.last_captured_launch.get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaEventRecord(*event, part.stream), "cudaEventRecord (captured)");
    local.last_captured_stream = part.stream;
    local.last_capture_id = part.capture_id;
    local.captured_before = true;
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::launch_part(PreparedPart& part, int dtype, int reduction) {
  LocalDevice& local = locals[part.device_index];
  KernelParams params{};
  static_cast<CallParams&>(params) = part.call;
  std::copy(part.ranks.begin(), part.ranks.end(), params.ranks);
  params.xproc = part.xproc;
  DeviceScope scope(local.device);
  if (Status s = order_after_last_launch(part); !s) return s;
  // Eagerly, to the device's resident grid when there is one (resident.h); else a launch. A
  // call that meets other processes' launches is always launched (the grid does not meet).
  bool posted = false;
  if (part.eager && part.xproc.active == 0) {
    FusedCall call{};
    static_cast<CallParams&>(call) = part.call;
    call.nthreadblocks = local.nblocks;
    call.flagged = flagged ? 1 : 0;
    auto post = post_resident(local.device, part.stream, &call, 1, part.ranks.data(),
                              static_cast<uint32_t>(part.ranks.size()), local.nblocks, dtype,
                              reduction);
    if (!post) return post.status();
    posted = *post;
  }
  if (!posted)
    EFCCL_CUDA_RETURN(launch_interpreter(params, dtype, reduction, flagged,
                                         static_cast<int>(local.nblocks), part.threads,
                                         part.stream),
                      "launching the interpreter on device " + std::to_string(local.device));
  count_interpreter_launch();
  part.launched = true;
  return after_launch(part, dtype);
}

Status DeviceExecutor::run(const RunArgs& args) {
  Impl& m = *impl_;
  if (Status s = error_status(); !s)
    return Status::error("executor stopped by an earlier failure (call reset()): " + s.message());
  PreparedCall call;
  if (Status s = m.prepare(this, args, Impl::PrivateUse{}, &call); !s) return s;
  // A device whose launch fails after others started would leave those spinning until the
  // timeout: stop them at once instead.
  std::size_t launched = 0;
  for (PreparedPart& part : call.parts) {
    if (Status s = m.launch_part(part, call.dtype, call.reduction); !s) {
      if (launched > 0) abort();
      return s;
    }
    ++launched;
  }
  return Status::ok();
}

Status DeviceExecutor::wait(const RunArgs& args) {
  Impl& m = *impl_;
  if (args.streams.size() != m.devices.size())
    return Status::error("streams needs one entry per device of devices()");
  Status first = Status::ok();
  for (std::size_t i = 0; i < m.devices.size(); ++i) {
    DeviceScope scope(m.devices[i]);
    const cudaError_t e = cudaStreamSynchronize(args.streams[i]);
    if (e != cudaSuccess && first)
      first = cuda_error("cudaStreamSynchronize on device " + std::to_string(m.devices[i]), e);
  }
  if (Status s = error_status(); !s) return s;
  return first;
}

Status DeviceExecutor::run_and_wait(const RunArgs& args) {
  if (Status s = run(args); !s) {
    // A launch may already be in flight on other devices; let it finish (it times out).
    (void)wait(args);
    return s;
  }
  return wait(args);
}

}  // namespace efccl::device
