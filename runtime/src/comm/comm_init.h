// Creating and releasing communicators: ncclCommInitAll, ncclCommInitRank* (through the
// rendezvous of their unique id, comm/rendezvous.h), ncclCommDestroy and ncclCommAbort.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>

#include "base/api_status.h"

namespace efccl::runtime {

class Rendezvous;

/// The most ranks a communicator may have: larger counts are refused before anything is sized
/// by them (ncclInvalidArgument).
inline constexpr int kMaxCommRanks = 1 << 20;

/// ncclCommInitAll: `ndev` ranks in this process on `devlist` (null: devices 0..ndev-1).
ApiStatus init_all(ncclComm_t* comms, int ndev, const int* devlist);

/// ncclCommInitRank* of one rank: checks the arguments, allocates the pending communicator
/// (*newcomm valid on return, as NCCL), joins the id's rendezvous and, outside a group, waits
/// for the clique (non-blocking configs: ncclInProgress, a helper thread waits). `local_only`:
/// every rank of `id` is in this process (a single-process split). `joined` (a grouped split):
/// the rendezvous is handed there instead, for the caller to complete. `driver`: the thread
/// that will drive the rank (0: this one).
ApiStatus init_rank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank,
                    const ncclConfig_t* config, bool local_only = false,
                    std::shared_ptr<Rendezvous>* joined = nullptr, uint64_t driver = 0);

/// ncclCommDestroy (`abort` false) / ncclCommAbort: the handle dies at once; the clique (and its
/// executors) when its last communicator goes. Null is fine (as NCCL).
ApiStatus release_comm(ncclComm_t comm, bool abort);

/// Writes the version line once per process (NCCL_DEBUG=VERSION and above).
void log_version_once();

}  // namespace efccl::runtime
