// Direct transfers between ranks that address each other's buffers (docs/device-executor.md,
// "Direct transfers"): which matched push/pop pairs of a program may move their data straight
// between the two ranks' buffers instead of through the connection's slots, with results
// unchanged. The engine uses it for ranks that share a GPU in one launch.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::ef {

/// How an op's pop takes its value.
enum class DirectPop : uint8_t {
  kSlot = 0,    ///< from the connection's slot (the FIFO as written)
  kPull = 1,    ///< read from the sender's memory (DirectFlags::pull_from)
  kPushed = 2,  ///< the sender wrote it into this op's dst: nothing to read
};

/// How an op's push delivers its value.
enum class DirectPush : uint8_t {
  kSlot = 0,    ///< into the connection's slot
  kPulled = 1,  ///< nowhere: the receiver reads it where this op's rank holds it
  kPush = 2,    ///< into the receiver's memory (DirectFlags::push_to)
};

/// One op's direct modes. The connection's counters are posted and awaited as with slots, so
/// the ops' order and waits are the program's own; only where the bytes go changes.
struct DirectFlags {
  DirectPop pop = DirectPop::kSlot;
  DirectPush push = DirectPush::kSlot;
  std::optional<BufferRef> pull_from;  ///< kPull: the sender's region (its op's src or dst)
  std::optional<BufferRef> push_to;    ///< kPush: the receiver's region (its op's dst)
};

/// Indexed [rank][tb][op].
using DirectMap = std::vector<std::vector<std::vector<DirectFlags>>>;

/// The direct modes of the connections between the ranks marked in `addressable` (index =
/// rank; both ends must be marked), for one call mode (`inplace` selects NCCL's aliasing of
/// input and output). Requires a valid program (validate() returned no diagnostics). Only
/// Simple programs and connections whose slots live at the receiver take part; everything else
/// keeps kSlot. Per matched pair (the k-th push X of a connection, its k-th pop Y):
///   * push (X writes Y's dst): Y is a recv or rcs, and no op of the receiver but Y and the ops
///     after Y in Y's threadblock reads or writes any chunk of that dst (so the region is
///     untouched until Y completes);
///   * otherwise pull (Y reads X's data where X's rank holds it: a send's src, an rcs's or
///     rrcs's dst): no op of the sender writes any chunk of that region except X itself and
///     the ops before X in X's threadblock (so it holds X's value until the launch ends).
/// Chunk regions are compared whole (tile by tile they are disjoint across iterations, and
/// the ops of a threadblock run in order within one). Premultiplied sends are the caller's
/// concern: a pulled send's src is read unscaled.
DirectMap analyze_direct(const Program& program, bool inplace,
                         const std::vector<bool>& addressable);

}  // namespace efccl::ef
