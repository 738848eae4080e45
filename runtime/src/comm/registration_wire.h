// The messages of shared registrations (comm/shared_registrations.h) between the processes on
// one GPU, over the communicator's bootstrap: a request asks a rank of another process to map
// (import) or unmap (close) an allocation holding a registered buffer; the answer says where it
// was mapped, or why not. Requests come from peers, so decoding checks every field; nothing in
// a message is trusted beyond its bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "efccl/common/status.h"

namespace efccl::runtime {

/// Bootstrap tags of the two directions (distinct from the executor store's and regroup's).
inline constexpr uint64_t kRegistrationRequestTag = 0x00ef'5245'4701'0001ull;
inline constexpr uint64_t kRegistrationReplyTag = 0x00ef'5245'4701'0002ull;

/// Bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t, CU_IPC_HANDLE_SIZE).
inline constexpr std::size_t kIpcHandleBytes = 64;

enum class RegistrationKind : uint8_t {
  kImport = 1,   ///< map the allocation of `handle` (`alloc_bytes` long)
  kClose = 2,    ///< unmap what import `id` mapped
  kStopped = 3,  ///< (reply only, id 0) the sender's service stopped: it closed all it mapped
};

struct RegistrationRequest {
  RegistrationKind kind = RegistrationKind::kImport;
  uint64_t id = 0;           ///< the owner's registration id (> 0)
  uint64_t alloc_bytes = 0;  ///< kImport: the allocation's length (> 0)
  unsigned char handle[kIpcHandleBytes] = {};  ///< kImport only
};

struct RegistrationReply {
  RegistrationKind kind = RegistrationKind::kImport;  ///< the request's
  uint64_t id = 0;                                    ///< the request's (0 for kStopped)
  bool ok = false;
  uint64_t address = 0;  ///< kImport, ok: where the allocation starts in the answering process
  std::string error;     ///< !ok: why (at most kMaxReplyError bytes)
};

inline constexpr std::size_t kMaxReplyError = 1024;

std::string encode(const RegistrationRequest& r);
std::string encode(const RegistrationReply& r);
/// The request in `bytes`, or what is wrong with it.
StatusOr<RegistrationRequest> decode_request(std::string_view bytes);
/// The reply in `bytes`, or what is wrong with it.
StatusOr<RegistrationReply> decode_reply(std::string_view bytes);

}  // namespace efccl::runtime
