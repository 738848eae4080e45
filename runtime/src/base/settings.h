// The runtime's EFCCL_* settings, read from the environment. A value that is not what the
// variable takes is reported once (WARN, naming the variable and the value) and the default used.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace efccl::runtime {

/// EFCCL_TIMEOUT_MS (default 600000, as PyTorch's NCCL watchdog): how long a kernel wait or a
/// rank's call waiting for the others may go without progress.
std::chrono::nanoseconds call_timeout();
/// EFCCL_INIT_TIMEOUT_MS (default 120000): how long ranks wait for each other in
/// ncclCommInitRank* and ncclCommSplit/Shrink.
std::chrono::milliseconds init_timeout();
/// EFCCL_EXECUTOR_CACHE (default 256, at most 2^20): prepared programs kept per clique.
std::size_t executor_cache_capacity();
/// EFCCL_GROUP_FUSION: 1 (default) enqueues a group's launches together, fused where the kernels
/// allow; 0 launches every program run on its own.
bool group_fusion_enabled();
/// EFCCL_RESIDENT: 1 runs eager calls on one resident interpreter grid per GPU, posted with
/// stream memory operations instead of a kernel launch each (docs/device-executor.md); 0
/// (default) launches every call.
bool resident_enabled();
/// EFCCL_DIRECT: 1 (default) lets ranks that share a GPU in one process move data directly
/// between their buffers where the program allows (docs/device-executor.md, "Direct
/// transfers") and run allreduce in one pass over every rank's buffers (shared_gpu_allreduce);
/// 0 keeps every transfer in the connections' slots and the rings.
bool direct_enabled();
/// EFCCL_DIRECT_PROCESSES: 1 lets ranks of different processes on one GPU move data directly
/// between their registered buffers (ncclCommRegister) in calls of at least 2 MiB per rank
/// buffer (docs/device-executor.md, "Direct transfers between processes on one GPU"); 0
/// (default) keeps the slots between them. Off by default because the launches then meet at
/// every such call, which made calls on unregistered buffers 4-21% slower (docs/performance.md).
/// Every process of a job must set it alike (with EFCCL_DIRECT=1).
bool direct_between_processes_enabled();
/// EFCCL_SERVE_PROCESSES (docs/runtime.md, "A GPU served by one process"): 1 serve every call,
/// 0 never, unset or "auto" (-1): serve every call where no MPS daemon serves the GPU; under MPS
/// serve four or more processes' calls of at least serve_min_bytes(), not two or three.
int serve_processes_setting();
/// EFCCL_SERVE_MIN_BYTES (0..2^40): a served GPU serves calls whose largest buffer (on any rank)
/// holds at least this many bytes, smaller ones run the usual way; unset: 64 KiB when
/// `under_mps_auto` (MPS serves the GPU and EFCCL_SERVE_PROCESSES is auto), else 0.
std::size_t serve_min_bytes(bool under_mps_auto);
/// EFCCL_RESIDENT_CTAS (default 16, 1..128): CTAs of each GPU's resident grid; calls whose
/// threadblocks on a GPU need more are launched.
uint32_t resident_ctas();

/// EFCCL_BALANCE: 1 (default) lets the balancer split large send/receive transfers, all-to-all
/// and lone pairs over several paths (docs/balancer.md, "In the runtime"); 0 turns it off.
bool balance_enabled();
/// EFCCL_BALANCE_TOPOLOGY: "" (the communicator's machine graph), "preset:NAME[:HOSTS]" or a
/// topology file (NCCL XML, or efccl's topology JSON); rank r then plans as the topology's GPU
/// r mod its GPU count (testing balanced programs on fewer GPUs than the topology has).
std::string balance_topology();
/// EFCCL_BALANCE_HOST_MEMORY: whether the balancer may route bytes through pinned host memory
/// beside NVLink: "1" yes, "0" no; unset, the default: no on the machine graph (measured slower
/// than NVLink alone on 4x H200, docs/performance.md), yes on an EFCCL_BALANCE_TOPOLOGY
/// (simulated topologies exercise every kind of path). Returns -1 when unset.
int balance_host_memory();
/// EFCCL_BALANCE_STATS: a file the balancer's statistics are appended to, as one JSON object
/// per communicator when it ends ("%h": host name, "%p": process id); "" none.
std::string balance_stats_file();
/// EFCCL_BALANCE_FORCE (tests only): "" plans as the planner says; "spread" splits every pair
/// at or above EFCCL_BALANCE_MIN_BYTES evenly over all its usable candidates.
std::string balance_force();

}  // namespace efccl::runtime
