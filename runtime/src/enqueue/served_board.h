// The board of a GPU served by one process (enqueue/served_calls.h): shared host memory in which
// every rank of a communicator whose ranks of several processes share one GPU posts each of its
// collectives, in call order, so that every process can decide alike whether the call is served
// (run for all ranks by the serving process's launch) and the serving process learns where the
// other ranks' buffers are in its address space.
//
// One row per rank: a ring of kRing records and a "consumed" counter. A rank writes record
// `seq` into slot seq % kRing, its fields first and `seq` last (release); readers wait (bounded)
// for that value. A slot is reused only once every rank has consumed the record that held it
// (each rank consumes a call once it decided it). Everything read from the board comes from
// another process and is checked (check_served_call) before use.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"

namespace efccl::runtime {

/// One rank's collective as the board carries it (a plain value; the board's copy is shared).
struct ServedCall {
  uint8_t kind = 0;      ///< CallKind (collectives only)
  uint8_t dtype = 0;     ///< ef::DataType
  uint8_t op = 0;        ///< ef::RedOp
  uint8_t servable = 0;  ///< 1: this rank's call can be served (see served_calls.h)
  int32_t root = 0;
  uint8_t captured = 0;  ///< 1: under CUDA graph capture (served through graph slot `slot`)
  uint8_t pad[3] = {};
  uint32_t slot = 0;  ///< captured: the graph slot the rank's process would give it
  uint64_t count = 0;
  uint64_t send = 0;  ///< where the serving process reaches the send buffer (0: none/unused)
  uint64_t recv = 0;  ///< likewise, the receive buffer
  double premul = 1.0;
};

/// ok when `c` is a well-formed collective of a communicator of `nranks` ranks (a record read
/// from another process): kind, datatype, operator, root in range.
Status check_served_call(const ServedCall& c, int nranks);
/// Whether every rank's call of one sequence number is servable and they agree on kind, count,
/// datatype, operator, root, capture and graph slot (else every process runs the call the usual
/// way).
bool served_together(const std::vector<ServedCall>& calls);

class ServedBoard {
 public:
  static constexpr uint32_t kRing = 256;
  static constexpr uint64_t kMagic = 0xefcc15e7'0ead0002ull;  ///< 2: records with graph slots

  /// Bytes a board of `nranks` rows takes.
  static std::size_t bytes_for(int nranks);
  /// Writes an empty board of `nranks` rows into `memory` (`bytes` >= bytes_for).
  static Status format(void* memory, std::size_t bytes, int nranks);
  /// A view of a board another process formatted in `memory`; checks its header.
  static StatusOr<ServedBoard> attach(void* memory, std::size_t bytes, int nranks);

  /// Posts rank `rank`'s call number `seq` (>= 1, one after the other): waits until every rank
  /// consumed call seq - kRing, whose slot it takes.
  Status post(int rank, uint64_t seq, const ServedCall& call, net::Deadline deadline,
              const std::atomic<bool>* abort);
  /// Rank `rank`'s call number `seq`, once posted (checked with check_served_call).
  Status read(int rank, uint64_t seq, ServedCall* out, net::Deadline deadline,
              const std::atomic<bool>* abort) const;
  /// Rank `rank` has decided every call up to `seq`: their slots may be reused.
  void consume(int rank, uint64_t seq);
  /// A process found the board's calls unusable (a record naming memory it cannot reach):
  /// 1 + the rank that said so, for every process's async error; 0 when none.
  void set_failed(int rank);
  int failed_by() const;

  int nranks() const { return nranks_; }

 private:
  struct Record;
  struct Row;
  struct Header;
  ServedBoard(void* memory, int nranks);
  Row* row(int rank) const;

  Header* header_ = nullptr;
  int nranks_ = 0;
};

}  // namespace efccl::runtime
