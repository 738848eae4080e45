// ncclCommSplit and ncclCommShrink: the participating ranks of a parent communicator exchange
// (color, key); the ranks of one color, ordered by (key, parent rank), form a new communicator,
// initialised like ncclCommInitRank with an id made by its new rank 0 (multi-process parents:
// shared through the parent's bootstrap; single process: an in-process id no root serves), on
// the parent's GPU. Outside a group at once; inside one at the outermost ncclGroupEnd
// (comm/grouped_init.h).
#pragma once

#include <nccl.h>

#include <vector>

#include "base/api_status.h"

namespace efccl::runtime {

/// One rank's split (`fn` names the entry point for messages): `participants` are the ascending
/// parent ranks taking part (the caller among them); `*newcomm` gets the caller's new
/// communicator, or null for NCCL_SPLIT_NOCOLOR.
ApiStatus regroup(const char* fn, ncclComm_t parent, std::vector<int> participants, int color,
                  int key, ncclComm_t* newcomm, const ncclConfig_t* config);

}  // namespace efccl::runtime
