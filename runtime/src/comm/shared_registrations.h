// Registered buffers shared with the other processes on this rank's GPU (docs/runtime.md,
// "Registered buffers between processes"). Ranks of different processes on one GPU cannot
// address each other's buffers; a CUDA IPC mapping makes that possible, but CUDA leaves it
// undefined to free an allocation while another process still maps it, and only the user knows
// when a buffer is freed. So efccl maps only registered buffers (ncclCommRegister,
// ncclCommWindowRegister), whose lifetime the user declares, and ncclCommDeregister returns only
// once every other process has retired its mapping: no call of theirs uses it any more. (The
// unmapping itself then happens on a thread of that process, because cudaIpcCloseMemHandle
// waits for every kernel running in the process, which may be waiting for this one.)
//
// Per rank with such partners, when direct transfers between processes are on
// (EFCCL_DIRECT_PROCESSES=1, the only user of the mappings), a SharedRegistrations:
//  * shares its registrations: it exports the IPC handle of the allocation holding the buffer
//    and asks one rank of every other process on the GPU (its partner there) to map it; each
//    answers where the allocation lies in its address space, which this rank keeps (the buffer
//    at that address + its offset is what the partner's process may read and write);
//  * serves the requests of the other processes' ranks on the GPU with a thread of its own
//    (their answers must not wait for this rank's next call), mapping and unmapping through
//    one process-wide table that counts the users of each mapping.
// All partners or none: a buffer that some partner could not map is not shared at all (the
// registration itself still succeeds, as in NCCL, and the transfers go through efccl's own
// connection memory). Every wait has a deadline (EFCCL_INIT_TIMEOUT_MS) and ends when a partner
// leaves or dies; a partner whose service stops reports that it closed everything it mapped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::net {
class Bootstrap;
}  // namespace efccl::net

namespace efccl::runtime {

/// A rank of another process on this rank's GPU.
struct GpuPartner {
  int rank = -1;      ///< communicator rank (this one's requests go to it)
  std::string where;  ///< "host pid N GPU d bus" (messages)
};

class SharedRegistrations {
 public:
  /// Starts the service of `rank` (on CUDA device `device`) over `boot`. `partners`: one rank
  /// of each other process on the GPU, whom this rank asks; `clients`: every rank of other
  /// processes on the GPU, whose requests the service answers, with (`client_partner`, empty
  /// or one per client) the index of its process's partner. `timeout` bounds each exchange.
  static StatusOr<std::unique_ptr<SharedRegistrations>> start(
      std::shared_ptr<net::Bootstrap> boot, int rank, int device, std::vector<GpuPartner> partners,
      std::vector<int> clients, std::chrono::milliseconds timeout,
      std::vector<std::size_t> client_partner = {});
  ~SharedRegistrations();
  SharedRegistrations(const SharedRegistrations&) = delete;
  SharedRegistrations& operator=(const SharedRegistrations&) = delete;

  /// Shares [buff, buff + size) with every partner. Returns the registration's id, or 0 when it
  /// is not shared (why: logged, INFO when the memory cannot be exported, such as memory from
  /// cuMemCreate or a memory pool; WARN when a partner failed).
  uint64_t share(void* buff, std::size_t size);
  /// Ends the sharing of `id`: returns once every partner retired it, left or died; an error
  /// names a partner that did not confirm within the timeout (the record is dropped anyway).
  Status unshare(uint64_t id);
  /// Where partner `partner` (index into the partners given to start()) reaches
  /// [p, p + bytes), when a shared registration covers that range.
  std::optional<uint64_t> partner_address(const void* p, std::size_t bytes,
                                          std::size_t partner) const;
  std::size_t partner_count() const { return partners_.size(); }
  /// partner_address for the process of rank `reader` (one of the clients given to start()).
  std::optional<uint64_t> reader_address(const void* p, std::size_t bytes, int reader) const;
  /// Whether a mapping the service holds for rank `client` covers [address, address + bytes)
  /// (in this process's address space).
  bool maps(int client, uint64_t address, std::size_t bytes) const;
  /// Mappings the service holds for other processes' registrations (tests).
  std::size_t imported() const;
  /// Unshares every registration (abort: without waiting for answers), stops the service and
  /// unmaps what it mapped for others, telling them. Idempotent; the destructor calls it.
  void stop(bool abort);

 private:
  struct Registration {
    const char* begin = nullptr;
    std::size_t size = 0;
    std::vector<uint64_t> partner_base;  ///< per partner: the buffer's address there
  };
  struct Import {
    void* base = nullptr;  ///< the mapping (IpcImports)
    std::size_t bytes = 0;  ///< the allocation's length
  };
  SharedRegistrations(std::shared_ptr<net::Bootstrap> boot, int rank, int device,
                      std::vector<GpuPartner> partners, std::vector<int> clients,
                      std::chrono::milliseconds timeout, std::vector<std::size_t> client_partner);
  void serve();
  std::string answer(int from, const std::string& bytes);
  /// Waits for partner `i`'s answer to (kind, id); a kStopped notice from it counts as a close.
  Status await_reply(std::size_t i, uint8_t kind, uint64_t id, uint64_t* address);
  void send_close(std::size_t i, uint64_t id, bool wait, Status* result);

  const std::shared_ptr<net::Bootstrap> boot_;
  const int rank_, device_;
  const std::vector<GpuPartner> partners_;
  const std::vector<int> clients_;
  const std::vector<std::size_t> client_partner_;
  const std::chrono::milliseconds timeout_;
  std::atomic<bool> stopping_{false};
  std::thread service_;

  std::mutex owner_mu_;  ///< one share/unshare at a time (answers are matched in order)
  uint64_t next_id_ = 0;
  std::vector<bool> partner_stopped_;  ///< under owner_mu_: it sent kStopped
  mutable std::mutex mu_;              ///< guards registrations_ and imports_
  std::map<uint64_t, Registration> registrations_;
  std::map<std::pair<int, uint64_t>, Import> imports_;  ///< (client rank, id)
  bool stopped_ = false;                                ///< under owner_mu_
};

}  // namespace efccl::runtime
