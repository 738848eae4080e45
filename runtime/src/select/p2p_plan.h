// Point-to-point groups as EF programs. All ncclSend/ncclRecv pairs of a group are cut into
// "rounds"; a round is one custom-collective program run by one interpreter launch per device
// (launch/p2p_runner.h runs them; the balancer will plan multi-path rounds here).
//
// Why rounds: a program gives each rank one input and one output buffer, but a rank may send
// from (and receive into) several unrelated user buffers. Transfers whose buffers lie at chunk
// multiples of a common base (the usual case: one buffer per direction, or slices of one
// buffer as in an all-to-all) share a round, with base = the user's lowest pointer; anything
// else starts another round. Rounds run one after the other, in the same order on every device,
// so they cannot deadlock. Every transfer is split into `channels` chunks carried on separate
// channels (one send and one receive threadblock each). Data moves as int8 bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::runtime {

/// One matched ncclSend/ncclRecv pair (sender != receiver), in bytes.
struct Transfer {
  int32_t sender = 0;
  int32_t receiver = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t bytes = 0;
};

/// Where one transfer of a round sits: program ranks and first chunks (`channels` each).
struct P2pPlacement {
  int32_t sender = 0, receiver = 0;  ///< program ranks
  uint64_t src_chunk = 0, dst_chunk = 0;
};

/// One launch: a program over the participating clique ranks.
struct P2pRound {
  ef::Program program;  ///< kCustom, int8, nchunksperloop 1: the call's count is chunk_bytes
                        ///< (empty until build_p2p_program when planned without programs)
  int32_t channels = 1;
  ef::Protocol protocol = ef::Protocol::kSimple;
  std::vector<P2pPlacement> placements;  ///< in transfer order
  std::vector<int32_t> ranks;            ///< program rank -> clique rank
  std::vector<const void*> inputs;       ///< per program rank: base of its send buffers (or null)
  std::vector<void*> outputs;  ///< per program rank: base of its receive buffers (or null)
  uint64_t chunk_bytes = 0;
  /// Connection slot bytes for its executor (ExecutorConfig::slot_bytes; 0: the protocol's
  /// default): a Simple round's chunk rounded up to a power of two within [32 KiB, 512 KiB],
  /// so that many channels of small chunks do not each hold 8 slots of 512 KiB.
  std::size_t slot_bytes = 0;
  std::string
      signature;  ///< equal signatures: equal programs and slot bytes (the executor cache key)
};

/// Splits the transfers (none with bytes 0) into rounds; `channels_for(bytes)` gives the
/// channels of a transfer (reduced until they divide its size), `protocol_for(bytes)` the
/// protocol of its round's program (Simple when not given).
/// Without `build_programs`, only the layout and signature are computed (cheap; a program
/// already prepared under that signature needs nothing else): build_p2p_program fills it in.
std::vector<P2pRound> plan_p2p_rounds(
    std::vector<Transfer> transfers, int32_t (*channels_for)(uint64_t bytes),
    const std::function<ef::Protocol(uint64_t bytes)>& protocol_for = {},
    bool build_programs = true);

/// Builds `round.program` from its placements (what plan_p2p_rounds does with build_programs).
void build_p2p_program(P2pRound& round);

/// The rounds of one exchange between ranks a < b of a communicator spanning processes. Each
/// process knows only its own ranks' buffers, so the rounds are planned from the sizes alone
/// (both processes derive the same programs), with the pair's four buffers named by slot:
/// a's send (0), b's receive (1), b's send (2), a's receive (3).
struct PairRounds {
  std::vector<P2pRound> rounds;  ///< programs built; inputs and outputs are stand-ins
  /// Per round, per program rank: which slot is its input / output, or -1.
  std::vector<std::vector<int>> input_slot, output_slot;
};
PairRounds plan_pair_rounds(int32_t a, int32_t b, uint64_t bytes_ab, uint64_t bytes_ba,
                            int32_t (*channels_for)(uint64_t bytes),
                            const std::function<ef::Protocol(uint64_t bytes)>& protocol_for);

}  // namespace efccl::runtime
