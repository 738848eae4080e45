// The rendezvous of ncclCommInitRank, ncclCommInitRankConfig and ncclCommInitRankScalable
// (comm/comm_init.h): how the ranks of one unique id become communicators.
//
// Each rank announces itself to the root named by the unique id (see net/), which sends every
// rank the table of all ranks (host, pid, GPU). Ranks of one process meet in an in-process
// rendezvous keyed by the id's 128 bytes, recording rank, the calling thread's CUDA device and
// the communicator, which is allocated (pending) at once so that *comm is valid on return.
// Once the table is known and every rank of this process has joined, the first waiting thread
// builds the clique of this process's ranks: all ranks when they all live here (exactly as
// ncclCommInitAll; several ranks per GPU are fine), else a clique of the local ranks with a
// ProcessMap (launch/process_map.h) whose kernels reach the other processes through CUDA IPC.
//
// Waiting: outside a group the call itself waits; inside one, the outermost ncclGroupEnd does
// (comm/grouped_init.h). Both wait until a deadline (EFCCL_INIT_TIMEOUT_MS, default 120000 ms,
// from the ncclCommInitRank* call on); past it the rendezvous fails ("only k of n ranks joined
// the rendezvous at ADDRESS ...") and its communicators stay failed: every call on them but
// destroy/abort/ncclCommGetAsyncError gives ncclInvalidUsage. Destroying or aborting a pending
// communicator fails its rendezvous at once (the abort path), waking every waiter. As with NCCL, an
// id serves one communicator: its root exits once the rendezvous completed.
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
#include "efccl/net/deadline.h"

struct ncclComm;

namespace efccl::runtime {

class Rendezvous;

/// Records the pending `comm` as rank `rank` of the rendezvous of `id`. `device` < 0: the
/// thread had no CUDA device (`device_error` says why; the clique build reports it).
/// `deadline`: the whole init's, made at the API call (the bootstrap reports its budget).
/// A rank that already joined, or an nranks unlike the others', is ncclInvalidArgument.
/// `local_only`: every rank of `id` joins in this process (a split of a single-process
/// communicator, whose id no root serves); no bootstrap is used. `driver`: the thread that
/// will drive the rank (this_thread_token() of the thread that called ncclCommInitRank*, or
/// ncclCommSplit/Shrink: a grouped split across processes joins on a helper thread); 0: this
/// thread. `deadline`: the end of the whole init (the bootstrap gives up connecting then).
ApiStatus join_rendezvous(const ncclUniqueId& id, int nranks, int rank, int device,
                          const std::string& device_error, ncclComm* comm,
                          std::shared_ptr<Rendezvous>* out, net::Deadline deadline,
                          bool local_only = false, uint64_t driver = 0);

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
