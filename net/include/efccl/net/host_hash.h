// Which host a rank runs on, as a number the ranks can compare.
#pragma once

#include <cstdint>

namespace efccl::net {

/// A 64-bit identity of this host: hostname and /proc/sys/kernel/random/boot_id, or NCCL_HOSTID.
uint64_t host_hash();

}  // namespace efccl::net
