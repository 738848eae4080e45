// The walk both host engines share (docs/ef-format.md §5, docs/timing-model.md "What is
// walked"): every threadblock of every rank is a state machine (iteration, op, unit), every
// connection a FIFO of at most `slots` units, and an op's first unit waits until its
// dependencies completed the same iteration. An event queue ordered by (the time a
// threadblock's next unit can start, threadblock index) decides what runs next; a UnitCost
// decides what running a unit does and how long it takes. The executor's cost moves the data
// and takes no time (so the order is by threadblock index); the timing model's moves nothing
// and prices the unit on the machine's ports.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/ef/program.h"
#include "efccl/host/executor.h"

namespace efccl::host {

/// How a call's chunks are cut into tiles: every chunk into `iterations` tiles of
/// `stride_elements`, the last one possibly shorter.
struct TileGeometry {
  uint64_t chunk_elements = 0;
  uint64_t stride_elements = 1;
  uint64_t iterations = 0;
  std::size_t element_size = 1;

  /// The geometry of a call with `options` (slot_bytes 0: the protocol's default).
  static TileGeometry of(const ef::Program& program, const ExecOptions& options,
                         uint64_t chunk_elements);
  /// First element of iteration `i`'s tile within its chunk.
  uint64_t tile_start(uint64_t i) const { return i * stride_elements; }
  /// Elements of iteration `i`'s tile.
  uint64_t tile_elements(uint64_t i) const {
    return std::min(stride_elements, chunk_elements - tile_start(i));
  }
  /// Bytes of a full tile: the size of one connection slot.
  std::size_t slot_bytes() const {
    return static_cast<std::size_t>(std::min(stride_elements, chunk_elements)) * element_size;
  }
};

/// Where one threadblock is in its program.
struct WalkThreadblock {
  int32_t rank = 0, tb = 0;
  const ef::Threadblock* def = nullptr;
  std::size_t first_op = 0;       ///< index of its op 0 in the walk's per-op arrays
  std::size_t rank_first_tb = 0;  ///< index of its rank's threadblock 0
  int send_connection = -1, recv_connection = -1;
  uint64_t iteration = 0;
  std::size_t op = 0;
  int64_t unit = 0;  ///< units of the current op done in this iteration
  /// Dependencies of the current op known met in this iteration (completion only grows, so
  /// each is checked until met and never again), and the latest time one of them completed.
  std::size_t deps_met = 0;
  double deps_ready = 0;
  double free_at = 0;  ///< when its previous unit ended
  bool done = false;
  bool queued = false;                 ///< its next unit is in the event queue
  std::size_t waits_on_op = SIZE_MAX;  ///< registered as a waiter of this op

  /// The current op's index in the walk's per-op arrays.
  std::size_t op_index() const { return first_op + op; }
};

/// A bounded FIFO of units between two threadblocks, carrying when each unit can be taken.
struct WalkConnection {
  int32_t sender = 0, receiver = 0, channel = 0;
  /// Slots that can ever be in use: the configured slots, or fewer when fewer units are ever
  /// pushed; unit k occupies slot k % capacity.
  std::size_t capacity = 0;
  uint64_t pushed = 0, popped = 0;
  std::deque<double> arrivals;       ///< units pushed and not popped: when each can be popped
  std::vector<double> slot_free_at;  ///< per slot: when its sender learns it is free again
  std::vector<std::size_t> senders, receivers;  ///< threadblock indices (one each when valid)
};

/// One unit about to run, as the walk hands it to a UnitCost.
struct WalkUnit {
  const WalkThreadblock& tb;
  const ef::Op& op;
  uint64_t tile_start = 0;     ///< first element of the tile within each chunk
  uint64_t tile_elements = 0;  ///< elements of the tile
  std::size_t pop_slot = 0;    ///< ops that receive: the slot the unit is taken from
  std::size_t push_slot = 0;   ///< ops that send: the slot the unit is put into
  double ready = 0;            ///< when everything it waits for is there
};

/// What running a unit does and costs.
class UnitCost {
 public:
  virtual ~UnitCost() = default;
  /// Runs `unit`; returns when it ends (not before unit.ready).
  virtual double run(const WalkUnit& unit) = 0;
  /// How long after a unit's end on connection `connection` (an index into the walk's
  /// connections) it reaches the receiver, and a freed slot the sender.
  virtual double latency(std::size_t connection) const = 0;
};

/// The walk of one call of a program.
class ProgramWalk {
 public:
  /// `timed`: keep the completion times dependencies wait for (a cost that takes no time
  /// needs none). `program` must have passed check_indices.
  ProgramWalk(const ef::Program& program, const TileGeometry& tiles, int slots, bool timed);

  /// Builds the threadblocks and the connections (throws std::bad_alloc only).
  void prepare();

  const std::vector<WalkThreadblock>& threadblocks() const { return tbs_; }
  const std::vector<WalkConnection>& connections() const { return connections_; }
  /// Ops of every threadblock together (the size of per-op arrays indexed by op_index()).
  std::size_t op_count() const { return completed_.size(); }

  /// Runs units until every threadblock finished or none can go on; returns the threadblocks
  /// left blocked, with what each waits for (empty: the call completed).
  std::vector<BlockedThreadblock> run(UnitCost& cost);
  /// When the last threadblock finished.
  double finish_time() const { return finish_; }

 private:
  void schedule(std::size_t index);
  void step(std::size_t index, double ready, UnitCost& cost);
  std::string waits_for(const WalkThreadblock& t) const;
  std::size_t target_of(const WalkThreadblock& t, const ef::Dependency& d) const {
    return tbs_[t.rank_first_tb + static_cast<std::size_t>(d.tb)].first_op +
           static_cast<std::size_t>(d.op);
  }

  const ef::Program& program_;
  TileGeometry tiles_;
  uint64_t slots_;
  bool timed_;

  std::vector<WalkThreadblock> tbs_;
  std::vector<WalkConnection> connections_;
  std::vector<uint64_t> completed_;  ///< per op: iterations completed
  /// Timed walks, per op that is a dependency target: when each iteration completed.
  std::vector<std::vector<double>> completion_times_;
  std::vector<bool> is_target_;
  std::vector<std::vector<std::size_t>> op_waiters_;  ///< per op: threadblocks waiting on it
  using Event = std::pair<double, std::size_t>;       ///< (ready time, threadblock)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  std::vector<std::size_t> woken_;  ///< threadblocks to reschedule after a step
  double finish_ = 0;
};

/// The status of a walk that left `blocked` threadblocks out of `threadblocks`: the deadlock
/// error with one line per blocked threadblock.
Status deadlock_status(const std::vector<BlockedThreadblock>& blocked, std::size_t threadblocks);

}  // namespace efccl::host
