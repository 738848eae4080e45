#include "comm/shared_registrations.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <system_error>
#include <utility>

#include "base/driver_entry.h"
#include "base/pointer_text.h"
#include "comm/registration_wire.h"
#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"

namespace efccl::runtime {
namespace {

using Millis = std::chrono::milliseconds;

/// Mappings a service may hold for one client rank (a peer cannot make it map without bound).
constexpr std::size_t kMaxImportsPerClient = 4096;
/// How long the service's wait for requests lasts before it looks at its stop flag again (the
/// flag also ends the wait within the bootstrap's poll slice).
constexpr Millis kServiceSlice{1000};

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

/// The driver's cuMemGetAddressRange (through the runtime: no -lcuda), or null.
AddressRangeFn address_range_fn() {
  static const auto fn = reinterpret_cast<AddressRangeFn>(driver_entry("cuMemGetAddressRange"));
  return fn;
}

/// The allocation holding `p`: its start and length.
Status allocation_of(const void* p, CUdeviceptr* base, std::size_t* bytes) {
  AddressRangeFn fn = address_range_fn();
  if (fn == nullptr) return Status::error("the CUDA driver has no cuMemGetAddressRange");
  const CUresult r = fn(base, bytes, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS)
    return Status::error("cuMemGetAddressRange failed with CUresult " +
                         std::to_string(static_cast<int>(r)));
  return Status::ok();
}

/// The process's IPC mappings of other processes' allocations, each opened once and counted:
/// several communicators (and services) may map the same allocation. Unmapping is deferred to a
/// thread of its own: cudaIpcCloseMemHandle returns only once every kernel running in this
/// process has ended (measured on an H200: 2.6 s with one kernel spinning), and such a kernel
/// may be waiting for the very process whose deregistration asked for the unmapping. A mapping
/// released by its last user is retired at once (no new user gets it; it is never touched
/// again) and unmapped when the closer gets to it.
class IpcImports {
 public:
  static IpcImports& instance() {
    static auto* imports = new IpcImports();  // never destroyed: services may outlive statics
    return *imports;
  }

  StatusOr<void*> open(const unsigned char* handle, int device, uint64_t alloc_bytes) {
    std::string key(reinterpret_cast<const char*>(handle), kIpcHandleBytes);
    key += "@" + std::to_string(device);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end() && it->second.closing)
      return Status::error("the allocation is still being unmapped here (unmapping waits for "
                           "this process's running kernels); register it again later");
    if (it == by_key_.end()) {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, handle, sizeof(h));
      void* base = nullptr;
      if (cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
          e != cudaSuccess) {
        (void)cudaGetLastError();
        return Status::error("cudaIpcOpenMemHandle on device " + std::to_string(device) + ": " +
                             cuda_text(e));
      }
      CUdeviceptr start = 0;
      std::size_t bytes = 0;
      Status range = allocation_of(base, &start, &bytes);
      if (!range || reinterpret_cast<void*>(start) != base || bytes < alloc_bytes) {
        it = by_key_.emplace(key, Entry{base, device, bytes, 0, false}).first;
        by_base_[base] = key;
        retire_locked(it);  // not used: unmapped by the closer like any other
        return Status::error(
            !range ? "the mapped allocation's range: " + range.message()
                   : "the mapped allocation has " + std::to_string(bytes) +
                         " bytes, fewer than the " + std::to_string(alloc_bytes) + " announced");
      }
      it = by_key_.emplace(key, Entry{base, device, bytes, 0, false}).first;
      by_base_[base] = key;
    }
    if (it->second.bytes < alloc_bytes)
      return Status::error("the allocation is mapped with " + std::to_string(it->second.bytes) +
                           " bytes, fewer than the " + std::to_string(alloc_bytes) + " announced");
    ++it->second.refs;
    return it->second.base;
  }

  /// One user fewer of the mapping at `base`; the last one retires it.
  void release(void* base) {
    std::lock_guard<std::mutex> lock(mu_);
    auto b = by_base_.find(base);
    if (b == by_base_.end()) return;
    auto it = by_key_.find(b->second);
    if (--it->second.refs > 0) return;
    retire_locked(it);
  }

 private:
  struct Entry {
    void* base;
    int device;
    std::size_t bytes;
    int refs;
    bool closing;
  };

  void retire_locked(std::map<std::string, Entry>::iterator it) {
    it->second.closing = true;
    pending_.push_back(it->second.base);
    if (!closer_started_) {
      try {
        std::thread([this] { close_pending(); }).detach();
        closer_started_ = true;
      } catch (const std::system_error& e) {
        EFCCL_WARN(it->second.device, std::string("starting the thread that unmaps other "
                                                  "processes' registered buffers: ") +
                                          e.what() + "; they stay mapped");
        pending_.clear();
        return;
      }
    }
    cv_.notify_one();
  }

  /// The closer thread: unmaps retired mappings one at a time, outside the lock.
  void close_pending() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !pending_.empty(); });
      void* base = pending_.front();
      pending_.pop_front();
      auto b = by_base_.find(base);
      if (b == by_base_.end()) continue;
      const int device = by_key_.at(b->second).device;
      lock.unlock();
      cudaError_t e = cudaSetDevice(device);
      if (e == cudaSuccess) e = cudaIpcCloseMemHandle(base);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        EFCCL_INFO(kLogAlloc, device, "cudaIpcCloseMemHandle(" + pointer_text(base) + "): " +
                                          cuda_text(e));
      }
      lock.lock();
      b = by_base_.find(base);
      if (b != by_base_.end()) {
        by_key_.erase(b->second);
        by_base_.erase(b);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> by_key_;
  std::map<void*, std::string> by_base_;
  std::deque<void*> pending_;
  bool closer_started_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<SharedRegistrations>> SharedRegistrations::start(
    std::shared_ptr<net::Bootstrap> boot, int rank, int device, std::vector<GpuPartner> partners,
    std::vector<int> clients, std::chrono::milliseconds timeout,
    std::vector<std::size_t> client_partner) {
  if (boot == nullptr) return Status::error("shared registrations need the rank's bootstrap");
  if (!client_partner.empty() && client_partner.size() != clients.size())
    return Status::error("shared registrations: one partner per client, or none");
  std::unique_ptr<SharedRegistrations> s(
      new SharedRegistrations(std::move(boot), rank, device, std::move(partners),
                              std::move(clients), timeout, std::move(client_partner)));
  if (!s->clients_.empty()) {
    try {
      s->service_ = std::thread([p = s.get()] { p->serve(); });
    } catch (const std::system_error& e) {
      return Status::error(std::string("starting the registration service thread: ") + e.what());
    }
  }
  return s;
}

SharedRegistrations::SharedRegistrations(std::shared_ptr<net::Bootstrap> boot, int rank,
                                         int device, std::vector<GpuPartner> partners,
                                         std::vector<int> clients, Millis timeout,
                                         std::vector<std::size_t> client_partner)
    : boot_(std::move(boot)),
      rank_(rank),
      device_(device),
      partners_(std::move(partners)),
      clients_(std::move(clients)),
      client_partner_(std::move(client_partner)),
      timeout_(timeout),
      partner_stopped_(partners_.size(), false) {}

SharedRegistrations::~SharedRegistrations() { stop(false); }

std::size_t SharedRegistrations::imported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return imports_.size();
}

void SharedRegistrations::serve() {
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    (void)cudaGetLastError();  // every import then fails, and says why
    EFCCL_INFO(kLogInit | kLogAlloc, device_,
               "rank " + std::to_string(rank_) + ": the registration service cannot use device " +
                   std::to_string(device_) + ": " + cuda_text(e));
  }
  while (!stopping_.load()) {
    const net::Deadline slice = net::Deadline::after(kServiceSlice);
    auto m = boot_->recv_any(clients_, kRegistrationRequestTag, slice, &stopping_);
    if (!m) {
      if (stopping_.load()) break;
      if (slice.expired()) continue;
      EFCCL_INFO(kLogInit | kLogAlloc, device_,
                 "rank " + std::to_string(rank_) + ": the registration service stops: " +
                     m.status().message());
      break;
    }
    const int from = clients_[m->first];
    const std::string reply = answer(from, m->second);
    if (Status s = boot_->send(from, kRegistrationReplyTag, reply, net::Deadline::after(timeout_),
                               &stopping_);
        !s)
      EFCCL_INFO(kLogInit | kLogAlloc, device_,
                 "rank " + std::to_string(rank_) + ": answering rank " + std::to_string(from) +
                     "'s registration request: " + s.message());
  }
}

bool SharedRegistrations::maps(int client, uint64_t address, std::size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, imp] : imports_) {
    if (key.first != client) continue;
    const auto base = reinterpret_cast<uint64_t>(imp.base);
    if (address >= base && bytes <= imp.bytes && address - base <= imp.bytes - bytes) return true;
  }
  return false;
}

std::string SharedRegistrations::answer(int from, const std::string& bytes) {
  RegistrationReply r;
  const std::string who = "rank " + std::to_string(rank_);
  auto req = decode_request(bytes);
  if (!req) {
    EFCCL_WARN(device_, who + ": an unreadable registration request from rank " +
                            std::to_string(from) + ": " + req.status().message());
    r.id = ~uint64_t{0};
    r.error = who + " could not read the request: " + req.status().message();
    return encode(r);
  }
  r.kind = req->kind;
  r.id = req->id;
  const auto key = std::make_pair(from, req->id);
  std::lock_guard<std::mutex> lock(mu_);
  if (req->kind == RegistrationKind::kImport) {
    std::size_t held = 0;
    for (const auto& [k, imp] : imports_) held += k.first == from ? 1 : 0;
    if (imports_.count(key) != 0) {
      r.error = who + " already maps registration " + std::to_string(req->id) + " of rank " +
                std::to_string(from);
    } else if (held >= kMaxImportsPerClient) {
      r.error = who + " already maps " + std::to_string(held) + " registrations of rank " +
                std::to_string(from) + " (the limit)";
    } else {
      auto base = IpcImports::instance().open(req->handle, device_, req->alloc_bytes);
      if (!base) {
        r.error = who + ": " + base.status().message();
      } else {
        imports_[key] = Import{*base, req->alloc_bytes};
        r.ok = true;
        r.address = reinterpret_cast<uint64_t>(*base);
        EFCCL_INFO(kLogAlloc, device_,
                   who + " mapped registration " + std::to_string(req->id) + " of rank " +
                       std::to_string(from) + " (an allocation of " +
                       std::to_string(req->alloc_bytes) + " bytes) at " + pointer_text(*base));
      }
    }
  } else {
    auto it = imports_.find(key);
    if (it == imports_.end()) {
      r.error = who + " maps no registration " + std::to_string(req->id) + " of rank " +
                std::to_string(from);
    } else {
      IpcImports::instance().release(it->second.base);
      imports_.erase(it);
      r.ok = true;
      EFCCL_INFO(kLogAlloc, device_,
                 who + " retired its mapping of registration " + std::to_string(req->id) +
                     " of rank " + std::to_string(from));
    }
  }
  return encode(r);
}

Status SharedRegistrations::await_reply(std::size_t i, uint8_t kind, uint64_t id,
                                        uint64_t* address) {
  const GpuPartner& p = partners_[i];
  const std::string who = "rank " + std::to_string(p.rank) + " (" + p.where + ")";
  const net::Deadline deadline = net::Deadline::after(timeout_);
  for (;;) {
    auto m = boot_->recv(p.rank, kRegistrationReplyTag, deadline, nullptr);
    if (!m) return Status::error(who + ": " + m.status().message());
    auto r = decode_reply(*m);
    if (!r) return Status::error(who + " sent an unreadable answer: " + r.status().message());
    if (r->kind == RegistrationKind::kStopped) {
      partner_stopped_[i] = true;
      if (kind == static_cast<uint8_t>(RegistrationKind::kClose)) return Status::ok();
      return Status::error(who + " stopped its registration service");
    }
    if (static_cast<uint8_t>(r->kind) != kind || r->id != id) continue;  // a late answer
    if (!r->ok) return Status::error(r->error);
    if (address != nullptr) *address = r->address;
    return Status::ok();
  }
}

uint64_t SharedRegistrations::share(void* buff, std::size_t size) {
  std::lock_guard<std::mutex> owner(owner_mu_);
  if (stopped_ || partners_.empty() || buff == nullptr || size == 0) return 0;
  const std::string what = "registered buffer " + pointer_text(buff) + " (" +
                           std::to_string(size) + " bytes) of rank " + std::to_string(rank_);
  const auto not_shared = [&](const std::string& why) {
    EFCCL_INFO(kLogInit | kLogAlloc, device_,
               what + " is not shared with the other processes on its GPU: " + why +
                   "; its transfers with them go through efccl's connection memory");
    return uint64_t{0};
  };
  cudaPointerAttributes attr{};
  if (cudaError_t e = cudaPointerGetAttributes(&attr, buff); e != cudaSuccess) {
    (void)cudaGetLastError();
    return not_shared("cudaPointerGetAttributes: " + cuda_text(e));
  }
  if (attr.type != cudaMemoryTypeDevice || attr.device != device_)
    return not_shared("it is not device memory of CUDA device " + std::to_string(device_));
  CUdeviceptr base = 0;
  std::size_t alloc_bytes = 0;
  if (Status s = allocation_of(buff, &base, &alloc_bytes); !s) return not_shared(s.message());
  const uint64_t offset = reinterpret_cast<uint64_t>(buff) - base;
  if (offset > alloc_bytes || size > alloc_bytes - offset)
    return not_shared("it extends past its allocation (" + std::to_string(alloc_bytes) +
                      " bytes at " + pointer_text(reinterpret_cast<void*>(base)) + ")");
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return not_shared("cudaIpcGetMemHandle: " + cuda_text(e) +
                      " (memory from cuMemCreate or a memory pool has no legacy IPC handle)");
  }
  const uint64_t id = ++next_id_;
  RegistrationRequest req;
  req.kind = RegistrationKind::kImport;
  req.id = id;
  req.alloc_bytes = alloc_bytes;
  static_assert(sizeof(handle) == kIpcHandleBytes, "cudaIpcMemHandle_t is 64 bytes");
  std::memcpy(req.handle, &handle, kIpcHandleBytes);
  const std::string bytes = encode(req);
  Registration reg;
  reg.begin = static_cast<const char*>(buff);
  reg.size = size;
  reg.partner_base.assign(partners_.size(), 0);
  std::size_t asked = 0;
  Status failed = Status::ok();
  for (std::size_t i = 0; i < partners_.size() && failed; ++i) {
    const GpuPartner& p = partners_[i];
    if (partner_stopped_[i]) {
      failed = Status::error("rank " + std::to_string(p.rank) + " (" + p.where +
                             ") stopped its registration service");
      break;
    }
    asked = i + 1;
    if (Status s = boot_->send(p.rank, kRegistrationRequestTag, bytes,
                               net::Deadline::after(timeout_), nullptr);
        !s) {
      failed = Status::error("rank " + std::to_string(p.rank) + " (" + p.where + "): " +
                             s.message());
      break;
    }
    uint64_t mapped = 0;
    if (Status s = await_reply(i, static_cast<uint8_t>(RegistrationKind::kImport), id, &mapped);
        !s) {
      failed = s;
      break;
    }
    reg.partner_base[i] = mapped + offset;
  }
  if (!failed) {
    EFCCL_WARN(device_, what + " is not shared with the other processes on its GPU: " +
                            failed.message() +
                            "; its transfers with them go through efccl's connection memory");
    // Whoever may have mapped it unmaps it again (answers are not awaited: a late one is
    // skipped by the next exchange).
    for (std::size_t i = 0; i < asked; ++i) send_close(i, id, false, nullptr);
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  registrations_[id] = std::move(reg);
  return id;
}

void SharedRegistrations::send_close(std::size_t i, uint64_t id, bool wait, Status* result) {
  const GpuPartner& p = partners_[i];
  if (partner_stopped_[i]) return;  // it closed everything when it stopped
  RegistrationRequest req;
  req.kind = RegistrationKind::kClose;
  req.id = id;
  const net::Deadline deadline = net::Deadline::after(wait ? timeout_ : Millis(1000));
  if (Status s = boot_->send(p.rank, kRegistrationRequestTag, encode(req), deadline, nullptr); !s)
    return;  // the connection is gone: so is the partner's bootstrap, and its service with it
  if (!wait) return;
  const Status s = await_reply(i, static_cast<uint8_t>(RegistrationKind::kClose), id, nullptr);
  if (s) return;
  // Gone (left, died) before answering: its mappings went with it. Silent while alive: an error.
  const bool timed_out = deadline.expired();
  EFCCL_INFO(kLogInit | kLogAlloc, device_,
             "rank " + std::to_string(rank_) + ": unmapping registration " + std::to_string(id) +
                 " at rank " + std::to_string(p.rank) + ": " + s.message());
  if (timed_out && result != nullptr && *result)
    *result = Status::error("rank " + std::to_string(p.rank) + " (" + p.where +
                            ") did not confirm within " + std::to_string(timeout_.count()) +
                            " ms that it unmapped the registered buffer: " + s.message());
}

Status SharedRegistrations::unshare(uint64_t id) {
  std::lock_guard<std::mutex> owner(owner_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (registrations_.erase(id) == 0) return Status::ok();  // never shared
  }
  Status result = Status::ok();
  for (std::size_t i = 0; i < partners_.size(); ++i) send_close(i, id, true, &result);
  return result;
}

std::optional<uint64_t> SharedRegistrations::partner_address(const void* p, std::size_t bytes,
                                                             std::size_t partner) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, reg] : registrations_) {
    if (c < reg.begin || static_cast<std::size_t>(c - reg.begin) > reg.size ||
        bytes > reg.size - static_cast<std::size_t>(c - reg.begin))
      continue;
    if (partner >= reg.partner_base.size()) return std::nullopt;
    return reg.partner_base[partner] + static_cast<uint64_t>(c - reg.begin);
  }
  return std::nullopt;
}

std::optional<uint64_t> SharedRegistrations::reader_address(const void* p, std::size_t bytes,
                                                            int reader) const {
  for (std::size_t i = 0; i < clients_.size() && i < client_partner_.size(); ++i)
    if (clients_[i] == reader) return partner_address(p, bytes, client_partner_[i]);
  return std::nullopt;
}

void SharedRegistrations::stop(bool abort) {
  {
    std::lock_guard<std::mutex> owner(owner_mu_);
    if (stopped_) return;
    stopped_ = true;
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, reg] : registrations_) ids.push_back(id);
      registrations_.clear();
    }
    Status ignored = Status::ok();  // destroy has nobody to report to: logged by send_close
    for (uint64_t id : ids)
      for (std::size_t i = 0; i < partners_.size(); ++i) send_close(i, id, !abort, &ignored);
    if (!ignored) EFCCL_WARN(device_, "rank " + std::to_string(rank_) + ": " + ignored.message());
  }
  stopping_.store(true);
  if (service_.joinable()) service_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, imp] : imports_) IpcImports::instance().release(imp.base);
    imports_.clear();
  }
  // Every client learns that nothing of theirs is mapped here any more (an owner waiting for a
  // close answer takes this as one).
  RegistrationReply stopped;
  stopped.kind = RegistrationKind::kStopped;
  stopped.ok = true;
  const std::string bytes = encode(stopped);
  for (int c : clients_)
    (void)boot_->send(c, kRegistrationReplyTag, bytes,
                      net::Deadline::after(abort ? Millis(100) : Millis(1000)), nullptr);
}

}  // namespace efccl::runtime
