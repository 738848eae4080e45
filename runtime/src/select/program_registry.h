// The program registry of one clique: which EF program runs a collective call. User programs
// (EFCCL_ALGO_DIR, EFCCL_ALGO_FILES, read when the communicators are created) first, then the
// built-in algorithm library chosen by the tuning table, unless EFCCL_BUILTINS=0 leaves only the
// user programs (MSCCL's mode; with EFCCL_FALLBACK=nccl, NCCL runs what they do not cover).
// Programs are generated once and cached; the pointers returned stay valid for the registry's
// lifetime (executors are keyed by them).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/ef/datatype.h"
#include "efccl/ef/program.h"
#include "efccl/runtime/observer.h"
#include "select/host_layout.h"
#include "select/protocol_filter.h"

namespace efccl::runtime {

/// What selection needs to know about a collective call (identical on every rank).
struct CallShape {
  ef::Collective collective = ef::Collective::kAllReduce;
  int32_t nranks = 0;
  int32_t root = 0;
  uint64_t count = 0;  ///< NCCL's count
  ef::DataType dtype = ef::DataType::kFloat32;
  bool inplace = false;
};

/// Part of a call run by one program: elements [offset, offset + count) of every rank's
/// buffers (offset is nonzero only for element-wise collectives split into body and tail).
struct PlanPiece {
  const ef::Program* program = nullptr;
  uint64_t offset = 0;
  uint64_t count = 0;
};

/// The programs that run a call, and why they were chosen (for the INFO log).
struct Plan {
  std::vector<PlanPiece> pieces;
  std::string reason;
  bool builtin = false;  ///< the built-in library's programs (not a user program)
};

class ProgramRegistry {
 public:
  /// Reads user programs and EFCCL_BUILTINS from the environment; bad files are logged and
  /// skipped.
  static std::unique_ptr<ProgramRegistry> from_environment();
  /// For tests: user programs given directly (already loaded), a protocol filter, and whether
  /// the built-in library may be used.
  ProgramRegistry(std::vector<std::pair<ef::Program, std::string>> user_programs,
                  ProtocolFilter filter, bool builtins = true);

  /// The plan for one call, or why there is none. Plans are remembered per call shape (a
  /// program loop calls the same few shapes over and over); the observer still sees every
  /// selection, and the logs name the program of every call (launch/collective_runner.h).
  StatusOr<Plan> select(const CallShape& call);
  /// `preferred` (the tuning table's) when NCCL_PROTO allows it, else the first protocol it
  /// allows of Simple, LL128, LL (Simple when it allows none).
  ef::Protocol allowed_protocol(ef::Protocol preferred) const;
  /// The protocol of a point-to-point round moving transfers of `bytes`.
  ef::Protocol p2p_protocol(uint64_t bytes) const;

  std::size_t user_program_count() const { return user_.size(); }
  /// Where the communicator's ranks run (set once, before the first select()): the tuning
  /// table picks hierarchical programs for communicators spanning hosts.
  void set_host_layout(const HostLayout& hosts) { hosts_ = hosts; }
  const HostLayout& host_layout() const { return hosts_; }
  /// Whether every rank runs every call in one launch (one process, one GPU; set once, before
  /// the first select()): the tuning table may then pick programs of mrc ops.
  void set_shared_launch(bool shared) { shared_launch_ = shared; }
  bool shared_launch() const { return shared_launch_; }
  /// The most ranks on one GPU where every GPU of the communicator holds ranks of several
  /// processes, else 0 (set once, before the first select()): the tuning table then gives the
  /// rings more CTAs (tuning.h).
  void set_ranks_per_shared_gpu(int32_t n) { ranks_per_shared_gpu_ = n; }
  int32_t ranks_per_shared_gpu() const { return ranks_per_shared_gpu_; }

 private:
  struct UserProgram {
    ef::Program program;
    std::string file;
  };
  /// The shape of a built-in program beyond the call's: instances, lanes, hierarchy.
  struct BuiltinShape {
    int32_t instances = 1;
    int32_t channels = 1;
    int32_t nodes = 1;
  };
  StatusOr<const ef::Program*> builtin(const std::string& algorithm, const CallShape& call,
                                       const BuiltinShape& shape, bool inplace_variant,
                                       ef::Protocol protocol);
  StatusOr<Plan> select_uncached(const CallShape& call, std::vector<SelectionRecord>* records);
  using ShapeKey = std::tuple<int, int32_t, int32_t, uint64_t, int, bool>;
  struct CachedPlan {
    Plan plan;
    std::vector<SelectionRecord> records;  ///< what the observer was told, in order
  };
  std::mutex cache_mu_;
  std::map<ShapeKey, CachedPlan> cache_;  ///< successful selections; cleared when it grows large
  std::vector<UserProgram> user_;
  ProtocolFilter filter_;
  bool use_builtins_ = true;
  ef::Protocol fallback_protocol_ = ef::Protocol::kSimple;  ///< when the preferred is excluded
  HostLayout hosts_;
  bool shared_launch_ = false;
  int32_t ranks_per_shared_gpu_ = 0;
  /// By (algorithm, nranks, root, instances, channels, nodes, in-place variant, protocol).
  std::map<std::tuple<std::string, int32_t, int32_t, int32_t, int32_t, int32_t, bool, ef::Protocol>,
           std::unique_ptr<ef::Program>>
      builtins_;
};

}  // namespace efccl::runtime
