// A GPU served by one process (docs/runtime.md, "A GPU served by one process"). Without MPS the
// kernels of different processes on one GPU take turns (a time slice, ~2.25 ms, per call), but
// stream memory operations of one process pass while another process's kernel runs. So, for a
// communicator whose ranks are all on one GPU, one per process, the process of the lowest rank
// (the server) runs every rank's part of a collective in one launch of its own — a clique of all
// the ranks on its GPU (the "shadow"), reading and writing the other ranks' registered buffers
// through the CUDA IPC mappings that comm/shared_registrations.h made — while each other process
// (a client) only writes "arrived" into the server's memory on its stream and waits on its
// stream for the server to write "done" into its own memory.
//
// Per collective, every process posts its call on a board in shared host memory
// (served_board.h) and reads the others', so that all decide alike: served when every rank's
// call is alone in its submission, on buffers the server can reach, captured in every process or
// in none, and all agree on the call; otherwise the call runs the usual way in every process.
// Each process waits on the host until every other process has issued the same call (bounded by
// EFCCL_TIMEOUT_MS).
//
// An eager served call is numbered (seq): the streams write and wait for words that only grow.
// A captured one gets a graph slot of its own (the same in every process, never reused by the
// communicator): its graph's fixed stream operations raise the slot's flags and the waiting side
// lowers them again once it passed, so that every replay handshakes anew. Each process also
// raises a flag of its own in pinned host memory while its stream waits in a slot, which the
// watchdog reads: a replay that waits longer than EFCCL_TIMEOUT_MS fails the communicator, and
// from then on the watchdog writes the flags of every slot a stream waits in.
//
// Every stream wait has an abort path and a deadline: a watchdog thread fails the communicator
// and writes the words this process's streams wait for itself (from a stream of its own) when
// a served call its stream has reached has not ended within EFCCL_TIMEOUT_MS while no other
// call ended (each eager call's stream writes its number into pinned host memory when it
// reaches the call and when the call ends, which the watchdog reads: neither work queued before
// the call nor a backlog of calls that all end counts); abort and a peer's death do
// the same. A failure anywhere (a timeout, a failed launch in the server, an abort) marks the
// board, so every process's later calls and ncclCommGetAsyncError report it. Served calls of one
// process on different streams are chained (an event), so the words only ever grow.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/api_status.h"
#include "efccl/net/deadline.h"
#include "efccl/topology/cluster.h"
#include "enqueue/served_board.h"
#include "launch/call.h"

namespace efccl::net {
class Bootstrap;
}  // namespace efccl::net

namespace efccl::runtime {

class Clique;

class ServedCalls {
 public:
  struct Options {
    int rank = 0;       ///< this process's (only) rank
    int nranks = 0;     ///< every rank of the communicator is on this process's GPU
    int device = 0;     ///< the CUDA device
    bool wish = false;  ///< this process wants to serve (all must)
    /// Calls whose largest buffer is smaller than this run the usual way (EFCCL_SERVE_MIN_BYTES).
    std::size_t min_bytes = 0;
    std::chrono::nanoseconds timeout{};  ///< EFCCL_TIMEOUT_MS
    /// Client: where the server's process reaches [p, p + bytes) of this rank (a shared
    /// registration), or nothing.
    std::function<std::optional<uint64_t>(const void* p, std::size_t bytes)> translate;
    /// Server: whether a mapping it holds for rank `rank` covers [address, address + bytes).
    std::function<bool(int rank, uint64_t address, std::size_t bytes)> covers;
    /// Server: the machine graph of the shadow clique's GPU.
    std::shared_ptr<const topo::ClusterGraph> graph;
  };

  /// Called alike by every process of the communicator (an exchange over `boot`); null when the
  /// GPU is not served (some process does not wish it, or a setup step failed somewhere: INFO or
  /// WARN says why).
  static StatusOr<std::shared_ptr<ServedCalls>> create(net::Bootstrap& boot, Options options,
                                                       net::Deadline deadline,
                                                       const std::atomic<bool>* abort);
  ~ServedCalls();
  ServedCalls(const ServedCalls&) = delete;
  ServedCalls& operator=(const ServedCalls&) = delete;

  /// The calls of one submission of this process's rank, in order: posts its collectives.
  /// Returns true when the submission was served (`*status`: its outcome), false when it runs
  /// the usual way.
  bool submit(const std::vector<Call>& calls, ApiStatus* status);
  /// Abort or a peer's death: writes the words this process's streams wait for, so that
  /// nothing waits for a served call that cannot complete. Later calls fail.
  void release(const std::string& why);
  /// The first failure (a timeout, a bad record, a failed launch), or ok.
  ApiStatus error() const;
  /// Served calls so far (tests).
  uint64_t served() const { return served_count_.load(); }
  bool is_server() const { return options_.rank == kServerRank; }

  static constexpr int kServerRank = 0;

 private:
  explicit ServedCalls(Options options);
  bool servable(const Call& c, ServedCall* record) const;
  ApiStatus run(const Call& c, const std::vector<ServedCall>& all, uint64_t seq);
  /// A captured call in graph slot `slot`.
  ApiStatus run_captured(const Call& c, const std::vector<ServedCall>& all, uint32_t slot);
  /// Server: every other rank's buffers lie in mappings this process holds for that rank.
  ApiStatus check_addresses(const Call& c, const std::vector<ServedCall>& all, uint64_t seq);
  /// Server: the shadow's launch of `c` for every rank, on `c.stream`.
  ApiStatus launch_for_all(const Call& c, const std::vector<ServedCall>& all);
  /// Slot `slot`'s flags: rank `rank`'s arrival (in the server's memory, as this process maps
  /// it) and a rank's "done" (in that rank's memory; `base`: its words as this process maps them).
  uint32_t* slot_arrived(uint32_t slot, int rank) const;
  static uint32_t* slot_done(void* base, uint32_t slot);
  /// Writes the flags of every graph slot whose stream waits now (after a failure).
  void release_waiting_slots();
  void watch();
  void fail(const std::string& why);
  /// Writes the words this process's streams wait for, far enough ahead for every wait.
  void write_release_words();
  /// Waits until the last served call's stream operations are done, at most `budget`.
  bool drained(std::chrono::nanoseconds budget) const;
  uint32_t* arrived_word(int rank) const;  ///< in the server's memory, as this process maps it

  const Options options_;
  std::mutex mu_;  ///< one submission at a time
  uint64_t seq_ = 0;
  std::optional<ServedBoard> board_;
  void* board_memory_ = nullptr;
  std::size_t board_bytes_ = 0;
  void* words_ = nullptr;                  ///< this process's words (cudaMalloc)
  void* server_words_ = nullptr;           ///< client: the server's words, mapped
  std::vector<void*> client_words_;        ///< server: each rank's words, mapped (null for itself)
  cudaStream_t private_stream_ = nullptr;  ///< release()'s writes
  /// Recorded after each served call's stream operations: the next served call on another
  /// stream waits for it (so the words only ever grow), destroy queries it.
  cudaEvent_t last_event_ = nullptr;
  cudaStream_t last_stream_ = nullptr;   ///< under mu_
  std::shared_ptr<Clique> shadow_;       ///< server: every rank of the GPU
  std::atomic<uint64_t> issued_{0};      ///< the last served call enqueued
  uint32_t next_slot_ = 0;               ///< under mu_: the next captured call's graph slot
  std::atomic<uint32_t> slots_used_{0};  ///< graph slots given so far
  bool told_slots_out_ = false;          ///< under mu_: INFO said the slots are all given
  /// Pinned, mapped: flag k is 1 while this process's stream waits in graph slot k; after the
  /// flags, the last eager call a stream reached and the last that ended (the watchdog's).
  uint32_t* waiting_ = nullptr;
  uint32_t* waiting_device_ = nullptr;  ///< the same, as streams write it
  std::atomic<uint64_t> served_count_{0};

  mutable std::mutex error_mu_;
  ApiStatus error_;
  std::atomic<bool> released_{false};
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;  ///< under watch_mu_
  std::thread watchdog_;
};

}  // namespace efccl::runtime
