// Where the ranks of a single-process communicator meet for ncclCommSplit/Shrink (no bootstrap
// serves them): each contributes a blob, and all get everyone's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::runtime {

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
StatusOr<std::vector<std::string>> collect_in_process(
    const void* parent, uint64_t seq, const std::vector<int>& participants,
    std::chrono::steady_clock::time_point deadline);

}  // namespace efccl::runtime
