// Executor-owned memory of a rank: sizes checked for overflow.
#include "owned_memory_layout.h"

#include <algorithm>
#include <string>

#include "checked_size.h"

namespace efccl::device {

StatusOr<OwnedMemoryLayout> owned_memory_layout(const ef::Program& program, int rank,
                                                uint64_t chunk_elements, uint64_t count,
                                                std::size_t element_size) {
  const ef::Rank& r = program.ranks.at(static_cast<std::size_t>(rank));
  const auto who = [rank] { return "rank " + std::to_string(rank) + ": "; };
  OwnedMemoryLayout layout;
  // Every program buffer, whoever provides it: the kernel addresses it in bytes.
  const struct {
    const char* name;
    int64_t chunks;
    uint64_t* elements;
  } buffers[] = {{"input", r.input_chunks, &layout.input_elements},
                 {"output", r.output_chunks, &layout.output_elements},
                 {"scratch", r.scratch_chunks, nullptr}};
  uint64_t bytes[3] = {};
  for (int k = 0; k < 3; ++k) {
    const auto elements =
        checked_mul(static_cast<uint64_t>(std::max<int64_t>(buffers[k].chunks, 0)), chunk_elements);
    const auto size = elements ? checked_mul(*elements, element_size) : std::nullopt;
    const auto aligned = size ? checked_align_up(*size, kOwnedAlignment) : std::nullopt;
    if (!aligned)
      return Status::error(who() + "the program's " + buffers[k].name + " buffer of " +
                           std::to_string(buffers[k].chunks) + " chunks of " +
                           std::to_string(chunk_elements) + " elements of " +
                           std::to_string(element_size) + " bytes overflows 64-bit sizes");
    if (buffers[k].elements != nullptr) *buffers[k].elements = *elements;
    bytes[k] = *aligned;
  }
  // The API's buffers (the kernel addresses the in-place region in bytes too).
  const uint64_t api[2] = {ef::api_input_elements(program, rank, count),
                           ef::api_output_elements(program, rank, count)};
  for (uint64_t elements : api)
    if (!checked_mul(elements, element_size))
      return Status::error(who() + "an API buffer of " + std::to_string(elements) +
                           " elements overflows 64-bit sizes");
  if (const auto alias = ef::inplace_alias(program, rank, count)) {
    // The shared region: the outer buffer, or the inner one at its offset if that reaches further.
    const auto inner_end =
        checked_add(alias->offset_elements, api[alias->input_inside_output ? 0 : 1]);
    if (!inner_end || !checked_mul(*inner_end, element_size))
      return Status::error(who() + "the in-place region overflows 64-bit sizes");
  }

  layout.scratch_bytes = bytes[2];
  uint64_t total = bytes[2];
  for (int k = 0; k < 2; ++k) {
    const uint64_t elements = k == 0 ? layout.input_elements : layout.output_elements;
    if (elements == 0 || api[k] != 0) continue;  // nothing, or the API's buffer
    const auto next = checked_add(total, bytes[k]);
    if (!next) return Status::error(who() + "executor-owned memory overflows 64-bit sizes");
    (k == 0 ? layout.input_offset : layout.output_offset) = total;
    total = *next;
  }
  layout.bytes = total;
  return layout;
}

StatusOr<uint64_t> owned_bytes_for_uses(uint64_t instances, uint64_t stride) {
  const auto bytes = checked_mul(instances, stride);
  if (!bytes)
    return Status::error(std::to_string(instances) + " uses of " + std::to_string(stride) +
                         " bytes of executor-owned memory overflow 64-bit sizes");
  return *bytes;
}

}  // namespace efccl::device
