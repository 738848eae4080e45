// Ranks of different processes on one GPU (docs/runtime.md, "Several processes on one GPU"):
// without an MPS daemon the kernels of different processes time-slice on the GPU, and the
// interpreter's threadblocks spin for peers that are not scheduled: correct, but milliseconds
// per call. Communicator init checks whether CUDA says MPS serves the device and warns once
// per process, with the fix, when it does not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace efccl::runtime {

/// Where a rank runs, as the bootstrap's table says.
struct RankLocation {
  uint64_t host = 0;     ///< host hash
  uint64_t process = 0;  ///< per-process nonce
  int32_t pid = 0;
  std::string bus_id;    ///< its GPU ("" unknown)
};

/// Whether CUDA says an MPS server serves CUDA device `device` (false when it cannot say).
bool mps_serves(int device);

/// For each local rank (`local_ranks[i]` on CUDA device `devices[i]`) whose GPU another
/// process's rank also uses: warns once per process unless MPS serves that device. Returns the
/// number of such local ranks (for tests).
int check_shared_gpus(const std::vector<RankLocation>& table, const std::vector<int>& local_ranks,
                      const std::vector<int>& devices);

/// The ranks of other processes on `rank`'s GPU (same host and bus id, another process): all of
/// them, ascending (`clients`), and the lowest of each such process (`partners`). Both empty
/// when the table does not know the rank's GPU.
void ranks_sharing_gpu(const std::vector<RankLocation>& table, int rank, std::vector<int>* partners,
                       std::vector<int>* clients);
/// A GPU's name for PeerProcesses::gpus: its host and bus id ("" when the bus id is unknown).
std::string gpu_key(const RankLocation& where);

}  // namespace efccl::runtime
