// DeviceExecutor: executor-owned memory (scratch, and program buffers the API does not provide)
// and how a call's program buffers are laid over the user's.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "device_executor_impl.h"
#include "owned_memory_layout.h"

namespace efccl::device {

Status DeviceExecutor::Impl::ensure_private_memory(uint64_t chunk_elements, uint64_t count,
                                                   std::size_t element_size, uint64_t at_least) {
  for (LocalDevice& local : locals) {
    for (std::size_t li = 0; li < local.ranks.size(); ++li) {
      auto layout =
          owned_memory_layout(program, local.ranks[li], chunk_elements, count, element_size);
      if (!layout) return layout.status();
      const uint64_t need = std::max(at_least, layout->bytes);
      if (need <= local.private_memory[li].bytes()) continue;
      if (need > std::numeric_limits<std::size_t>::max())
        return Status::error("rank " + std::to_string(local.ranks[li]) + " needs " +
                             std::to_string(need) + " bytes of scratch");
      // Also during a capture: the allocation is not captured, and graphs captured before keep
      // the old buffer (retired, freed with the executor).
      RelaxedCaptureMode relaxed;
      DeviceBuffer grown;
      if (Status s = grown.allocate(local.device, static_cast<std::size_t>(need)); !s)
        return Status::error("growing the scratch of rank " + std::to_string(local.ranks[li]) +
                             " to " + std::to_string(need) + " bytes: " + s.message());
      local.retired.push_back(std::move(local.private_memory[li]));
      local.private_memory[li] = std::move(grown);
    }
  }
  return Status::ok();
}

Status DeviceExecutor::reserve(uint64_t count, ef::DataType dtype) {
  const auto b = ef::chunk_elements(impl_->program, count);
  if (!b)
    return Status::error("count " + std::to_string(count) + " is not a multiple of " +
                         std::to_string(ef::count_granularity(impl_->program)));
  return impl_->ensure_private_memory(*b, count, ef::size_of(dtype));
}

StatusOr<uint64_t> DeviceExecutor::Impl::largest_private_bytes(const RunArgs& args) const {
  const auto chunk = ef::chunk_elements(program, args.count);
  if (!chunk) return uint64_t{0};  // prepare reports it
  uint64_t largest = 0;
  for (const LocalDevice& local : locals)
    for (int r : local.ranks) {
      auto layout = owned_memory_layout(program, r, *chunk, args.count, ef::size_of(args.dtype));
      if (!layout) return layout.status();
      largest = std::max(largest, layout->bytes);
    }
  return largest;
}

/// In-place ranks use the shared region (NCCL's aliasing, checked); otherwise each program
/// buffer is the API buffer, or executor-owned memory where the API has none.
Status DeviceExecutor::Impl::map_buffers(const LocalDevice& local, std::size_t local_index,
                                         const RunArgs& args, uint64_t chunk_elements,
                                         std::size_t size, std::size_t private_offset,
                                         RankCallArgs& out) const {
  const ef::Program& p = program;
  const int r = local.ranks[local_index];
  const auto who = [r] { return "rank " + std::to_string(r) + ": "; };  // errors only
  // Every size below fits in 64 bits (checked here), so no product or sum wraps.
  auto layout = owned_memory_layout(p, r, chunk_elements, args.count, size);
  if (!layout) return layout.status();
  const uint64_t api[2] = {ef::api_input_elements(p, r, args.count),
                           ef::api_output_elements(p, r, args.count)};
  const uint64_t needed[2] = {layout->input_elements, layout->output_elements};
  char* user[2] = {static_cast<char*>(const_cast<void*>(args.inputs[r])),
                   static_cast<char*>(args.outputs[r])};
  const char* names[2] = {"input", "output"};
  for (int k = 0; k < 2; ++k)
    if (api[k] > 0 && user[k] == nullptr)
      return Status::error(who() + names[k] + " buffer is null");

  // Executor-owned memory: scratch first, then program buffers the API does not provide.
  char* owned = local.private_memory[local_index].get() + private_offset;
  out.buffers[kBufferScratch] = owned;

  const auto alias = args.inplace ? ef::inplace_alias(p, r, args.count) : std::nullopt;
  if (alias) {
    const uint64_t offset[2] = {alias->input_inside_output ? alias->offset_elements : 0,
                                alias->input_inside_output ? 0 : alias->offset_elements};
    const uint64_t shared = alias->input_inside_output ? std::max(api[1], offset[0] + api[0])
                                                       : std::max(api[0], offset[1] + api[1]);
    char* region = alias->input_inside_output ? user[1] : user[0];
    const int inner = alias->input_inside_output ? 0 : 1;
    if (user[inner] != region + alias->offset_elements * size)
      return Status::error(who() +
                           "in-place call, but the buffers do not alias as NCCL requires (" +
                           names[inner] + " == " + names[1 - inner] + " + " +
                           std::to_string(alias->offset_elements) + " elements)");
    for (int k = 0; k < 2; ++k) {
      if (needed[k] > shared - std::min(shared, offset[k]))
        return Status::error(who() + "the program's " + names[k] + " buffer (" +
                             std::to_string(needed[k]) +
                             " elements) does not fit in the in-place "
                             "region of " +
                             std::to_string(shared) + " elements");
      out.buffers[k] = region + offset[k] * size;
    }
    return Status::ok();
  }
  const std::optional<uint64_t> owned_offset[2] = {layout->input_offset, layout->output_offset};
  for (int k = 0; k < 2; ++k) {
    if (needed[k] <= api[k]) {
      out.buffers[k] = user[k];
    } else if (api[k] == 0) {
      out.buffers[k] = owned + *owned_offset[k];  // e.g. the output of a non-root rank of reduce
    } else {
      return Status::error(who() + "the program's " + names[k] + " buffer has " +
                           std::to_string(needed[k]) + " elements but the API's has " +
                           std::to_string(api[k]));
    }
  }
  return Status::ok();
}

}  // namespace efccl::device
