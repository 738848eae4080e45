// What a process group's works, its watchdog and efccl.torch.stats() share, and that outlives
// the process group object while works remain: who the group is, whether it has failed (and
// why), and its statistics.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "efccl/runtime/extensions.h"

namespace efccl::torch_backend {

/// Who a process group is: for messages and the store keys of its reports.
struct GroupIdentity {
  std::string name;  ///< torch's group name (its uid)
  int rank = 0;      ///< this process's rank in the group
  int size = 0;
  std::vector<int64_t> global_ranks;  ///< global rank of each group rank (empty: the same)

  /// "rank 1 (global rank 3)", or "rank 1" where both agree.
  std::string describe_rank(int group_rank) const;
  /// "process group 'NAME' (rank R of N)".
  std::string describe() const;
};

/// Counters of one collective kind.
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;     ///< this rank's payload bytes (input, or output for gathers)
  uint64_t captured = 0;  ///< calls recorded into a CUDA graph (counted once, at capture)
};

/// A program efccl ran for a collective of this group, and how often.
struct ProgramUse {
  std::string collective;
  std::string program;
  std::string source;
  std::string reason;  ///< the latest reason given
  bool skipped = false;
  uint64_t selections = 0;
};

class GroupState {
 public:
  explicit GroupState(GroupIdentity identity) : identity_(std::move(identity)) {}

  const GroupIdentity& identity() const { return identity_; }

  /// Records the group's first failure; later ones are ignored. Returns whether this call
  /// recorded it.
  bool fail(const std::string& reason);
  /// Whether the group has failed (or was aborted).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// The first failure's text ("" when none).
  std::string failure() const;
  /// Throws c10::DistBackendError with the failure when the group has failed.
  void throw_if_failed(const char* op) const;

  void record_call(const char* collective, uint64_t bytes, bool captured);
  void record_peer_bytes(int peer, uint64_t sent, uint64_t received);
  void record_selection(const efcclSelection_t& selection);

  /// The statistics as JSON text (efccl.torch.stats parses it).
  std::string stats_json(const std::string& device, const std::string& origin, int pending) const;

 private:
  const GroupIdentity identity_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::string failure_;
  std::map<std::string, CollectiveStats> collectives_;
  std::map<int, std::pair<uint64_t, uint64_t>> peer_bytes_;  ///< peer -> (sent, received)
  std::vector<ProgramUse> programs_;
};

/// The group whose efccl calls the current thread is making (selections made during them are
/// its); null outside them. SelectionScope sets it.
GroupState*& current_selection_group();

/// Attributes the selections efccl reports during its lifetime to `group`.
class SelectionScope {
 public:
  explicit SelectionScope(GroupState* group) : previous_(current_selection_group()) {
    current_selection_group() = group;
  }
  ~SelectionScope() { current_selection_group() = previous_; }
  SelectionScope(const SelectionScope&) = delete;
  SelectionScope& operator=(const SelectionScope&) = delete;

 private:
  GroupState* previous_;
};

/// The callback given to efcclSetSelectionCallback: records into current_selection_group().
void on_selection(const efcclSelection_t* selection, void* user);

}  // namespace efccl::torch_backend
