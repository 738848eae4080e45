// The built-in algorithm library: named EF program generators, each written with the chunk
// API of efccl_compiler (efccl/compiler/program_builder.h). The CLI (`efccl list-algorithms`,
// `efccl generate NAME --ranks N ...`) and the runtime's program registry call these two
// functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/compiler/program_builder.h"
#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::algorithms {

/// What to generate. Every algorithm takes every field; where one does not apply (e.g. the
/// node split for a single-level ring) it is checked and otherwise ignored.
struct AlgorithmParams {
  int32_t ranks = 0;
  int32_t nodes = 1;          ///< hierarchical algorithms: rank = node * gpus_per_node + gpu
  int32_t gpus_per_node = 0;  ///< 0: ranks / nodes
  int32_t instances = 1;      ///< GC3 instances: the whole program replicated on more channels
  int32_t channels = 1;       ///< parallel rings / chunk lanes inside one instance
  int32_t root = 0;           ///< broadcast, reduce, gather, scatter
  ef::Protocol protocol = ef::Protocol::kSimple;
  /// false: an out-of-place program, also marked in-place when it is correct under NCCL's
  /// aliasing; true: a program for in-place calls only (may avoid scratch or copies).
  bool inplace = false;
  std::optional<uint64_t> min_bytes;  ///< default: the algorithm's own range
  std::optional<uint64_t> max_bytes;
  compiler::CompileOptions options;  ///< pass switches; root, min/max bytes are set from here
};

/// One entry of list_algorithms().
struct AlgorithmInfo {
  std::string name;  ///< e.g. "ring_allreduce"
  ef::Collective collective = ef::Collective::kAllReduce;
  std::string description;
  uint64_t default_min_bytes = 0;
  std::optional<uint64_t> default_max_bytes;  ///< nullopt: unbounded
  int32_t min_ranks = 1;                      ///< the rank counts the algorithm is defined for
  int32_t max_ranks = 4096;
  int32_t max_channels = 32;  ///< 1: the algorithm has no channel parameter
  bool hierarchical = false;  ///< shaped by nodes x gpus_per_node (others ignore the split)
  /// Its programs use mrc ops: they run only where every rank shares one launch (ranks of one
  /// process on one GPU), and on the host executor.
  bool shared_launch = false;
};

/// Every algorithm generate_algorithm() knows, sorted by name.
std::vector<AlgorithmInfo> list_algorithms();

/// The program of algorithm `name` for `params`, validated; an error names the bad parameter
/// or lists the known algorithms for an unknown name.
StatusOr<ef::Program> generate_algorithm(std::string_view name, const AlgorithmParams& params);

}  // namespace efccl::algorithms
