// ProcessGroupEfccl's operations: argument checks, then one run() whose enqueue step makes the
// efccl calls (and, for the list forms, the copies through a flat buffer on the call's stream).
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <numeric>

#include "efccl_library.h"
#include "process_group_efccl.h"
#include "tensor_args.h"

namespace efccl::torch_backend {
namespace {

#define EFCCL_TRY(call, function)                                \
  do {                                                           \
    if (ncclResult_t efccl_r_ = (call); efccl_r_ != ncclSuccess) \
      return EfcclResult{efccl_r_, function};                    \
  } while (0)

/// Runs `body(op)` with the efccl operator of `reduce` on `type` (a premul_sum operator is
/// created for the call and destroyed after it: efccl copies what it needs at the call).
template <typename Body>
EfcclResult with_op(const ReduceArgs& reduce, ncclDataType_t type, ncclComm_t comm, Body&& body) {
  const EfcclLibrary& lib = efccl_library();
  ncclRedOp_t op = reduce.op;
  if (reduce.premul) {
    unsigned char scalar[8];
    void* factor = scalar;
    ncclScalarResidence_t residence = ncclScalarHostImmediate;
    if (reduce.premul_on_device) {
      factor = reduce.factor_tensor.data_ptr();
      residence = ncclScalarDevice;
    } else {
      encode_factor(reduce.factor, type, scalar);
    }
    EFCCL_TRY(lib.RedOpCreatePreMulSum(&op, factor, type, residence, comm),
              "ncclRedOpCreatePreMulSum");
  }
  EfcclResult r = body(op);
  if (reduce.premul) (void)lib.RedOpDestroy(op, comm);
  return r;
}

/// Calls `body()` between ncclGroupStart and ncclGroupEnd (the group ends also when it fails).
template <typename Body>
EfcclResult grouped(Body&& body) {
  const EfcclLibrary& lib = efccl_library();
  EFCCL_TRY(lib.GroupStart(), "ncclGroupStart");
  EfcclResult r = body();
  const ncclResult_t end = lib.GroupEnd();
  if (r.result != ncclSuccess) return r;
  if (end != ncclSuccess) return {end, "ncclGroupEnd"};
  return {};
}

/// A flat buffer for `n` tensors like `like` (allocated on the current stream: the call's).
at::Tensor flat_like(const at::Tensor& like, int64_t n) {
  return at::empty({n * like.numel()}, like.options().memory_format(at::MemoryFormat::Contiguous));
}

/// Part `j` of `flat` (holding tensors like `like`) shaped as `like`.
at::Tensor part(const at::Tensor& flat, const at::Tensor& like, int64_t j) {
  return flat.narrow(0, j * like.numel(), like.numel()).view(like.sizes());
}

void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int size,
                const char* op, const char* role) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "efccl ", op, ": expected ", size, " ", role,
              " tensors (one per rank), got ", list.size());
  for (const at::Tensor& t : list) check_tensor(t, like.device(), op, role, false);
  check_same_shape(list, like, op, role);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  check_single(tensors, "allreduce", "input");
  at::Tensor& t = tensors[0];
  check_tensor(t, t.device(), "allreduce", "input", false);
  const ReduceArgs reduce = reduce_args_of(opts.reduceOp, t, "allreduce");
  const BufferArgs b = buffer_of(t, true, "allreduce");
  CallSpec spec;
  spec.type = c10d::OpType::ALLREDUCE;
  spec.name = "allreduce";
  spec.device = t.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(t);
  spec.inputs = {t};
  if (reduce.premul_on_device) spec.inputs.push_back(reduce.factor_tensor);
  spec.outputs = {t};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return with_op(reduce, b.type, comm, [&](ncclRedOp_t op) {
      EFCCL_TRY(efccl_library().AllReduce(b.data, b.data, b.count, b.type, op, comm, stream),
                "ncclAllReduce");
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allreduce_sparse(
    std::vector<at::Tensor>& /*tensors*/, const c10d::AllreduceOptions& /*opts*/) {
  TORCH_CHECK(false,
              "efccl: all_reduce of sparse tensors is not supported (as with NCCL: "
              "densify them, or use gloo for sparse tensors)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allreduce_many(std::vector<at::Tensor>& tensors,
                                                                 const c10d::ReduceOp& reduce_op,
                                                                 std::chrono::milliseconds timeout,
                                                                 bool async_op, c10d::OpType type,
                                                                 const char* name) {
  TORCH_CHECK(!tensors.empty(), "efccl ", name, ": no tensors");
  std::vector<ReduceArgs> reduces;
  std::vector<BufferArgs> buffers;
  CallSpec spec;
  for (const at::Tensor& t : tensors) {
    check_tensor(t, tensors[0].device(), name, "input", false);
    reduces.push_back(reduce_args_of(reduce_op, t, name));
    buffers.push_back(buffer_of(t, true, name));
    spec.bytes += bytes_of(t);
    if (reduces.back().premul_on_device) spec.inputs.push_back(reduces.back().factor_tensor);
  }
  spec.type = type;
  spec.name = name;
  spec.device = tensors[0].device();
  spec.timeout = timeout;
  spec.async_op = async_op;
  spec.inputs.insert(spec.inputs.end(), tensors.begin(), tensors.end());
  spec.outputs = tensors;
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return grouped([&] {
      for (size_t i = 0; i < buffers.size(); ++i) {
        const BufferArgs& b = buffers[i];
        EfcclResult r = with_op(reduces[i], b.type, comm, [&](ncclRedOp_t op) {
          EFCCL_TRY(efccl_library().AllReduce(b.data, b.data, b.count, b.type, op, comm, stream),
                    "ncclAllReduce");
          return EfcclResult{};
        });
        if (r.result != ncclSuccess) return r;
      }
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce_many(tensors, opts.reduceOp, opts.timeout, opts.asyncOp,
                        c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast", "input");
  at::Tensor& t = tensors[0];
  check_tensor(t, t.device(), "broadcast", "input", false);
  TORCH_CHECK(opts.rootTensor == 0, "efccl broadcast: rootTensor must be 0");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "efccl broadcast: root ",
              opts.rootRank, " is not a rank of the group (size ", getSize(), ")");
  const BufferArgs b = buffer_of(t, false, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  CallSpec spec;
  spec.type = c10d::OpType::BROADCAST;
  spec.name = "broadcast";
  spec.device = t.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(t);
  spec.inputs = {t};
  spec.outputs = {t};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    EFCCL_TRY(efccl_library().Broadcast(b.data, b.data, b.count, b.type, root, comm, stream),
              "ncclBroadcast");
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce", "input");
  at::Tensor& t = tensors[0];
  check_tensor(t, t.device(), "reduce", "input", false);
  TORCH_CHECK(opts.rootTensor == 0, "efccl reduce: rootTensor must be 0");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "efccl reduce: root ", opts.rootRank,
              " is not a rank of the group (size ", getSize(), ")");
  const ReduceArgs reduce = reduce_args_of(opts.reduceOp, t, "reduce");
  const BufferArgs b = buffer_of(t, true, "reduce");
  const int root = static_cast<int>(opts.rootRank);
  CallSpec spec;
  spec.type = c10d::OpType::REDUCE;
  spec.name = "reduce";
  spec.device = t.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(t);
  spec.inputs = {t};
  if (reduce.premul_on_device) spec.inputs.push_back(reduce.factor_tensor);
  spec.outputs = {t};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return with_op(reduce, b.type, comm, [&](ncclRedOp_t op) {
      EFCCL_TRY(efccl_library().Reduce(b.data, b.data, b.count, b.type, op, root, comm, stream),
                "ncclReduce");
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* name = "allgather_into_tensor";
  check_tensor(input, input.device(), name, "input", true);
  check_tensor(output, input.device(), name, "output", true);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "efccl ", name,
              ": output and input types differ (", output.scalar_type(), ", ", input.scalar_type(),
              ")");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "efccl ", name, ": the output has ",
              output.numel(), " elements; expected the group size ", getSize(),
              " times the "
              "input's ",
              input.numel());
  const BufferArgs in = buffer_of(input, false, name);
  const BufferArgs out = buffer_of(output, false, name);
  CallSpec spec;
  spec.type = c10d::OpType::_ALLGATHER_BASE;
  spec.name = name;
  spec.device = input.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(input);
  spec.inputs = {input};
  spec.outputs = {output};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    EFCCL_TRY(efccl_library().AllGather(in.data, out.data, in.count, in.type, comm, stream),
              "ncclAllGather");
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "allgather_into_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "efccl ", name, ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<std::pair<BufferArgs, BufferArgs>> calls;
  CallSpec spec;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], inputs[0].device(), name, "input", true);
    check_tensor(outputs[i], inputs[0].device(), name, "output", true);
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "efccl ", name, ": output ", i, " must hold the group size ", getSize(),
                " times input ", i, " (same type)");
    calls.emplace_back(buffer_of(inputs[i], false, name), buffer_of(outputs[i], false, name));
    spec.bytes += bytes_of(inputs[i]);
  }
  spec.type = c10d::OpType::COALESCED;
  spec.name = name;
  spec.device = inputs[0].device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.inputs = inputs;
  spec.outputs = outputs;
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return grouped([&] {
      for (const auto& [in, out] : calls)
        EFCCL_TRY(efccl_library().AllGather(in.data, out.data, in.count, in.type, comm, stream),
                  "ncclAllGather");
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "efccl allgather: expected one output list per process, got ",
              outputs.size());
  std::vector<at::Tensor> in = inputs;
  return allgather_coalesced(outputs, in, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = output_lists.size() == 1 ? "allgather" : "allgather_coalesced";
  TORCH_CHECK(!inputs.empty() && output_lists.size() == inputs.size(), "efccl ", name, ": ",
              output_lists.size(), " output lists for ", inputs.size(), " inputs");
  // The results are copied out of flat buffers after the gathers: not inside a coalescing
  // block, whose calls only run at its end.
  TORCH_CHECK(!coalescing_.active, "efccl ", name,
              " (the list form) cannot be coalesced; use "
              "all_gather_into_tensor");
  CallSpec spec;
  std::vector<BufferArgs> in_buffers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], inputs[0].device(), name, "input", true);
    check_list(output_lists[i], inputs[i], getSize(), name, "output");
    in_buffers.push_back(buffer_of(inputs[i], false, name));
    spec.bytes += bytes_of(inputs[i]);
    spec.outputs.insert(spec.outputs.end(), output_lists[i].begin(), output_lists[i].end());
  }
  spec.type =
      output_lists.size() == 1 ? c10d::OpType::ALLGATHER : c10d::OpType::ALLGATHER_COALESCED;
  spec.name = name;
  spec.device = inputs[0].device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.inputs = inputs;
  std::vector<at::Tensor> flats;
  auto work = run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    for (const at::Tensor& input : inputs) flats.push_back(flat_like(input, getSize()));
    EfcclResult r = grouped([&] {
      for (size_t i = 0; i < inputs.size(); ++i) {
        const BufferArgs& b = in_buffers[i];
        EFCCL_TRY(
            efccl_library().AllGather(b.data, flats[i].data_ptr(), b.count, b.type, comm, stream),
            "ncclAllGather");
      }
      return EfcclResult{};
    });
    if (r.result != ncclSuccess) return r;
    for (size_t i = 0; i < inputs.size(); ++i)
      for (int j = 0; j < getSize(); ++j)
        output_lists[i][static_cast<size_t>(j)].copy_(part(flats[i], inputs[i], j), true);
    return EfcclResult{};
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor";
  check_tensor(input, input.device(), name, "input", true);
  check_tensor(output, input.device(), name, "output", true);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "efccl ", name,
              ": output and input types differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "efccl ", name, ": the input has ",
              input.numel(), " elements; expected the group size ", getSize(),
              " times the output's ", output.numel());
  const ReduceArgs reduce = reduce_args_of(opts.reduceOp, input, name);
  const BufferArgs in = buffer_of(input, true, name);
  const BufferArgs out = buffer_of(output, true, name);
  CallSpec spec;
  spec.type = c10d::OpType::_REDUCE_SCATTER_BASE;
  spec.name = name;
  spec.device = input.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(input);
  spec.inputs = {input};
  if (reduce.premul_on_device) spec.inputs.push_back(reduce.factor_tensor);
  spec.outputs = {output};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return with_op(reduce, in.type, comm, [&](ncclRedOp_t op) {
      EFCCL_TRY(
          efccl_library().ReduceScatter(in.data, out.data, out.count, in.type, op, comm, stream),
          "ncclReduceScatter");
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "efccl ", name, ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  struct One {
    ReduceArgs reduce;
    BufferArgs in, out;
  };
  std::vector<One> calls;
  CallSpec spec;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], inputs[0].device(), name, "input", true);
    check_tensor(outputs[i], inputs[0].device(), name, "output", true);
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "efccl ", name, ": input ", i, " must hold the group size ", getSize(),
                " times output ", i, " (same type)");
    calls.push_back({reduce_args_of(opts.reduceOp, inputs[i], name),
                     buffer_of(inputs[i], true, name), buffer_of(outputs[i], true, name)});
    if (calls.back().reduce.premul_on_device)
      spec.inputs.push_back(calls.back().reduce.factor_tensor);
    spec.bytes += bytes_of(inputs[i]);
  }
  spec.type = c10d::OpType::COALESCED;
  spec.name = name;
  spec.device = inputs[0].device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.inputs.insert(spec.inputs.end(), inputs.begin(), inputs.end());
  spec.outputs = outputs;
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    return grouped([&] {
      for (const One& c : calls) {
        EfcclResult r = with_op(c.reduce, c.in.type, comm, [&](ncclRedOp_t op) {
          EFCCL_TRY(efccl_library().ReduceScatter(c.in.data, c.out.data, c.out.count, c.in.type, op,
                                                  comm, stream),
                    "ncclReduceScatter");
          return EfcclResult{};
        });
        if (r.result != ncclSuccess) return r;
      }
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter";
  check_single(outputs, name, "output");
  TORCH_CHECK(inputs.size() == 1, "efccl ", name, ": expected one input list per process, got ",
              inputs.size());
  at::Tensor& output = outputs[0];
  check_tensor(output, output.device(), name, "output", true);
  check_list(inputs[0], output, getSize(), name, "input");
  const ReduceArgs reduce = reduce_args_of(opts.reduceOp, output, name);
  const BufferArgs out = buffer_of(output, true, name);
  CallSpec spec;
  spec.type = c10d::OpType::REDUCE_SCATTER;
  spec.name = name;
  spec.device = output.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(output) * static_cast<uint64_t>(getSize());
  spec.inputs = inputs[0];
  if (reduce.premul_on_device) spec.inputs.push_back(reduce.factor_tensor);
  spec.outputs = {output};
  std::vector<at::Tensor> flat;
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    // The inputs are copied in on the call's stream, before the reduction (also in a
    // coalescing block: they precede its launch on the stream).
    flat.push_back(flat_like(output, getSize()));
    for (int j = 0; j < getSize(); ++j)
      part(flat[0], output, j).copy_(inputs[0][static_cast<size_t>(j)], true);
    if (coalescing_.active) coalescing_.inputs.push_back(flat[0]);
    return with_op(reduce, out.type, comm, [&](ncclRedOp_t op) {
      EFCCL_TRY(efccl_library().ReduceScatter(flat[0].data_ptr(), out.data, out.count, out.type, op,
                                              comm, stream),
                "ncclReduceScatter");
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* name = "gather";
  check_single(inputs, name, "input");
  at::Tensor& input = inputs[0];
  check_tensor(input, input.device(), name, "input", true);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "efccl gather: root ", opts.rootRank,
              " is not a rank of the group (size ", getSize(), ")");
  TORCH_CHECK(!coalescing_.active, "efccl gather cannot be coalesced");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1, "efccl gather: the root needs one output list");
    check_list(outputs[0], input, getSize(), name, "output");
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "efccl gather: only the root (rank ", root, ") takes output tensors");
  }
  const BufferArgs in = buffer_of(input, false, name);
  CallSpec spec;
  spec.type = c10d::OpType::GATHER;
  spec.name = name;
  spec.device = input.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(input);
  spec.inputs = {input};
  if (is_root) spec.outputs = outputs[0];
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    at::Tensor flat;
    if (is_root) flat = flat_like(input, getSize());
    EFCCL_TRY(efccl_library().Gather(in.data, is_root ? flat.data_ptr() : nullptr, in.count,
                                     in.type, root, comm, stream),
              "ncclGather");
    if (is_root)
      for (int j = 0; j < getSize(); ++j)
        outputs[0][static_cast<size_t>(j)].copy_(part(flat, input, j), true);
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* name = "scatter";
  check_single(outputs, name, "output");
  at::Tensor& output = outputs[0];
  check_tensor(output, output.device(), name, "output", true);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "efccl scatter: root ",
              opts.rootRank, " is not a rank of the group (size ", getSize(), ")");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1, "efccl scatter: the root needs one input list");
    check_list(inputs[0], output, getSize(), name, "input");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "efccl scatter: only the root (rank ", root, ") takes input tensors");
  }
  const BufferArgs out = buffer_of(output, false, name);
  CallSpec spec;
  spec.type = c10d::OpType::SCATTER;
  spec.name = name;
  spec.device = output.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(output);
  if (is_root) spec.inputs = inputs[0];
  spec.outputs = {output};
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    at::Tensor flat;
    if (is_root) {
      flat = flat_like(output, getSize());
      for (int j = 0; j < getSize(); ++j)
        part(flat, output, j).copy_(inputs[0][static_cast<size_t>(j)], true);
      if (coalescing_.active) coalescing_.inputs.push_back(flat);
    }
    EFCCL_TRY(efccl_library().Scatter(is_root ? flat.data_ptr() : nullptr, out.data, out.count,
                                      out.type, root, comm, stream),
              "ncclScatter");
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const char* name = "alltoall_base";
  check_tensor(input, input.device(), name, "input", true);
  check_tensor(output, input.device(), name, "output", true);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "efccl ", name,
              ": output and input types differ");
  const int size = getSize();
  CallSpec spec;
  spec.type = c10d::OpType::ALLTOALL_BASE;
  spec.name = name;
  spec.device = input.device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.bytes = bytes_of(input);
  spec.inputs = {input};
  spec.outputs = {output};
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % size == 0, "efccl ", name,
                ": without splits, input and output need the same number of elements, a "
                "multiple of the group size ",
                size, " (got ", input.numel(), " and ", output.numel(), ")");
    const BufferArgs in = buffer_of(input, false, name);
    const BufferArgs out = buffer_of(output, false, name);
    const size_t count = in.count / static_cast<size_t>(size);
    return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
      EFCCL_TRY(efccl_library().AlltoAll(in.data, out.data, count, in.type, comm, stream),
                "ncclAlltoAll");
      return EfcclResult{};
    });
  }
  // Uneven: one send and one receive per peer in a group (efccl plans the set as one program).
  auto rows_of = [&](const at::Tensor& t, std::vector<int64_t>& splits, const char* role) {
    TORCH_CHECK(t.dim() >= 1, "efccl ", name, ": the ", role, " tensor needs a first dimension");
    const int64_t rows = t.size(0);
    std::vector<int64_t> out = splits;
    if (out.empty()) {
      TORCH_CHECK(rows % size == 0, "efccl ", name, ": the ", role, "'s ", rows,
                  " rows do not split evenly over ", size, " ranks");
      out.assign(static_cast<size_t>(size), rows / size);
    }
    TORCH_CHECK(static_cast<int>(out.size()) == size, "efccl ", name, ": ", out.size(), " ", role,
                " split sizes for a group of ", size);
    int64_t sum = 0;
    for (int64_t s : out) {
      TORCH_CHECK(s >= 0, "efccl ", name, ": a negative ", role, " split size");
      sum += s;
    }
    TORCH_CHECK(sum == rows, "efccl ", name, ": the ", role, " split sizes add up to ", sum,
                ", not the tensor's ", rows, " rows");
    return out;
  };
  const std::vector<int64_t> in_rows = rows_of(input, input_split_sizes, "input");
  const std::vector<int64_t> out_rows = rows_of(output, output_split_sizes, "output");
  const size_t in_row_bytes =
      input.size(0) > 0 ? static_cast<size_t>(bytes_of(input) / input.size(0)) : 0;
  const size_t out_row_bytes =
      output.size(0) > 0 ? static_cast<size_t>(bytes_of(output) / output.size(0)) : 0;
  auto* in_base = static_cast<char*>(input.data_ptr());
  auto* out_base = static_cast<char*>(output.data_ptr());
  for (int j = 0; j < size; ++j)
    state_->record_peer_bytes(
        j, static_cast<uint64_t>(in_rows[static_cast<size_t>(j)]) * in_row_bytes,
        static_cast<uint64_t>(out_rows[static_cast<size_t>(j)]) * out_row_bytes);
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    const EfcclLibrary& lib = efccl_library();
    return grouped([&] {
      size_t in_off = 0, out_off = 0;
      for (int j = 0; j < size; ++j) {
        const size_t send_bytes =
            static_cast<size_t>(in_rows[static_cast<size_t>(j)]) * in_row_bytes;
        const size_t recv_bytes =
            static_cast<size_t>(out_rows[static_cast<size_t>(j)]) * out_row_bytes;
        if (send_bytes > 0)
          EFCCL_TRY(lib.Send(in_base + in_off, send_bytes, ncclInt8, j, comm, stream), "ncclSend");
        if (recv_bytes > 0)
          EFCCL_TRY(lib.Recv(out_base + out_off, recv_bytes, ncclInt8, j, comm, stream),
                    "ncclRecv");
        in_off += send_bytes;
        out_off += recv_bytes;
      }
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  const char* name = "alltoall";
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == size && static_cast<int>(outputs.size()) == size,
              "efccl ", name, ": expected ", size, " input and output tensors, got ", inputs.size(),
              " and ", outputs.size());
  CallSpec spec;
  for (int j = 0; j < size; ++j) {
    check_tensor(inputs[static_cast<size_t>(j)], inputs[0].device(), name, "input", true);
    check_tensor(outputs[static_cast<size_t>(j)], inputs[0].device(), name, "output", true);
    spec.bytes += bytes_of(inputs[static_cast<size_t>(j)]);
    state_->record_peer_bytes(j, bytes_of(inputs[static_cast<size_t>(j)]),
                              bytes_of(outputs[static_cast<size_t>(j)]));
  }
  spec.type = c10d::OpType::ALLTOALL;
  spec.name = name;
  spec.device = inputs[0].device();
  spec.timeout = opts.timeout;
  spec.async_op = opts.asyncOp;
  spec.inputs = inputs;
  spec.outputs = outputs;
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    const EfcclLibrary& lib = efccl_library();
    return grouped([&] {
      for (int j = 0; j < size; ++j) {
        const at::Tensor& in = inputs[static_cast<size_t>(j)];
        const at::Tensor& out = outputs[static_cast<size_t>(j)];
        if (in.numel() > 0)
          EFCCL_TRY(lib.Send(in.data_ptr(), bytes_of(in), ncclInt8, j, comm, stream), "ncclSend");
        if (out.numel() > 0)
          EFCCL_TRY(lib.Recv(out.data_ptr(), bytes_of(out), ncclInt8, j, comm, stream), "ncclRecv");
      }
      return EfcclResult{};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::send(std::vector<at::Tensor>& tensors,
                                                       int dst_rank, int /*tag*/) {
  check_single(tensors, "send", "input");
  at::Tensor& t = tensors[0];
  check_tensor(t, t.device(), "send", "input", true);
  TORCH_CHECK(dst_rank >= 0 && dst_rank < getSize(), "efccl send: destination ", dst_rank,
              " is not a rank of the group (size ", getSize(), ")");
  const BufferArgs b = buffer_of(t, false, "send");
  CallSpec spec;
  spec.type = c10d::OpType::SEND;
  spec.name = "send";
  spec.device = t.device();
  spec.bytes = bytes_of(t);
  spec.inputs = {t};
  state_->record_peer_bytes(dst_rank, spec.bytes, 0);
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    EFCCL_TRY(efccl_library().Send(b.data, b.count, b.type, dst_rank, comm, stream), "ncclSend");
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::recv(std::vector<at::Tensor>& tensors,
                                                       int src_rank, int /*tag*/) {
  check_single(tensors, "recv", "output");
  at::Tensor& t = tensors[0];
  check_tensor(t, t.device(), "recv", "output", true);
  TORCH_CHECK(src_rank >= 0 && src_rank < getSize(), "efccl recv: source ", src_rank,
              " is not a rank of the group (size ", getSize(), ")");
  const BufferArgs b = buffer_of(t, false, "recv");
  CallSpec spec;
  spec.type = c10d::OpType::RECV;
  spec.name = "recv";
  spec.device = t.device();
  spec.bytes = bytes_of(t);
  spec.outputs = {t};
  state_->record_peer_bytes(src_rank, 0, spec.bytes);
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    EFCCL_TRY(efccl_library().Recv(b.data, b.count, b.type, src_rank, comm, stream), "ncclRecv");
    return EfcclResult{};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::recvAnysource(std::vector<at::Tensor>& /*t*/,
                                                                int /*tag*/) {
  TORCH_CHECK(false,
              "efccl: receiving from any source is not supported (efccl, like NCCL, "
              "matches each receive with one named sender): pass src= to recv/irecv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::barrier(const c10d::BarrierOptions& opts) {
  std::optional<at::Device> hint;
  if (opts.device && opts.device->is_cuda()) {
    hint = opts.device;
  } else if (!opts.device_ids.empty()) {
    hint = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(opts.device_ids[0]));
  }
  const at::Device device = default_device(hint);
  at::Tensor token = [&] {
    c10::cuda::CUDAGuard guard(device);
    return at::zeros({1}, at::TensorOptions().device(device).dtype(at::kInt));
  }();
  CallSpec spec;
  spec.type = c10d::OpType::BARRIER;
  spec.name = "barrier";
  spec.device = device;
  spec.timeout = opts.timeout;
  spec.barrier = true;
  spec.inputs = {token};
  spec.outputs = {token};
  void* data = token.data_ptr();
  return run(spec, [&](ncclComm_t comm, cudaStream_t stream) {
    EFCCL_TRY(efccl_library().AllReduce(data, data, 1, ncclInt32, ncclSum, comm, stream),
              "ncclAllReduce");
    return EfcclResult{};
  });
}

}  // namespace efccl::torch_backend
