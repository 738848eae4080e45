// One balanced send/receive transfer as an EF program (docs/balancer.md, "In the runtime"):
// the planner's split of the transfer's pair over candidate paths becomes whole chunks over
// routes (program_builder.h), one program per transfer, so that buffers at any offset work
// (all_to_all_single with uneven splits): the sender's buffer is the program's input, the
// receiver's its output, whatever else either rank sends or receives.
//
//   BalancedTransfer t = **build_balanced_transfer(0, 1, bytes, pair_plan, relays);
//   // run t.program over clique ranks t.ranks with count t.chunk_bytes (int8); the last
//   // bytes - t.main_bytes bytes travel on the default path (a plain send/receive round)
//
// A relay GPU (a candidate through another GPU) becomes a forwarding rank (a rank taking part
// in the group that runs on that GPU; recv -> send through a small scratch) where one exists
// and the caller allows it, else a slot device: the connection's slots live in that GPU's
// memory, written by the sender and read by the receiver, no kernel running there. Pinned host
// memory is the host path. CUDA-free; equal inputs give equal programs, byte for byte (both
// processes of a pair derive the same one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/balance/program_builder.h"
#include "efccl/common/status.h"
#include "efccl/ef/program.h"

namespace efccl::runtime {

/// Which candidates a transfer may use, and how relays are served.
struct RelayResolution {
  /// The clique rank that forwards through GPU node `gpu` (a rank taking part in the group,
  /// neither end of the transfer), or -1 (none may: a slot device, if usable). Null: never.
  std::function<int32_t(topo::NodeIndex gpu)> forwarder;
  /// Whether GPU node `gpu` may hold a connection's slots. Null: never.
  std::function<bool(topo::NodeIndex gpu)> slot_device_usable;
  bool host_usable = true;  ///< pinned host memory
};

/// Whether `c` can be run under `relays` (between hosts: only the default path, for now).
bool candidate_usable(const balance::Candidate& c, const RelayResolution& relays);

/// `pair` with the bytes of every share on a candidate that is not usable moved to
/// candidates[0] (shares merged, candidate ascending).
balance::PairPlan usable_shares(const balance::PairPlan& pair, const RelayResolution& relays);

/// `pair` split evenly over every usable candidate (EFCCL_BALANCE_FORCE=spread; tests), the
/// remainder on candidates[0].
balance::PairPlan spread_over_candidates(const balance::PairPlan& pair,
                                         const RelayResolution& relays);

/// How a transfer of `bytes` is cut into chunks: `chunks` chunks of `chunk_bytes`, the tail
/// (bytes - chunks * chunk_bytes, under 16 KiB) on the default path. chunks 0: too small.
struct TransferChunks {
  int64_t chunks = 0;
  uint64_t chunk_bytes = 0;
};
TransferChunks chunks_of(uint64_t bytes);

/// A transfer's program and what runs it.
struct BalancedTransfer {
  ef::Program program;                            ///< program rank 0 sends, 1 receives, 2.. forward
  std::vector<int32_t> ranks;                     ///< program rank -> clique rank
  std::vector<topo::NodeIndex> slot_device_gpus;  ///< per slot device: its GPU node
  uint64_t chunk_bytes = 0;                       ///< the run's count (int8 elements per chunk)
  int64_t chunks = 0;
  uint64_t main_bytes = 0;     ///< chunks * chunk_bytes, from the buffers' start
  std::size_t slot_bytes = 0;  ///< ExecutorConfig::slot_bytes
  /// Equal signatures: equal programs and slot bytes (the executor cache key's program part;
  /// the same in every process).
  std::string signature;
  struct Share {
    uint32_t candidate = 0;
    balance::Route route;  ///< over program ranks
    int64_t chunks = 0;
    int32_t channels = 0;
    std::string text;  ///< "direct", "host memory", "relay h0.gpu2 (forwarded by rank 2)", ...
  };
  std::vector<Share> shares;  ///< candidate ascending
  /// The pair's candidates the shares index (the plan's).
  std::shared_ptr<const std::vector<balance::Candidate>> candidates;
};

/// The program of `bytes` from clique rank `sender` to `receiver` split as `pair` (a plan of
/// that pair, whose shares give the fractions; only usable candidates), or nullopt when the
/// split leaves every whole chunk on candidates[0] or the transfer is too small to split.
StatusOr<std::optional<BalancedTransfer>> build_balanced_transfer(int32_t sender, int32_t receiver,
                                                                  uint64_t bytes,
                                                                  const balance::PairPlan& pair,
                                                                  const RelayResolution& relays);

}  // namespace efccl::runtime
