// Where the ranks of a communicator spanning several processes run, as the clique of one
// process sees them (built from the bootstrap's table in comm/rendezvous.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace efccl::runtime {

class Bootstrap;

struct ProcessMap {
  std::vector<bool> local;         ///< per rank: runs in this process
  std::vector<int64_t> location;   ///< per rank: equal for ranks sharing a process and GPU
  std::vector<int32_t> leader;     ///< per rank: the lowest rank of its process
  std::vector<std::string> where;  ///< per rank: "host pid N GPU d bus" for messages
  /// The bootstraps of this process's ranks; the first is the leader's (exchanges go there).
  std::vector<std::shared_ptr<Bootstrap>> bootstraps;
};

}  // namespace efccl::runtime
