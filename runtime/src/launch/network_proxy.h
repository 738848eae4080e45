// The process's network proxy (efccl/net/proxy.h): one per process, shared by every
// communicator, started at the first network connection on the interface NCCL_SOCKET_IFNAME /
// NCCL_SOCKET_FAMILY select, with NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD sockets per
// connection. It lives until the process exits; a forked child that needs one starts its own.
#pragma once

#include <memory>

#include "efccl/common/status.h"
#include "efccl/net/proxy.h"

namespace efccl::runtime {

/// The proxy, started now if it is not running (the failure to start it is returned, and the
/// next call tries again).
StatusOr<std::shared_ptr<net::Proxy>> network_proxy();

/// Before a launch that uses network connections: makes this process's proxy look at its
/// connections now and spin for a while (Proxy::kick), if it runs; starts nothing.
void kick_network_proxy();

}  // namespace efccl::runtime
