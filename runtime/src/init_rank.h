// In-process cliques for ncclCommInitRank, ncclCommInitRankConfig and ncclCommInitRankScalable.
//
// Every call with the same 128-byte unique id (all bytes compared; Scalable: the first id)
// joins one rendezvous, recording its rank, the calling thread's current CUDA device and its
// communicator, which is allocated (pending) at once so that *comm is valid on return. When
// all nranks ranks have joined, the first thread that waits on the rendezvous builds the
// clique exactly as ncclCommInitAll does (devices in rank order; several ranks per GPU are
// fine) and attaches it to every communicator.
//
// Waiting: outside a group the call itself waits; inside one, the outermost ncclGroupEnd does
// (group.h). Both wait until a deadline (EFCCL_INIT_TIMEOUT_MS, default 120000 ms); past it the
// rendezvous fails with ncclInvalidUsage ("only k of n ranks ... joined in this process ...":
// multi-process communicators are not supported yet, efccl issue 5) and its communicators stay
// failed: every call on them but destroy/abort/ncclCommGetAsyncError gives ncclInvalidUsage.
// Destroying or aborting a pending communicator fails its rendezvous at once (the abort path),
// waking every waiter. A rendezvous leaves the registry when complete or failed, so an id
// may be reused afterwards for a new communicator.
//
// Non-blocking communicators (ncclConfig_t::blocking = 0) are accepted and initialized
// synchronously as well: the calls return ncclSuccess, never ncclInProgress, and
// ncclCommGetAsyncError reports ncclSuccess once the clique has formed (ncclInProgress only
// while a grouped init waits for its ncclGroupEnd).
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "api_status.h"

struct ncclComm;

namespace efccl::runtime {

class Rendezvous;

/// What efccl takes from a ncclConfig_t.
struct CommConfig {
  bool blocking = true;
  std::string hints;  ///< performance hints that were set (and are ignored), for the log
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
ApiStatus join_rendezvous(const ncclUniqueId& id, int nranks, int rank, int device,
                          const std::string& device_error, ncclComm* comm,
                          std::shared_ptr<Rendezvous>* out);

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
