// Where the ranks of a communicator spanning several processes (and maybe several hosts) run, as
// the clique of one process sees them (built from the bootstrap's table in comm/rendezvous.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace efccl::net {
class Bootstrap;
}  // namespace efccl::net

namespace efccl::runtime {

struct ProcessMap {
  std::vector<bool> local;         ///< per rank: runs in this process
  std::vector<int64_t> location;   ///< per rank: equal for ranks sharing a process and GPU
  std::vector<int32_t> leader;     ///< per rank: the lowest rank of its process
  /// Per rank: its host (net::host_hash: the hostname and boot id, or NCCL_HOSTID); ranks on
  /// different hosts are joined by network connections (launch/network_links.h).
  std::vector<uint64_t> host;
  std::vector<std::string> where;  ///< per rank: "host pid N GPU d bus" for messages
  /// Per rank: its GPU (host and bus id; "" unknown): PeerProcesses::gpus.
  std::vector<std::string> gpu;
  /// Where the process of rank `reader` reaches [p, p + bytes) of local rank `rank`'s memory
  /// (a registered buffer it mapped: comm/shared_registrations.h), or nothing.
  std::function<std::optional<uint64_t>(int rank, const void* p, std::size_t bytes, int reader)>
      translate;
  /// The bootstraps of this process's ranks; the first is the leader's (exchanges go there).
  std::vector<std::shared_ptr<net::Bootstrap>> bootstraps;

  /// How many different hosts the ranks run on.
  std::size_t host_count() const { return std::set<uint64_t>(host.begin(), host.end()).size(); }
};

}  // namespace efccl::runtime
