// From the planner's plans to program_builder.h's transfers (docs/balancer.md, "Plans as
// programs"): candidates become routes over program ranks, byte shares become whole chunks,
// and a whole demand matrix becomes one program (`efccl plan -o`).
//
//   balance::RouteResolver routes(table->topology(), rank_gpus, balance::RelayPolicy::kSlotDevice);
//   for (const balance::PairPlan& p : plan.pairs) {
//     balance::ChunkSplit split = *balance::split_into_chunks(p, chunk_bytes);
//     balance::ProgramTransfer t{.sender = p.src, .receiver = p.dst, .chunks = split.chunks};
//     for (const balance::ChunkShare& s : split.shares)
//       t.shares.push_back({*routes.route((*p.candidates)[s.candidate]), s.chunks, 0});
//     ...  // split.tail_bytes travel outside the program, on candidates[0]
//   }
//   ef::Program prog = *balance::build_program(transfers, {.nranks = routes.nranks(),
//                                                         .slot_devices = routes.slot_devices()});
//   // run it with routes.binding(): program rank r on GPU rank_gpus[r], slot device k on
//   // slot_device_gpus[k]
#pragma once

#include <cstdint>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/balance/program_builder.h"

namespace efccl::balance {

/// How a relay GPU (a candidate's relays) becomes part of a program.
enum class RelayPolicy : uint8_t {
  /// Forward through the (lowest) program rank on that GPU; a GPU without one gets a new
  /// program rank that only forwards (no input or output, scratch only).
  kForward,
  /// Forward through a program rank on the GPU; else the connection spanning it keeps its
  /// slots there (a slot device). A connection that already has a slot device forwards
  /// through a new rank instead (two relays without ranks, between hosts).
  kForwardOrSlotDevice,
  /// Slots on the GPU (a slot device) wherever the connection spanning it has none yet (what
  /// the runtime uses across processes); else forward as kForward does.
  kSlotDevice,
};

/// Where a program's ranks and slot devices run, as topology GPU nodes.
struct ProgramBinding {
  std::vector<NodeIndex> rank_gpus;         ///< per program rank
  std::vector<NodeIndex> slot_device_gpus;  ///< per slot device
};

/// Turns candidates into routes over the ranks of one program, adding forwarding ranks and
/// slot devices (one per GPU, numbered in first use) as the policy says. Deterministic.
class RouteResolver {
 public:
  /// `rank_gpus[r]`: program rank r's GPU node in `topology` (the transfers' ranks).
  RouteResolver(const topo::Topology& topology, std::vector<NodeIndex> rank_gpus,
                RelayPolicy policy);
  /// The route of `candidate` (a candidate between two of the program's ranks).
  StatusOr<Route> route(const Candidate& candidate);
  /// The program's ranks so far (the given ones, then forwarding ranks added) and slot devices.
  const ProgramBinding& binding() const { return binding_; }
  int32_t nranks() const { return static_cast<int32_t>(binding_.rank_gpus.size()); }
  int32_t slot_devices() const { return static_cast<int32_t>(binding_.slot_device_gpus.size()); }

 private:
  int32_t rank_on(NodeIndex gpu, bool add);
  int32_t slot_device_on(NodeIndex gpu);

  const topo::Topology& topology_;
  RelayPolicy policy_;
  std::size_t given_ranks_ = 0;
  ProgramBinding binding_;
};

/// One candidate's share of a pair in whole chunks.
struct ChunkShare {
  uint32_t candidate = 0;
  int64_t chunks = 0;
};

/// A pair's split in whole chunks of one size.
struct ChunkSplit {
  std::vector<ChunkShare> shares;  ///< candidate ascending, chunks > 0, adding up to `chunks`
  int64_t chunks = 0;              ///< pair bytes / chunk_bytes (rounded down)
  /// pair bytes % chunk_bytes: the tail is not part of the program; whoever runs it sends the
  /// tail on candidates[0] (the runtime: a send/receive round of its own).
  uint64_t tail_bytes = 0;
};

/// `pair`'s shares in chunks of `chunk_bytes`: each share gets its whole chunks
/// (floor(share / chunk_bytes)); the chunks left over (fewer than the shares) go one each to
/// the shares with the largest remainders (ties: the lower candidate). Exact when every share
/// is a multiple of chunk_bytes. An error for chunk_bytes 0 or more than 2^24 chunks.
StatusOr<ChunkSplit> split_into_chunks(const PairPlan& pair, uint64_t chunk_bytes);

/// `plan` with every pair's bytes on candidates[0]: the program without balancing.
Plan direct_plan(const Plan& plan);

/// The largest chunk size that every pair's bytes and every share of `plan` are whole
/// multiples of (their greatest common divisor), so that a demand program carries the plan
/// exactly; 0 for a plan without bytes.
uint64_t exact_chunk_bytes(const Plan& plan);

/// The chunk size of a demand program: the exact one, or its largest divisor up to
/// `max_chunk_bytes` (still exact; small enough that a share spreads over its channels), when
/// that makes at most `max_chunks` chunks in all; else the smallest multiple of the exact one
/// that divides every pair's bytes and fits (the shares are then rounded to whole chunks, each
/// moving by less than one chunk); else the largest size that divides every pair's bytes. 0
/// for a plan without bytes.
uint64_t demand_chunk_bytes(const Plan& plan, uint64_t max_chunks,
                            uint64_t max_chunk_bytes = UINT64_MAX);

struct DemandProgramOptions {
  RelayPolicy relays = RelayPolicy::kForwardOrSlotDevice;
  /// A share's channels: its candidate's bottleneck / this (what one threadblock moves; the
  /// timing model's threadblock_bandwidth_gbps), rounded up, 1 .. max_channels_per_share.
  double channel_gbps = 25.0;
  int32_t max_channels_per_share = 16;
  ef::Protocol protocol = ef::Protocol::kSimple;
};

/// The all-to-all(v) of a demand as one program.
struct DemandProgram {
  ef::Program program;
  ProgramBinding binding;
  uint64_t chunk_bytes = 0;  ///< the call's count (int8 elements per chunk)
};

/// The program of `plan` over `table`'s ranks in chunks of `chunk_bytes`: rank r's input is
/// its sends to ranks 0..n-1 concatenated, its output its receives from 0..n-1 concatenated
/// (D[s][d] / chunk_bytes chunks each, which must be whole: an error names a pair that is
/// not). Shares become whole chunks by split_into_chunks (exact when they are multiples).
StatusOr<DemandProgram> build_demand_program(const PathTable& table, const Plan& plan,
                                             uint64_t chunk_bytes,
                                             const DemandProgramOptions& options = {});

}  // namespace efccl::balance
