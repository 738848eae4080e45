// The tuning table: which built-in algorithm runs a collective, and with how many instances
// (parallel copies of the program on separate channels, hence CTAs), by size. All tuning
// numbers live in tuning.cc so that they can be read, and changed, in one place.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "efccl/ef/program.h"
#include "select/host_layout.h"

namespace efccl::runtime {

/// A built-in algorithm, its instance count and protocol for one call.
struct BuiltinChoice {
  std::string_view
      algorithm;  ///< a name of the algorithm library (efccl/algorithms/algorithm_library.h)
  int32_t instances = 1;
  /// The protocol measured fastest for the size (before NCCL_PROTO; ProgramRegistry applies it).
  ef::Protocol protocol = ef::Protocol::kSimple;
  std::string why;  ///< the table row that matched, for the INFO log
  int32_t channels = 1;  ///< lanes inside one instance (multilane_allreduce)
  /// Hierarchical algorithms: ranks = nodes x gpus_per_node (AlgorithmParams); 1 otherwise.
  int32_t nodes = 1;
  /// A program of mrc ops for ranks sharing one launch (lanes = instances x channels per rank).
  bool shared_launch = false;
};

/// `bytes` is the whole call's data (NCCL count x nranks x element size for the collectives
/// whose count is per block, count x element size otherwise).
BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes);
/// The same for a communicator whose ranks lie on `hosts`: where they span several hosts in
/// equal contiguous blocks of at least 2 ranks, the multi-host rows first (allreduce: all-pairs
/// for small calls, then multi-lane and hierarchical programs that cross hosts once per lane;
/// alltoall from 4 ranks per host: the two-step program), else the rows above.
BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts);
/// The same where every rank shares one launch (one process, one GPU) when `shared_launch`:
/// allreduce, allgather, reduce-scatter, broadcast and reduce of 2..16 ranks then run the
/// library's shared_gpu_* programs (one pass over every rank's buffers per chunk), the rest
/// (alltoall, gather, scatter) as above.
BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts, bool shared_launch);
/// The same for a communicator whose GPUs each hold ranks of several processes
/// (`ranks_per_shared_gpu`: the most ranks on one of them; 0 where some rank has a GPU of its
/// own process, or where that is unknown): with two ranks per GPU (the case measured), from
/// 4 MiB the rings of allreduce, allgather and reduce-scatter give each rank 64 CTAs (32
/// instances x 2 lanes, instead of 16 or 32) — the ranks move data within one GPU's memory,
/// not over a link that 32 CTAs fill. Other counts of ranks per GPU keep the rows above.
BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts, bool shared_launch,
                             int32_t ranks_per_shared_gpu);

/// Channels (CTAs per direction) for one point-to-point transfer of `bytes`: the tuning table's,
/// within the bounds NCCL_MIN_P2P_NCHANNELS / NCCL_MAX_P2P_NCHANNELS gave at the first call.
int32_t p2p_channels(uint64_t bytes);
/// The same within explicit {min, max} bounds.
int32_t p2p_channels(uint64_t bytes, std::pair<int32_t, int32_t> bounds);
/// NCCL_MIN_P2P_NCHANNELS / NCCL_MAX_P2P_NCHANNELS as set now: {1, 64} where unset; a value that
/// is not a number from 1 to 64 is ignored with a warning naming it; min > max gives {max, max}.
std::pair<int32_t, int32_t> p2p_channel_bounds();
/// The protocol measured fastest for a point-to-point transfer of `bytes` (before NCCL_PROTO).
ef::Protocol p2p_protocol(uint64_t bytes);

}  // namespace efccl::runtime
