#include "efccl/net/host_hash.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "efccl/common/hash.h"

namespace efccl::net {

uint64_t host_hash() {
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && *id != '\0') return hash64(id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string key = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (std::getline(boot, boot_id)) key += boot_id;
  return hash64(key);
}

}  // namespace efccl::net
