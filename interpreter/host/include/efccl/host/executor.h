// The host reference executor: deterministic, single-threaded interpretation of a Program
// over host memory, with the GPU's back-pressure (bounded connection slots, tiled chunks)
// and the GPU's rounding. It is the oracle for every other engine (docs/ef-format.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/ef/program.h"
#include "efccl/common/status.h"

namespace efccl::host {

/// Payload bytes of one connection slot per protocol, as the GPU interpreter uses them.
std::size_t default_slot_bytes(ef::Protocol protocol);

/// The byte the executor fills scratch (and program buffers the API does not expose) with:
/// a large negative finite value in every floating type (-57344 in e5m2, -352 in e4m3), so that
/// reading memory nothing wrote shows up in sums, products and min.
inline constexpr uint8_t kPoisonByte = 0xFB;

/// How to execute one call.
struct ExecOptions {
  uint64_t count = 0;  ///< NCCL's count argument for the program's collective
  ef::DataType dtype = ef::DataType::kFloat32;
  ef::RedOp op = ef::RedOp::kSum;
  bool inplace = false;
  /// premulsum: one scalar per rank (as ncclRedOpCreatePreMulSum's per-rank scalar);
  /// empty means 1.0 for every rank. Ignored for other operators (avg derives its own).
  std::vector<double> premul_scalars;
  std::size_t slot_bytes = 0;  ///< 0: default_slot_bytes(program.protocol)
  int connection_slots = 8;    ///< slots per connection (kDefaultConnectionSlots)
};

/// One rank's memory for a call, as the NCCL API sees it: `input` and `output` are the user's
/// buffers (for in-place calls `output` holds the shared region and `input` is empty).
struct RankBuffers {
  std::vector<uint8_t> input;
  std::vector<uint8_t> output;
};

/// Where one rank's API buffers lie for a call, in elements. With `shared` (an in-place call on a
/// rank NCCL aliases), both lie inside RankBuffers::output, which holds `shared_elements`;
/// otherwise the input starts RankBuffers::input and the output starts RankBuffers::output.
struct ApiLayout {
  bool shared = false;
  uint64_t shared_elements = 0;
  uint64_t input_offset = 0;
  uint64_t input_elements = 0;
  uint64_t output_offset = 0;
  uint64_t output_elements = 0;
};
/// NCCL's layout (docs/ef-format.md §2) for `rank` of a call with `count`; the shared region is
/// as large as the larger API buffer (covering both at their aliased positions).
ApiLayout api_layout(const ef::Program& program, int32_t rank, uint64_t count, bool inplace);

/// Zero-filled buffers of the sizes execute() expects for this call, or why the call is invalid.
StatusOr<std::vector<RankBuffers>> make_buffers(const ef::Program& program,
                                                const ExecOptions& options);

/// What each blocked threadblock waits for when no threadblock can progress.
struct BlockedThreadblock {
  int rank = 0, tb = 0, op = 0;  ///< op index in the threadblock's list
  uint64_t iteration = 0;
  std::string waits_for;  ///< e.g. "data from rank 3 on channel 1 (connection empty)"
};

struct ExecResult {
  Status status;  ///< not ok on deadlock or on an invalid call (count, mode)
  bool deadlock = false;
  std::vector<BlockedThreadblock> blocked;  ///< filled on deadlock
  uint64_t iterations = 0;                  ///< tiles per chunk
  /// Human-readable deadlock report: one line per blocked threadblock.
  std::string deadlock_report() const;
};

/// Runs `program` once over `buffers` (one per rank, sized by api_layout for options.count).
/// The program should be valid (ef::validate); an invalid one gives a wrong result, a deadlock
/// report or an error, never a crash: the call and the program's indices are checked first.
ExecResult execute(const ef::Program& program, const ExecOptions& options,
                   std::vector<RankBuffers>& buffers);

/// Random inputs (seeded), execute, and compare with the collective's definition:
/// integers and min/max bitwise, floating sums/products within a rounding bound.
struct VerifyResult {
  bool pass = false;
  /// "PASS ..." or "FAIL: rank 2 output[17]: expected 3.5, got 3" or the deadlock report.
  std::string message;
  ExecResult exec;
};
VerifyResult run_and_verify(const ef::Program& program, const ExecOptions& options, uint64_t seed);

/// The ExecOptions::inplace values the program allows, out-of-place (false) first. Every
/// collective has an in-place form in NCCL, so only the program's flags decide.
std::vector<bool> allowed_inplace_modes(const ef::Program& program);

}  // namespace efccl::host
