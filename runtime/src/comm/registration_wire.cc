#include "comm/registration_wire.h"

#include <algorithm>
#include <cstring>

namespace efccl::runtime {
namespace {

constexpr uint32_t kMagic = 0x47524645;  // "EFRG"
constexpr uint16_t kVersion = 1;
// magic u32, version u16, kind u8, reserved u8, id u64, then per direction:
// request: alloc_bytes u64, handle[64] (88 bytes); reply: ok u8, reserved[7], address u64,
// error bytes (24 + 16 + error).
constexpr std::size_t kHeaderBytes = 16;
constexpr std::size_t kRequestBytes = kHeaderBytes + 8 + kIpcHandleBytes;
constexpr std::size_t kReplyFixedBytes = kHeaderBytes + 16;

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, sizeof(T));
}

template <typename T>
T get(std::string_view bytes, std::size_t at) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

void put_header(std::string& out, RegistrationKind kind, uint64_t id) {
  put<uint32_t>(out, kMagic);
  put<uint16_t>(out, kVersion);
  put<uint8_t>(out, static_cast<uint8_t>(kind));
  put<uint8_t>(out, 0);
  put<uint64_t>(out, id);
}

/// Checks the common header; `what` names the message in errors.
Status check_header(std::string_view bytes, std::size_t at_least, const char* what,
                    RegistrationKind* kind, uint64_t* id) {
  if (bytes.size() < at_least)
    return Status::error(std::string(what) + " of " + std::to_string(bytes.size()) +
                         " bytes is too short (at least " + std::to_string(at_least) + ")");
  if (get<uint32_t>(bytes, 0) != kMagic)
    return Status::error(std::string(what) + " does not start with the registration magic");
  if (const uint16_t v = get<uint16_t>(bytes, 4); v != kVersion)
    return Status::error(std::string(what) + " has version " + std::to_string(v) +
                         " (this library speaks " + std::to_string(kVersion) + ")");
  const uint8_t k = get<uint8_t>(bytes, 6);
  if (k < 1 || k > 3)
    return Status::error(std::string(what) + " has an unknown kind " + std::to_string(k));
  *kind = static_cast<RegistrationKind>(k);
  *id = get<uint64_t>(bytes, 8);
  return Status::ok();
}

}  // namespace

std::string encode(const RegistrationRequest& r) {
  std::string out;
  out.reserve(kRequestBytes);
  put_header(out, r.kind, r.id);
  put<uint64_t>(out, r.alloc_bytes);
  out.append(reinterpret_cast<const char*>(r.handle), kIpcHandleBytes);
  return out;
}

std::string encode(const RegistrationReply& r) {
  std::string out;
  const std::size_t n = std::min(r.error.size(), kMaxReplyError);
  out.reserve(kReplyFixedBytes + n);
  put_header(out, r.kind, r.id);
  put<uint8_t>(out, r.ok ? 1 : 0);
  out.append(7, '\0');
  put<uint64_t>(out, r.address);
  out.append(r.error.data(), n);
  return out;
}

StatusOr<RegistrationRequest> decode_request(std::string_view bytes) {
  RegistrationRequest r;
  if (Status s = check_header(bytes, kRequestBytes, "a registration request", &r.kind, &r.id); !s)
    return s;
  if (bytes.size() != kRequestBytes)
    return Status::error("a registration request of " + std::to_string(bytes.size()) +
                         " bytes has the wrong length (" + std::to_string(kRequestBytes) + ")");
  if (r.kind == RegistrationKind::kStopped)
    return Status::error("a registration request of kind 'stopped' (only replies have it)");
  if (r.id == 0) return Status::error("a registration request with id 0");
  r.alloc_bytes = get<uint64_t>(bytes, kHeaderBytes);
  if (r.kind == RegistrationKind::kImport && r.alloc_bytes == 0)
    return Status::error("an import request for an allocation of 0 bytes");
  std::memcpy(r.handle, bytes.data() + kHeaderBytes + 8, kIpcHandleBytes);
  return r;
}

StatusOr<RegistrationReply> decode_reply(std::string_view bytes) {
  RegistrationReply r;
  if (Status s = check_header(bytes, kReplyFixedBytes, "a registration reply", &r.kind, &r.id);
      !s)
    return s;
  if (bytes.size() > kReplyFixedBytes + kMaxReplyError)
    return Status::error("a registration reply of " + std::to_string(bytes.size()) +
                         " bytes is too long (at most " +
                         std::to_string(kReplyFixedBytes + kMaxReplyError) + ")");
  const uint8_t ok = get<uint8_t>(bytes, kHeaderBytes);
  if (ok > 1) return Status::error("a registration reply with ok = " + std::to_string(ok));
  r.ok = ok == 1;
  r.address = get<uint64_t>(bytes, kHeaderBytes + 8);
  r.error.assign(bytes.substr(kReplyFixedBytes));
  if (r.kind == RegistrationKind::kStopped ? r.id != 0 : r.id == 0)
    return Status::error("a registration reply of kind " +
                         std::to_string(static_cast<int>(r.kind)) + " with id " +
                         std::to_string(r.id));
  if (r.ok && r.kind == RegistrationKind::kImport && r.address == 0)
    return Status::error("a successful import reply with address 0");
  return r;
}

}  // namespace efccl::runtime
