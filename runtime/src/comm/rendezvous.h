// ncclCommInitRank, ncclCommInitRankConfig and ncclCommInitRankScalable (Scalable: the first id).
//
// Each rank announces itself to the root named by the unique id (bootstrap.h), which sends every
// rank the table of all ranks (host, pid, GPU). Ranks of one process meet in an in-process
// rendezvous keyed by the id's 128 bytes, recording rank, the calling thread's CUDA device and
// the communicator, which is allocated (pending) at once so that *comm is valid on return.
// Once the table is known and every rank of this process has joined, the first waiting thread
// builds the clique of this process's ranks: all ranks when they all live here (exactly as
// ncclCommInitAll; several ranks per GPU are fine), else a clique of the local ranks with a
// ProcessMap (clique.h) whose kernels reach the other processes through CUDA IPC.
//
// Waiting: outside a group the call itself waits; inside one, the outermost ncclGroupEnd does
// (group.h). Both wait until a deadline (EFCCL_INIT_TIMEOUT_MS, default 120000 ms); past it the
// rendezvous fails ("only k of n ranks joined the rendezvous at ADDRESS ...") and its
// communicators stay failed: every call on them but destroy/abort/ncclCommGetAsyncError gives
// ncclInvalidUsage. Destroying or aborting a pending communicator fails its rendezvous at once
// (the abort path), waking every waiter. As with NCCL, an id serves one communicator: its root
// exits once the rendezvous completed.
//
// Non-blocking communicators (ncclConfig_t::blocking = 0) outside a group return ncclInProgress
// at once; a helper thread completes the rendezvous, and ncclCommGetAsyncError reports
// ncclInProgress until the clique has formed, then ncclSuccess (or the failure). Inside a group
// the outermost ncclGroupEnd completes them as it does blocking ones.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "efccl/common/status.h"

struct ncclComm;

namespace efccl::runtime {

class Rendezvous;

/// A ncclConfig_t kept beyond the call that passed it, for the real NCCL communicator of
/// EFCCL_FALLBACK=nccl (fallback.h): its fields as parse_config read them, strings owned.
struct RealConfig {
  ncclConfig_t fields = NCCL_CONFIG_INITIALIZER;
  std::optional<std::string> net_name, comm_name;
  /// A config of this header's version carrying the fields, its strings pointing here.
  ncclConfig_t get() const;
};

/// What efccl takes from a ncclConfig_t.
struct CommConfig {
  bool blocking = true;
  std::string hints;  ///< performance hints that were set (and are ignored), for the log
  RealConfig real;
};

/// Reads `config` as NCCL 2.28 does: `size` bytes at most (the rest default), fields newer than
/// `version` default; magic and version must be NCCL_CONFIG_INITIALIZER's, values that nccl.h
/// or NCCL rejects give ncclInvalidArgument. Null: the defaults.
ApiStatus parse_config(const ncclConfig_t* config, CommConfig* out);

/// How long ranks wait for each other: EFCCL_INIT_TIMEOUT_MS, default 120000.
std::chrono::milliseconds init_timeout();

/// Records the pending `comm` as rank `rank` of the rendezvous of `id`. `device` < 0: the
/// thread had no CUDA device (`device_error` says why; the clique build reports it).
/// A rank that already joined, or an nranks unlike the others', is ncclInvalidArgument.
/// `local_only`: every rank of `id` joins in this process (a split of a single-process
/// communicator, whose id no root serves); no bootstrap is used. `driver`: the thread that
/// will drive the rank (this_thread_token() of the thread that called ncclCommInitRank*, or
/// ncclCommSplit/Shrink: a grouped split across processes joins on a helper thread); 0: this
/// thread.
ApiStatus join_rendezvous(const ncclUniqueId& id, int nranks, int rank, int device,
                          const std::string& device_error, ncclComm* comm,
                          std::shared_ptr<Rendezvous>* out, bool local_only = false,
                          uint64_t driver = 0);

/// ncclCommSplit/Shrink of a communicator whose ranks all live in this process: rank `rank` of
/// `participants` (ascending ranks of the parent) contributes `mine` to meeting `seq` of
/// `parent` (the clique); returns everyone's contributions in `participants` order once all
/// have arrived (one thread per rank), or an error at `deadline`.
StatusOr<std::vector<std::string>> meet_in_process(const void* parent, uint64_t seq,
                                                   const std::vector<int>& participants, int rank,
                                                   std::string mine,
                                                   std::chrono::steady_clock::time_point deadline);
/// meet_in_process in two steps, so that one thread can take part for several ranks (a
/// grouped split): offer_in_process contributes without waiting; collect_in_process then
/// waits for the others as meet_in_process does. Every offer must be followed by its collect.
void offer_in_process(const void* parent, uint64_t seq, const std::vector<int>& participants,
                      int rank, std::string mine);
StatusOr<std::vector<std::string>> collect_in_process(const void* parent, uint64_t seq,
                                                      const std::vector<int>& participants,
                                                      std::chrono::steady_clock::time_point deadline);

/// Waits until every rank has joined (until `deadline`, then fails the rendezvous), builds the
/// clique if no other thread is building it, and returns how the rendezvous ended.
/// `timeout` only words the timeout message.
ApiStatus complete_rendezvous(const std::shared_ptr<Rendezvous>& r,
                              std::chrono::steady_clock::time_point deadline,
                              std::chrono::milliseconds timeout);

/// Fails a rendezvous that has not formed yet with `why` (its group failed).
void cancel_rendezvous(const std::shared_ptr<Rendezvous>& r, const ApiStatus& why);

/// ncclCommDestroy / ncclCommAbort of a communicator from ncclCommInitRank*: removes it from its
/// rendezvous (nothing touches it afterwards) and, if the clique has not formed, fails the
/// rendezvous for every other rank.
void leave_rendezvous(ncclComm* comm, bool abort);

/// For tests: how many ranks have joined the rendezvous of `id` that is still collecting
/// (0: none is).
int joined_ranks(const ncclUniqueId& id);

}  // namespace efccl::runtime
