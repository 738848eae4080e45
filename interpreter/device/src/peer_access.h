// Peer access between two GPUs of this process, enabled once per process.
#pragma once

#include "efccl/common/status.h"

namespace efccl::device {

/// Lets device `from` access device `to`'s memory. Enabled once per process: every executor
/// needs it, and asking again only produces cudaErrorPeerAccessAlreadyEnabled (which
/// compute-sanitizer reports as an API error). Pairs enabled by someone else are still handled.
Status enable_peer_access(int from, int to);

}  // namespace efccl::device
