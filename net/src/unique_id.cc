#include "efccl/net/unique_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "bootstrap_root.h"
#include "efccl/common/log.h"
#include "efccl/net/interfaces.h"

namespace efccl::net {
namespace {

constexpr std::size_t kMagicAt = 0, kFormatAt = 8, kFlagsAt = 12, kRootAt = 16;
static_assert(kRootAt + sizeof(SocketAddress) <= kUniqueIdBytes);

Status random_magic(uint64_t* out) {
  for (;;) {
    std::size_t got = 0;
    while (got < sizeof(*out)) {
      const ssize_t n = getrandom(reinterpret_cast<char*>(out) + got, sizeof(*out) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got < sizeof(*out)) {
      std::ifstream urandom("/dev/urandom", std::ios::binary);
      if (!urandom.read(reinterpret_cast<char*>(out), sizeof(*out)))
        return Status::error("cannot read random bytes (getrandom and /dev/urandom failed)");
    }
    if (*out != 0 && *out != UniqueIdFields::kCommIdMagic) return Status::ok();
  }
}

}  // namespace

UniqueIdFields UniqueIdFields::decode(const UniqueId& id) {
  UniqueIdFields d;
  std::memcpy(&d.magic, id.internal + kMagicAt, sizeof(d.magic));
  std::memcpy(&d.format, id.internal + kFormatAt, sizeof(d.format));
  std::memcpy(&d.flags, id.internal + kFlagsAt, sizeof(d.flags));
  std::memcpy(static_cast<void*>(&d.root), id.internal + kRootAt, sizeof(d.root));
  return d;
}

UniqueId UniqueIdFields::encode() const {
  UniqueId id;
  std::memcpy(id.internal + kMagicAt, &magic, sizeof(magic));
  std::memcpy(id.internal + kFormatAt, &format, sizeof(format));
  std::memcpy(id.internal + kFlagsAt, &flags, sizeof(flags));
  std::memcpy(id.internal + kRootAt, static_cast<const void*>(&root), sizeof(root));
  return id;
}

std::string describe_unique_id(const UniqueId& id) {
  const UniqueIdFields d = UniqueIdFields::decode(id);
  if (!d.valid()) return "<not an efccl unique id>";
  return d.root.to_string();
}

Status create_unique_id(UniqueId* out, std::chrono::milliseconds root_lifetime) {
  if (out == nullptr) return Status::error("the unique id pointer is null");
  UniqueIdFields d;
  d.format = UniqueIdFields::kFormat;
  if (const char* env = std::getenv("NCCL_COMM_ID"); env != nullptr && *env != '\0') {
    auto addr = SocketAddress::parse(env, socket_family_from_env());
    if (!addr)
      return Status::error("NCCL_COMM_ID=" + std::string(env) + " is invalid: " +
                           addr.status().message() + " (use host:port, ipv4:port or [ipv6]:port)");
    d.magic = UniqueIdFields::kCommIdMagic;
    d.flags = UniqueIdFields::kRootByRank0;
    d.root = *addr;
    EFCCL_INFO(kLogInit | kLogEnv, -1,
               "NCCL_COMM_ID set by environment to " + std::string(env) +
                   ": rank 0 runs the rendezvous root at " + d.root.to_string());
  } else {
    auto iface = choose_interface(nullptr);
    if (!iface) return Status::error("ncclGetUniqueId: " + iface.status().message());
    if (Status s = random_magic(&d.magic); !s) return s;
    BootstrapRoot::Options options;
    options.magic = d.magic;
    options.address = iface->address;
    options.address.set_port(0);
    options.lifetime = root_lifetime;
    auto root = BootstrapRoot::launch(options);
    if (!root)
      return Status::error("starting the rendezvous root on " + iface->name + ": " +
                           root.status().message());
    d.root = (*root)->address();
    EFCCL_INFO(kLogInit, -1,
               "ncclGetUniqueId: rendezvous root listening on " + d.root.to_string() +
                   " (interface " + iface->name + ")");
  }
  *out = d.encode();
  return Status::ok();
}

}  // namespace efccl::net
