// A communicator's machine graph (docs/topology.md, "At communicator init"): this process's host
// detected once (topo::detect_host with every visible CUDA device and NCCL_TOPO_FILE), the
// hosts of every process exchanged through the bootstrap and merged (topo::assemble_cluster),
// and a second exchange of the result's hash so that every rank knows all computed the same
// graph. Detection never fails a communicator (what it could not read is logged at INFO); a
// failed exchange or differing hashes do.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "base/api_status.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/deadline.h"
#include "efccl/topology/cluster.h"
#include "efccl/topology/detect.h"

namespace efccl::runtime {

/// This process's host, detected at the first call (later calls return the same).
const topo::Detection& this_host();

/// The graph of ranks that all live in this process: rank r on CUDA device devices[r].
ApiStatus local_machine_graph(const std::vector<int>& devices,
                              std::shared_ptr<const topo::ClusterGraph>* out);

/// The graph of a communicator spanning processes. `ranks`: every rank's host and bus id (from
/// the bootstrap's table). `boot`: the bootstrap of this process's lowest rank; `leaders`: the
/// lowest rank of every process, ascending (every leader calls this, with the same lists).
/// `*every_process_sees_every_gpu` (optional): whether every process sees (as a CUDA device)
/// every GPU of its host, agreed by all (the balancer's relays need it).
ApiStatus exchanged_machine_graph(const std::vector<topo::RankPlacement>& ranks,
                                  net::Bootstrap& boot, const std::vector<int>& leaders,
                                  net::Deadline deadline, const std::atomic<bool>* abort,
                                  std::shared_ptr<const topo::ClusterGraph>* out,
                                  bool* every_process_sees_every_gpu = nullptr);

/// One INFO line (GRAPH) per local rank: its GPU node, NVLink capacity and rail NIC, and the
/// graph's size and hash.
void log_machine_graph(const topo::ClusterGraph& graph, const std::vector<int>& local_ranks,
                       const std::vector<int>& devices);

}  // namespace efccl::runtime
