#include "comm/shared_gpu_check.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>

#include "efccl/common/log.h"

namespace efccl::runtime {

bool mps_serves(int device) {
  int mps = 0;
  if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return mps != 0;
}

int check_shared_gpus(const std::vector<RankLocation>& table, const std::vector<int>& local_ranks,
                      const std::vector<int>& devices) {
  int shared = 0;
  for (std::size_t i = 0; i < local_ranks.size() && i < devices.size(); ++i) {
    const auto rank = static_cast<std::size_t>(local_ranks[i]);
    if (rank >= table.size() || table[rank].bus_id.empty()) continue;
    const RankLocation& mine = table[rank];
    std::size_t other = table.size();
    for (std::size_t k = 0; k < table.size() && other == table.size(); ++k)
      if (table[k].host == mine.host && table[k].process != mine.process &&
          table[k].bus_id == mine.bus_id)
        other = k;
    if (other == table.size()) continue;
    ++shared;
    if (mps_serves(devices[i])) {
      EFCCL_INFO(kLogInit, devices[i],
                 "GPU " + mine.bus_id + " is shared with other processes and served by MPS");
      continue;
    }
    static std::once_flag warned;
    std::call_once(warned, [&] {
      EFCCL_WARN(devices[i],
                 "ranks " + std::to_string(rank) + " (this process) and " + std::to_string(other) +
                     " (pid " + std::to_string(table[other].pid) + ") share GPU " + mine.bus_id +
                     " without MPS: kernels of different processes time-slice on it "
                     "(milliseconds per call). Start an MPS control daemon for the job: "
                     "efccl-mprun --mps, or nvidia-cuda-mps-control -d with "
                     "CUDA_MPS_PIPE_DIRECTORY set for every process; or, with one rank per "
                     "process, set EFCCL_DIRECT_PROCESSES=1 and register the calls' buffers "
                     "(ncclCommRegister) so that one process serves the GPU (docs/runtime.md)");
    });
  }
  return shared;
}

void ranks_sharing_gpu(const std::vector<RankLocation>& table, int rank, std::vector<int>* partners,
                       std::vector<int>* clients) {
  partners->clear();
  clients->clear();
  if (rank < 0 || static_cast<std::size_t>(rank) >= table.size()) return;
  const RankLocation& mine = table[static_cast<std::size_t>(rank)];
  if (mine.bus_id.empty()) return;
  std::set<uint64_t> processes;
  for (std::size_t k = 0; k < table.size(); ++k) {
    const RankLocation& other = table[k];
    if (other.host != mine.host || other.process == mine.process || other.bus_id != mine.bus_id)
      continue;
    clients->push_back(static_cast<int>(k));
    if (processes.insert(other.process).second) partners->push_back(static_cast<int>(k));
  }
}

std::string gpu_key(const RankLocation& where) {
  if (where.bus_id.empty()) return "";
  return std::to_string(where.host) + "/" + where.bus_id;
}

}  // namespace efccl::runtime
