// Send/recv as a library program: a custom collective of two ranks in which rank 0's input
// arrives in rank 1's output, chunk c on channel c. Both ranks have both buffers (as in an
// NCCL call, where each passes a buffer of `count` elements); rank 0's output and rank 1's
// input are not used, and the postconditions name only rank 1's output.
#include <vector>

#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;

StatusOr<ef::Program> send_recv(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  if (p.ranks != 2) {
    return Status::error("send_recv: defined for exactly 2 ranks (0 sends, 1 receives), got " +
                         std::to_string(p.ranks));
  }
  const int32_t ch = p.channels;
  ProgramBuilder b("send_recv", ef::Collective::kCustom, 2, ch, p.inplace, p.protocol, p.instances,
                   o);
  b.set_buffer_sizes(0, ch, ch);
  b.set_buffer_sizes(1, ch, ch);
  std::vector<ef::Postcondition> post;
  for (int32_t c = 0; c < ch; ++c) post.push_back({1, c, {{0, c}}});
  b.set_postconditions(std::move(post));
  for (int32_t c = 0; c < ch; ++c) b.chunk(0, kInput, c).copy(1, kOutput, c, -1, -1, c);
  return b.compile();
}

}  // namespace efccl::algorithms::detail
