#include "select/host_layout.h"

#include <set>

namespace efccl::runtime {

HostLayout HostLayout::of(const std::vector<uint64_t>& rank_hosts) {
  HostLayout l;
  if (rank_hosts.empty()) return l;
  l.hosts = static_cast<int32_t>(std::set<uint64_t>(rank_hosts.begin(), rank_hosts.end()).size());
  const std::size_t n = rank_hosts.size();
  if (n % static_cast<std::size_t>(l.hosts) != 0) return l;
  const std::size_t per = n / static_cast<std::size_t>(l.hosts);
  // Contiguous blocks: each block is one host, and no host appears in two blocks (there are as
  // many distinct hosts as blocks).
  for (std::size_t r = 0; r < n; ++r)
    if (rank_hosts[r] != rank_hosts[r - r % per]) return l;
  l.ranks_per_host = static_cast<int32_t>(per);
  return l;
}

std::string HostLayout::describe() const {
  if (hosts <= 1) return "1 host";
  if (ranks_per_host > 0)
    return std::to_string(hosts) + " hosts x " + std::to_string(ranks_per_host) + " rank(s)";
  return std::to_string(hosts) + " hosts (not in equal contiguous blocks)";
}

}  // namespace efccl::runtime
