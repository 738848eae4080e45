// AllToNext (GC3 §6.4), a custom collective for pipeline parallelism: rank r's buffer goes to
// rank r+1; the last rank sends nothing. Ranks are nodes x gpus_per_node (rank = node * gpus +
// g). Inside a node the buffer goes directly. Across a node boundary one GPU pair, and so one
// NIC, would carry everything; instead the last GPU of node n splits its buffer into gpus
// parts, and part c travels through GPU c of node n, over the network to GPU c of node n+1,
// and on to GPU 0 of node n+1, its destination: every NIC of the two nodes carries a share,
// in parallel. (Part gpus-1 starts on the sender's NIC, part 0 ends on the receiver's GPU.)
//
// Every buffer holds channels x gpus chunks: lane k is chunks k*gpus .. k*gpus + gpus-1 and
// travels on channel k (one op per lane inside a node); part c of lane k is its chunk c. The
// trace goes from the last rank backwards, so each rank's input is sent before its output is
// written: the program is correct in-place too. Postconditions: output chunk i of rank r+1 is
// input chunk i of rank r.
#include <vector>

#include "library.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> alltonext(const AlgorithmParams& p, const compiler::CompileOptions& o) {
  const int32_t n = p.ranks;
  if (n < 2) return Status::error("alltonext: needs at least 2 ranks, got " + std::to_string(n));
  const int32_t gpus = n / p.nodes;
  const int32_t ch = p.channels;
  const int64_t chunks = int64_t{gpus} * ch;
  ProgramBuilder b("alltonext", ef::Collective::kCustom, n, chunks, p.inplace, p.protocol,
                   p.instances, o);
  std::vector<ef::Postcondition> post;
  for (int32_t r = 0; r < n; ++r) {
    b.set_buffer_sizes(r, chunks, chunks);
    if (r == 0) continue;
    for (int64_t i = 0; i < chunks; ++i) post.push_back({r, i, {{r - 1, i}}});
  }
  b.set_postconditions(std::move(post));
  // Relay buffers: GPU c of node n is the first hop of part c leaving node n, and GPU c of node
  // n+1 the second.
  const compiler::Buffer outbound = b.scratch_buffer("outbound");
  const compiler::Buffer inbound = b.scratch_buffer("inbound");
  for (int32_t r = n - 2; r >= 0; --r) {
    const int32_t node = r / gpus;
    const int32_t g = r % gpus;
    if (g != gpus - 1) {
      for (int32_t k = 0; k < ch; ++k) {
        b.chunk(r, kInput, int64_t{k} * gpus, gpus)
            .copy(r + 1, kOutput, int64_t{k} * gpus, -1, -1, k);
      }
      continue;
    }
    const int32_t next = r + 1;  // GPU 0 of node + 1
    for (int32_t c = 0; c < gpus; ++c) {
      for (int32_t k = 0; k < ch; ++k) {
        const int64_t i = int64_t{k} * gpus + c;
        Ref x = b.chunk(r, kInput, i);
        if (c != g) x = x.copy(node * gpus + c, outbound, i, -1, -1, k);
        if (c != 0) x = x.copy((node + 1) * gpus + c, inbound, i, -1, -1, k);
        x.copy(next, kOutput, i, -1, -1, k);
      }
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
