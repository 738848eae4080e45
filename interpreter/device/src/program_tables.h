// The kernel's tables for one device (kernel_params.h) built from an ef::Program (pure C++, no
// CUDA): one ThreadblockDesc per threadblock of the device's ranks, their ops and dependencies,
// the number of dependency flags, and integer avg's result regions.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/ef/premul_analysis.h"
#include "efccl/ef/program.h"
#include "kernel_params.h"

namespace efccl::device {

/// One device's tables, ready to upload.
struct ProgramTables {
  std::vector<ThreadblockDesc> threadblocks;  ///< CTA i of a one-call launch runs entry i
  std::vector<OpDesc> ops;
  std::vector<DepDesc> deps;
  std::vector<MultiOperand> operands;  ///< mrc operands (OpDesc)
  uint64_t nflags = 0;                 ///< one per op
  std::vector<DivideSegment> divide_segments;
  int64_t largest_divide_chunks = 0;
};

/// Per (rank, threadblock): the index of its connection end in the device's handle table.
using ConnectionIndex = std::map<std::pair<int, int>, int>;

/// The tables of the launch that serves `ranks` (global ranks, ascending; their local index is
/// their position here). `sends`/`recvs`: where each threadblock's connection ends are;
/// `outofplace`/`inplace`: the premul analysis of the modes the program allows (null for the
/// others); `remote_ranks`: ranks of other processes on the launch's GPU whose launches it
/// meets (XprocPlan), which direct transfers may address too (remote rank j is -2 - j in
/// ThreadblockDesc::recv_local/send_local). Fails when a table index would not fit the
/// kernel's 32-bit fields, and when an mrc names a rank that is not in `ranks` (mrc runs only
/// on ranks that share the launch).
StatusOr<ProgramTables> build_program_tables(
    const ef::Program& program, const std::vector<int>& ranks, const ConnectionIndex& sends,
    const ConnectionIndex& recvs, const ef::PremulMap* outofplace, const ef::PremulMap* inplace,
    const std::vector<int>& remote_ranks = {});

}  // namespace efccl::device
