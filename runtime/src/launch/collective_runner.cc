#include "launch/collective_runner.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "efccl/common/log.h"
#include "launch/p2p_runner.h"

namespace efccl::runtime {
namespace {

/// Copies of one program's executor that the runs of one batch may take turns on: a batch's
/// runs of one executor share CTAs (one after another); copies with their own connections
/// overlap. Up to kMaxCopies, within kCopyBytes of connection memory per program and device.
/// Single process only (processes create executors in lockstep, and their batches may differ).
constexpr int kMaxCopies = 8;
constexpr std::size_t kCopyBytes = std::size_t{64} << 20;

/// The program buffers of rank `c.rank` for elements [offset, ...) (offset: element-wise
/// collectives only). Buffers NCCL ignores on a rank are replaced as the executor expects.
void program_buffers(const Call& c, uint64_t offset, const void** in, void** out) {
  const uint64_t off = offset * ef::size_of(c.dtype);
  const char* send = static_cast<const char*>(c.sendbuff);
  char* recv = static_cast<char*>(c.recvbuff);
  const auto shift = [off](auto* p) { return p == nullptr ? p : p + off; };
  const bool root = c.rank == c.root;
  *in = shift(send);
  *out = shift(recv);
  switch (c.kind) {
    case CallKind::kBroadcast:
      if (!root) *in = shift(recv);  // non-root sendbuff is ignored by NCCL
      break;
    case CallKind::kReduce:
    case CallKind::kGather:
      if (!root) *out = nullptr;  // executor-owned memory
      break;
    case CallKind::kScatter:
      if (!root) *in = nullptr;
      break;
    default:
      break;
  }
}

/// Which copy of `program`'s executor (cache key prefix `key`) this run uses: 0 for the first
/// run in the batch (and without fusion), then 1, 2, ... round robin within the budget.
int copy_for(LaunchContext& ctx, LaunchBatch& batch, const ef::Program& program,
             const std::string& key, const std::vector<int32_t>& ranks) {
  if (!batch.fusing() || ctx.processes != nullptr) return 0;
  const int use = batch.next_use(&program);
  if (use == 0) return 0;
  // The first run's executor is cached (it is in this batch): its connection memory says how
  // many copies the budget allows.
  const device::DeviceExecutor* first = ctx.executors->find(ctx.executors->cache_key(key, ranks));
  if (first == nullptr) return 0;
  const std::size_t bytes = std::max<std::size_t>(first->connection_bytes(), 1);
  const auto copies = static_cast<int>(
      std::min<std::size_t>(kMaxCopies, std::max<std::size_t>(1, kCopyBytes / bytes)));
  return use % copies;
}

/// An out-of-place ncclAlltoAll that the balancer would run over several paths: its blocks as
/// sends and receives of a group (launch/p2p_runner.h); `*ran` false: run the library's program.
ApiStatus run_balanced_alltoall(LaunchContext& ctx, const std::vector<Call>& set, bool inplace,
                                LaunchBatch& batch, bool* ran) {
  *ran = false;
  const Call& ref = set[0];
  if (ref.kind != CallKind::kAllToAll || inplace || ctx.balancer == nullptr ||
      !ctx.balancer->active())
    return ApiStatus::ok();
  const uint64_t bytes = call_bytes(ref);
  StatusOr<bool> balances = ctx.balancer->alltoall_balances(bytes);
  if (!balances) {
    EFCCL_INFO(kLogBalance, ctx.device(ref.rank),
               "balancing skipped: " + balances.status().message());
    return ApiStatus::ok();
  }
  if (!*balances) return ApiStatus::ok();
  std::vector<Call> p2p;
  for (const Call& c : set)
    for (int32_t q = 0; q < ctx.nranks(); ++q) {
      Call send;
      send.kind = CallKind::kSend;
      send.rank = c.rank;
      send.peer = q;
      send.sendbuff = static_cast<const char*>(c.sendbuff) + static_cast<uint64_t>(q) * bytes;
      send.count = bytes;
      send.dtype = ef::DataType::kInt8;
      send.stream = c.stream;
      Call recv = send;
      recv.kind = CallKind::kRecv;
      recv.sendbuff = nullptr;
      recv.recvbuff = static_cast<char*>(c.recvbuff) + static_cast<uint64_t>(q) * bytes;
      p2p.push_back(send);
      p2p.push_back(recv);
    }
  *ran = true;
  return run_send_recv(ctx, p2p, batch, bytes);
}

/// Where one rank's receive buffer meets another rank's buffer, or (out of place) its own send
/// buffer, at the sizes the NCCL API gives each for `program`'s collective (ef::api_input_elements
/// / api_output_elements: allgather's output and reduce-scatter's input hold n blocks, a
/// non-root's ignored buffers have none). Sizes saturate instead of wrapping. Empty when apart.
std::string buffers_clash(const std::vector<Call>& set, bool inplace, const ef::Program& program) {
  struct Range {
    int32_t rank;
    const char* name;
    uintptr_t begin, end;
    bool written;
  };
  std::vector<Range> ranges;
  const auto end_of = [](uintptr_t begin, uint64_t elements, std::size_t element_size) {
    uint64_t bytes = 0;
    uintptr_t end = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(element_size), &bytes) ||
        __builtin_add_overflow(begin, bytes, &end))
      return std::numeric_limits<uintptr_t>::max();
    return end;
  };
  for (const Call& c : set) {
    const std::size_t es = ef::size_of(c.dtype);
    const auto send = reinterpret_cast<uintptr_t>(c.sendbuff);
    const auto recv = reinterpret_cast<uintptr_t>(c.recvbuff);
    if (const uint64_t in = ef::api_input_elements(program, c.rank, c.count); in > 0)
      ranges.push_back({c.rank, "sendbuff", send, end_of(send, in, es), false});
    if (const uint64_t out = ef::api_output_elements(program, c.rank, c.count); out > 0)
      ranges.push_back({c.rank, "recvbuff", recv, end_of(recv, out, es), true});
  }
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const Range& a = ranges[i];
      const Range& b = ranges[j];
      if (!a.written && !b.written) continue;  // reading one buffer twice is fine
      if (a.rank == b.rank && inplace) continue;
      if (a.begin < b.end && b.begin < a.end)
        return "rank " + std::to_string(a.rank) + "'s " + a.name + " overlaps rank " +
               std::to_string(b.rank) + "'s " + b.name;
    }
  return {};
}

/// A communicator of one rank: every collective leaves the rank's data as it is (NCCL copies the
/// buffer too), so a built-in plan runs as one device-to-device copy on the rank's stream, or
/// nothing in place, instead of an interpreter launch. Only for a submission of this one call:
/// no launch of the batch is pending to go first. (Clique::submit restores the device.)
ApiStatus run_one_rank(LaunchContext& ctx, const Call& c, bool inplace, uint64_t op_count) {
  const uint64_t bytes = call_bytes(c);  // one rank: its block is the whole buffer
  EFCCL_INFO(kLogColl, ctx.device(c.rank),
             std::string(api_name(c.kind)) + ": opCount " + std::to_string(op_count) + " count " +
                 std::to_string(c.count) + " datatype " + std::string(ef::to_string(c.dtype)) +
                 " op " + std::string(ef::to_string(c.op)) + " nranks 1 -> " +
                 (inplace ? "nothing to move (in place)" : "a device-to-device copy"));
  if (inplace) return ApiStatus::ok();
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ctx.device(c.rank)) {
    if (const cudaError_t e = cudaSetDevice(ctx.device(c.rank)); e != cudaSuccess)
      return ApiStatus::cuda(std::string(api_name(c.kind)) + ": cudaSetDevice(" +
                             std::to_string(ctx.device(c.rank)) + "): " + cudaGetErrorString(e));
  }
  if (const cudaError_t e = cudaMemcpyAsync(c.recvbuff, c.sendbuff, bytes,
                                            cudaMemcpyDefault, c.stream);
      e != cudaSuccess)
    return ApiStatus::cuda(std::string(api_name(c.kind)) + ": cudaMemcpyAsync of " +
                           std::to_string(bytes) + " bytes (one rank): " + cudaGetErrorString(e));
  return ApiStatus::ok();
}

}  // namespace

ApiStatus run_collective(LaunchContext& ctx, const std::vector<Call>& set, LaunchBatch& batch,
                         bool alone) {
  const Call& ref = set[0];
  const uint64_t op_count = ctx.launches++;
  if (ref.count == 0) {
    EFCCL_INFO(kLogColl, ctx.device(ref.rank),
               std::string(api_name(ref.kind)) + ": opCount " + std::to_string(op_count) +
                   " count 0: nothing to do");
    return ApiStatus::ok();
  }

  // One mode for the whole call: the root's for rooted collectives, else every rank's.
  // (Multi-process: the local root's, else the local ranks' own; other processes decide theirs.)
  const Call* mode_ref = &set[0];
  for (const Call& c : set)
    if (is_rooted(ref.kind) && c.rank == ref.root) mode_ref = &c;
  const bool inplace = is_inplace(*mode_ref);
  if (!is_rooted(ref.kind)) {
    for (const Call& c : set) {
      if (is_inplace(c) != inplace)
        return ApiStatus::invalid_usage(
            std::string(api_name(ref.kind)) + ": rank " + std::to_string(ref.rank) + " calls " +
            (inplace ? "in place" : "out of place") + " but rank " + std::to_string(c.rank) +
            " does not; efccl runs a call in one mode on every rank");
    }
  }

  if (ref.kind == CallKind::kAllToAll) {
    bool ran = false;
    ApiStatus s = run_balanced_alltoall(ctx, set, inplace, batch, &ran);
    if (ran || !s) return s;
  }

  CallShape shape;
  shape.collective = collective_of(ref.kind);
  shape.nranks = ctx.nranks();
  shape.root = is_rooted(ref.kind) ? ref.root : 0;
  shape.count = ref.count;
  shape.dtype = ref.dtype;
  shape.inplace = inplace;
  StatusOr<Plan> plan = ctx.registry->select(shape);
  if (!plan && ctx.fallback != nullptr) {
    (void)batch.flush();  // the calls before this one go first (a failure stays the batch's)
    return ctx.fallback->run(set, plan.status().message(), ctx.timeout);
  }
  if (!plan)
    return ApiStatus::internal(std::string(api_name(ref.kind)) + ": " + plan.status().message());

  // One rank, a built-in plan, no scaling, not in a group with other calls (those share one
  // fused launch, less GPU time than a copy each): a copy. User programs run as written.
  if (alone && ctx.nranks() == 1 && set.size() == 1 && plan->builtin &&
      !(ref.op == ef::RedOp::kPreMulSum && ref.premul_scalar != 1.0))
    return run_one_rank(ctx, ref, inplace, op_count);

  // Programs of mrc ops (ranks sharing one launch) write every rank's output in one op: ranks
  // passing overlapping buffers would race inside it, so such a call is refused as an invalid
  // argument (ranks sharing a GPU each need their own buffers), before anything is launched.
  for (const PlanPiece& piece : plan->pieces)
    if (ef::uses_multi_rank_ops(*piece.program))
      if (std::string clash = buffers_clash(set, inplace, *piece.program); !clash.empty())
        return ApiStatus::invalid_usage(std::string(api_name(ref.kind)) + ": " + clash +
                                        ", but program '" + piece.program->name +
                                        "' writes every rank's output in one pass; give each "
                                        "rank sharing the GPU its own buffers");

  std::vector<cudaStream_t> streams;
  for (const Call& c : set) streams.push_back(c.stream);
  StatusOr<bool> capturing = any_capturing(streams);
  if (!capturing) return ApiStatus::cuda(capturing.status().message());

  if (log_enabled(LogLevel::kInfo, kLogColl)) {
    std::string programs;
    for (const PlanPiece& p : plan->pieces)
      programs += (programs.empty() ? "" : " + ") + ("'" + p.program->name + "'") + " [" +
                  std::to_string(p.offset) + ", " + std::to_string(p.offset + p.count) + ")";
    log_line(LogLevel::kInfo, kLogColl, ctx.device(ref.rank),
             std::string(api_name(ref.kind)) + ": opCount " + std::to_string(op_count) + " count " +
                 std::to_string(ref.count) + " datatype " + std::string(ef::to_string(ref.dtype)) +
                 " op " + std::string(ef::to_string(ref.op)) + " root " +
                 std::to_string(shape.root) + " inplace " + (inplace ? "1" : "0") + " nranks " +
                 std::to_string(ctx.nranks()) + (*capturing ? " (captured)" : "") + " -> " +
                 programs + ": " + plan->reason);
  }

  std::vector<int32_t> all_ranks(static_cast<std::size_t>(ctx.nranks()));
  for (int32_t r = 0; r < ctx.nranks(); ++r) all_ranks[static_cast<std::size_t>(r)] = r;
  for (const PlanPiece& piece : plan->pieces) {
    char key[64];  // not an ostringstream: this runs on every call
    std::snprintf(key, sizeof(key), "coll:%p", static_cast<const void*>(piece.program));
    if (const int copy = copy_for(ctx, batch, *piece.program, key, all_ranks); copy > 0)
      std::snprintf(key, sizeof(key), "coll:%p#%d", static_cast<const void*>(piece.program), copy);
    device::DeviceExecutor* executor = nullptr;
    if (ApiStatus s =
            ctx.executors->get(*piece.program, key, all_ranks, *capturing, piece.count, ref.dtype,
                               ExchangeName::of_program(*piece.program), batch, &executor);
        !s)
      return s;
    Launch l;
    l.executor = executor;
    l.args.count = piece.count;
    l.args.dtype = ref.dtype;
    l.args.op = ref.op;
    l.args.inplace = inplace;
    l.args.timeout = ctx.timeout;
    l.args.direct = ctx.direct;
    // Per program rank (= clique rank); other processes' ranks stay null.
    const auto n = static_cast<std::size_t>(ctx.nranks());
    if (ref.op == ef::RedOp::kPreMulSum) l.args.premul_scalars.assign(n, 1.0);
    l.args.inputs.assign(n, nullptr);
    l.args.outputs.assign(n, nullptr);
    for (const Call& c : set) {
      const void* in = nullptr;
      void* out = nullptr;
      program_buffers(c, piece.offset, &in, &out);
      const auto r = static_cast<std::size_t>(c.rank);
      l.args.inputs[r] = in;
      l.args.outputs[r] = out;
      if (ref.op == ef::RedOp::kPreMulSum) l.args.premul_scalars[r] = c.premul_scalar;
      l.ranks.push_back(c.rank);
      l.rank_streams.push_back(c.stream);
    }
    if (ApiStatus s = batch.add(std::move(l), *capturing); !s)
      return ApiStatus(s.code(), std::string(api_name(ref.kind)) + " (program '" +
                                     piece.program->name + "'): " + s.message());
  }
  return ApiStatus::ok();
}

StatusOr<bool> any_capturing(const std::vector<cudaStream_t>& streams) {
  bool capturing = false;
  for (cudaStream_t s : streams) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(s, &status);
    if (e != cudaSuccess)
      return Status::error(std::string("cudaStreamIsCapturing: ") + cudaGetErrorString(e));
    if (status == cudaStreamCaptureStatusInvalidated)
      return Status::error("a stream's CUDA graph capture has been invalidated");
    capturing = capturing || status == cudaStreamCaptureStatusActive;
  }
  return capturing;
}

}  // namespace efccl::runtime
