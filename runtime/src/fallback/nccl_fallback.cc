#include "fallback/nccl_fallback.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "bootstrap.h"
#include "enqueue/clique.h"
#include "comm/communicator.h"
#include "base/device_guard.h"
#include "efccl/host/numeric.h"
#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

/// The ELF note libefccl.so carries (shared_library.cc): name "efccl", this type.
constexpr uint32_t kEfcclNoteType = 0xefcc1;
/// The bootstrap tag of the real unique id's exchange (the runtime's other tags set one of the
/// top two bits; a bootstrap serves one communicator, whose init exchanges this once).
constexpr uint64_t kRealIdTag = 0x0efcc1fa11bac000ull;
constexpr const char* kDefaultName = "libnccl.so.2";
constexpr const char* kCudaToolkitCopy = "/usr/local/cuda/lib64/libnccl.so.2";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z): X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

/// The loaded object that contains `address`: its load bias and its program headers.
struct LoadedObject {
  ElfW(Addr) bias = 0;
  const ElfW(Phdr) * phdr = nullptr;
  ElfW(Half) phnum = 0;
  std::string name;
};

bool find_object(const void* address, LoadedObject* out) {
  struct Search {
    uintptr_t address;
    LoadedObject* out;
    bool found;
  } search{reinterpret_cast<uintptr_t>(address), out, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (s->address >= start && s->address < start + ph.p_memsz) {
            s->out->bias = info->dlpi_addr;
            s->out->phdr = info->dlpi_phdr;
            s->out->phnum = info->dlpi_phnum;
            s->out->name = info->dlpi_name != nullptr ? info->dlpi_name : "";
            s->found = true;
            return 1;
          }
        }
        return 0;
      },
      &search);
  return search.found;
}

/// Whether the object carries libefccl.so's note (any efccl build, under any file name).
bool has_efccl_note(const LoadedObject& object) {
  for (ElfW(Half) i = 0; i < object.phnum; ++i) {
    const ElfW(Phdr)& ph = object.phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(object.bias + ph.p_vaddr);
    const unsigned char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, p, sizeof(note));
      const unsigned char* name = p + sizeof(note);
      const std::size_t name_bytes = (note.n_namesz + 3u) & ~3u;
      const std::size_t desc_bytes = (note.n_descsz + 3u) & ~3u;
      if (name + name_bytes + desc_bytes > end) break;
      if (note.n_type == kEfcclNoteType && note.n_namesz == 6 && std::memcmp(name, "efccl", 6) == 0)
        return true;
      p = name + name_bytes + desc_bytes;
    }
  }
  return false;
}

/// Why the function at `fn` is efccl's ("" when it is not): this very efccl, or a library that
/// carries efccl's note.
std::string efccl_owner(const void* fn) {
  LoadedObject theirs, ours;
  if (!find_object(fn, &theirs)) return "";
  if (find_object(reinterpret_cast<const void*>(&efccl_owner), &ours) && ours.bias == theirs.bias &&
      ours.phdr == theirs.phdr)
    return "it is this efccl itself";
  if (has_efccl_note(theirs)) return "it is an efccl library (it carries efccl's ELF note)";
  return "";
}

/// The file this efccl was loaded from (the executable for a static link), canonical.
std::string own_file() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&own_file), &info) == 0 || info.dli_fname == nullptr)
    return "";
  char resolved[PATH_MAX];
  const char* name = info.dli_fname[0] != '\0' ? info.dli_fname : "/proc/self/exe";
  return realpath(name, resolved) != nullptr ? resolved : "";
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return !a.empty() && !b.empty() && stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

/// Copies `path` into an anonymous memory file and opens that, isolated. The descriptor stays
/// open: its /proc/self/fd name must never be reused for another copy (the loader would take
/// the earlier object for the later name).
StatusOr<void*> open_private_copy(const std::string& path) {
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return Status::error("opening " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(in, &st) != 0) {
    const int e = errno;
    ::close(in);
    return Status::error("fstat " + path + ": " + std::strerror(e));
  }
  const int copy = memfd_create("efccl-private-libnccl.so.2", MFD_CLOEXEC);
  if (copy < 0) {
    const int e = errno;
    ::close(in);
    return Status::error(std::string("memfd_create: ") + std::strerror(e));
  }
  off_t offset = 0;
  while (offset < st.st_size) {
    const ssize_t n = sendfile(copy, in, &offset, static_cast<size_t>(st.st_size - offset));
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(in);
      ::close(copy);
      return Status::error("copying " + path + " into memory: " + std::strerror(e));
    }
  }
  ::close(in);
  const std::string name = "/proc/self/fd/" + std::to_string(copy);
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    const std::string e = dl_error();
    ::close(copy);
    return Status::error("opening the private copy of " + path + ": " + e);
  }
  return handle;
}

std::mutex& libraries_mutex() {
  static std::mutex m;
  return m;
}
/// Loaded libraries by canonical file (never unloaded: NCCL keeps threads and atexit handlers).
std::map<std::string, std::shared_ptr<const NcclLibrary>>& libraries() {
  static auto* m = new std::map<std::string, std::shared_ptr<const NcclLibrary>>();
  return *m;
}

thread_local const char* t_inside_real_nccl = nullptr;

/// A failed real call: its code, and efccl's message naming the function, the library and
/// what NCCL said.
ApiStatus real_failure(const NcclLibrary& lib, const std::string& what, ncclResult_t r) {
  std::string message = what + " failed on " + lib.describe() + ": " + lib.get_error_string(r);
  const char* last = lib.get_last_error(nullptr);
  if (last != nullptr && *last != '\0') message += " (NCCL: " + std::string(last) + ")";
  return ApiStatus(r, message);
}

/// Polls the real communicators until none reports ncclInProgress (non-blocking NCCL), the
/// deadline passes or `*abort` becomes true. NCCL finishes a non-blocking group on a thread of
/// its own, usually within microseconds: the first milliseconds only yield, later polls sleep.
ApiStatus wait_real(const NcclLibrary& lib, const std::vector<ncclComm_t>& comms,
                    const std::string& what, std::chrono::steady_clock::time_point deadline,
                    std::chrono::nanoseconds timeout, const std::atomic<bool>* abort) {
  const auto busy_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  for (;;) {
    bool pending = false;
    for (ncclComm_t c : comms) {
      if (c == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = lib.comm_get_async_error(c, &state); r != ncclSuccess)
        return real_failure(lib, "ncclCommGetAsyncError after " + what, r);
      if (state == ncclInProgress)
        pending = true;
      else if (state != ncclSuccess)
        return real_failure(lib, what, state);
    }
    if (!pending) return ApiStatus::ok();
    if (abort != nullptr && abort->load())
      return ApiStatus::invalid_usage(what + " on " + lib.describe() +
                                      " was abandoned: the "
                                      "communicator was destroyed or aborted meanwhile");
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return ApiStatus::system(
          what + " on " + lib.describe() + " did not complete within " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
          " ms (a rank of the communicator may not have reached it)");
    if (now < busy_until)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// A premulsum scalar as one element of `dtype` (the scalar was read from such an element, so
/// this is exact).
void encode_scalar(ef::DataType dtype, double v, unsigned char* out) {
  namespace h = efccl::host;
  const auto put = [out](auto x) { std::memcpy(out, &x, sizeof(x)); };
  switch (dtype) {
    case ef::DataType::kInt8:
      put(static_cast<int8_t>(v));
      break;
    case ef::DataType::kUint8:
      put(static_cast<uint8_t>(v));
      break;
    case ef::DataType::kInt32:
      put(static_cast<int32_t>(v));
      break;
    case ef::DataType::kUint32:
      put(static_cast<uint32_t>(v));
      break;
    case ef::DataType::kInt64:
      put(static_cast<int64_t>(v));
      break;
    case ef::DataType::kUint64:
      put(static_cast<uint64_t>(v));
      break;
    case ef::DataType::kFloat16:
      put(h::float_to_half(static_cast<float>(v)));
      break;
    case ef::DataType::kFloat32:
      put(static_cast<float>(v));
      break;
    case ef::DataType::kFloat64:
      put(v);
      break;
    case ef::DataType::kBFloat16:
      put(h::float_to_bfloat16(static_cast<float>(v)));
      break;
    case ef::DataType::kFp8E4M3:
      put(h::float_to_fp8_e4m3(static_cast<float>(v)));
      break;
    case ef::DataType::kFp8E5M2:
      put(h::float_to_fp8_e5m2(static_cast<float>(v)));
      break;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Environment and loading

StatusOr<FallbackMode> fallback_mode_from_environment() {
  const char* v = std::getenv("EFCCL_FALLBACK");
  if (v == nullptr) return FallbackMode::kOff;
  const std::string value = lower(v);
  if (value.empty() || value == "none" || value == "off") return FallbackMode::kOff;
  if (value == "nccl") return FallbackMode::kNccl;
  return Status::error("EFCCL_FALLBACK=" + std::string(v) +
                       " is not a fallback efccl knows (valid: nccl, or none/off/unset for none)");
}

std::string NcclLibrary::describe() const {
  return "NCCL " + version_string(version_) + " from " + path_ +
         (private_copy_ ? " (private copy)" : "");
}

void* NcclLibrary::symbol(const char* name) const { return dlsym(handle_, name); }

StatusOr<std::shared_ptr<const NcclLibrary>> NcclLibrary::open(const std::string& path) {
  // One load at a time: two threads must not both make a private copy of one file.
  std::lock_guard<std::mutex> lock(libraries_mutex());
  const bool bare = path.find('/') == std::string::npos;
  std::string file = path;
  if (!bare) {
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) == nullptr)
      return Status::error(path + ": " + std::strerror(errno));
    file = resolved;
    if (auto it = libraries().find(file); it != libraries().end()) return it->second;
    if (same_file(file, own_file()))
      return Status::error(path + " is efccl itself (" + file + "), not a real NCCL");
  }

  // Already loaded (under this name, or the same file under another)? Then its references to
  // its own symbols were bound through the global scope, where efccl may come first.
  bool private_copy = false;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle != nullptr) {
    void* own = dlsym(handle, "ncclGetUniqueId");
    Dl_info info{};
    if (own != nullptr && dladdr(own, &info) != 0 && info.dli_fname != nullptr) {
      char resolved[PATH_MAX];
      file = realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
      if (auto it = libraries().find(file); it != libraries().end()) return it->second;
    }
    if (own != nullptr && efccl_owner(own).empty()) {
      void* global = dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
      if (global != nullptr && global != own) {
        auto copy = open_private_copy(file);
        if (!copy) return copy.status();
        handle = *copy;
        private_copy = true;
      }
    }
  } else {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) return Status::error("cannot load " + path + ": " + dl_error());
  }

  std::shared_ptr<NcclLibrary> lib(new NcclLibrary());
  lib->handle_ = handle;
  lib->private_copy_ = private_copy;
  std::vector<std::string> missing;
  const auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) missing.push_back(name);
  };
  resolve(lib->get_version, "ncclGetVersion");
  if (lib->get_version == nullptr)
    return Status::error(path + " has no ncclGetVersion: it is not an NCCL library");
  if (const std::string why = efccl_owner(reinterpret_cast<const void*>(lib->get_version));
      !why.empty())
    return Status::error(path + " is not a real NCCL: " + why +
                         "; point EFCCL_NCCL_LIB at NVIDIA's libnccl.so.2");
  if (bare && !private_copy) {  // where the loader found it
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(lib->get_version), &info) != 0 &&
        info.dli_fname != nullptr) {
      char resolved[PATH_MAX];
      file = realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
      if (auto it = libraries().find(file); it != libraries().end()) return it->second;
    }
  }
  lib->path_ = file;
  resolve(lib->get_error_string, "ncclGetErrorString");
  resolve(lib->get_last_error, "ncclGetLastError");
  resolve(lib->get_unique_id, "ncclGetUniqueId");
  resolve(lib->comm_init_rank_config, "ncclCommInitRankConfig");
  resolve(lib->comm_get_async_error, "ncclCommGetAsyncError");
  resolve(lib->comm_finalize, "ncclCommFinalize");
  resolve(lib->comm_destroy, "ncclCommDestroy");
  resolve(lib->comm_abort, "ncclCommAbort");
  resolve(lib->comm_revoke, "ncclCommRevoke");
  resolve(lib->comm_split, "ncclCommSplit");
  resolve(lib->group_start, "ncclGroupStart");
  resolve(lib->group_end, "ncclGroupEnd");
  resolve(lib->red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum");
  resolve(lib->red_op_destroy, "ncclRedOpDestroy");
  resolve(lib->all_reduce, "ncclAllReduce");
  resolve(lib->broadcast, "ncclBroadcast");
  resolve(lib->reduce, "ncclReduce");
  resolve(lib->all_gather, "ncclAllGather");
  resolve(lib->reduce_scatter, "ncclReduceScatter");
  resolve(lib->all_to_all, "ncclAlltoAll");
  resolve(lib->gather, "ncclGather");
  resolve(lib->scatter, "ncclScatter");

  // The version first: an older NCCL lacks some of these functions, which says less.
  int version = 0;
  if (const ncclResult_t r = lib->get_version(&version); r != ncclSuccess)
    return Status::error(file + ": ncclGetVersion failed with result " + std::to_string(r));
  lib->version_ = version;
  if (version < NCCL_VERSION(2, 28, 0) || version >= 30000)
    return Status::error(
        file + " is NCCL " + version_string(version) +
        "; the fallback needs NCCL 2.28 or a newer 2.x: efccl hands it nccl.h 2.28's ncclConfig_t, "
        "datatypes and functions (ncclCommRevoke, ncclAlltoAll, ...), which an older library reads "
        "differently or lacks");
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) {
      if (!list.empty()) list += ", ";
      list += m;
    }
    return Status::error(file + " (NCCL " + version_string(version) + ") lacks " + list);
  }

  libraries().emplace(file, lib);
  EFCCL_INFO(kLogInit, -1,
             "EFCCL_FALLBACK=nccl: loaded " + lib->describe() +
                 (private_copy ? ": that file was loaded already, behind another definition of its "
                                 "symbols (efccl) in the global scope, so a copy of it was opened "
                                 "RTLD_LOCAL | RTLD_DEEPBIND"
                               : ", RTLD_LOCAL | RTLD_DEEPBIND") +
                 "; calls that no program covers run on it");
  return std::shared_ptr<const NcclLibrary>(std::move(lib));
}

StatusOr<std::shared_ptr<const NcclLibrary>> NcclLibrary::load(const std::string& path) {
  if (path.empty()) return Status::error("the library path is empty");
  if (path.find('/') == std::string::npos) return open(path);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::error(path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::error(path + " is not a regular file");
  return open(path);
}

StatusOr<std::shared_ptr<const NcclLibrary>> NcclLibrary::find() {
  std::vector<std::string> candidates;
  if (const char* dirs = std::getenv("LD_LIBRARY_PATH")) {
    std::string dir;
    for (const char* p = dirs;; ++p) {
      if (*p == ':' || *p == ';' || *p == '\0') {
        if (!dir.empty()) candidates.push_back(dir + "/" + kDefaultName);
        dir.clear();
        if (*p == '\0') break;
      } else {
        dir += *p;
      }
    }
  }
  candidates.push_back(kDefaultName);  // the loader's search (ld.so.cache, system directories)
  candidates.push_back(kCudaToolkitCopy);

  std::string tried;
  for (const std::string& c : candidates) {
    const bool bare = c.find('/') == std::string::npos;
    if (!bare && access(c.c_str(), F_OK) != 0) continue;
    auto lib = load(c);
    if (lib) return lib;
    tried += "\n  " + (bare ? c + " through the loader" : c) + ": " + lib.status().message();
  }
  return Status::error(
      "no real NCCL found (set EFCCL_NCCL_LIB to the path of NVIDIA's "
      "libnccl.so.2); tried:" +
      (tried.empty() ? std::string(" nothing was found") : tried));
}

StatusOr<std::shared_ptr<const NcclLibrary>> nccl_library_from_environment() {
  const char* path = std::getenv("EFCCL_NCCL_LIB");
  if (path == nullptr || *path == '\0') return NcclLibrary::find();
  auto lib = NcclLibrary::load(path);
  if (!lib)
    return Status::error("EFCCL_NCCL_LIB=" + std::string(path) + ": " + lib.status().message());
  return lib;
}

RealNcclCall::RealNcclCall(const char* function) {
  if (t_inside_real_nccl != nullptr) {
    status_ = ApiStatus::internal(
        std::string("the real NCCL called back into efccl during its ") + t_inside_real_nccl +
        ", and efccl was about to call its " + function +
        " again; refusing instead of recursing (is a second efccl interposed on the NCCL "
        "library EFCCL_NCCL_LIB names?)");
    return;
  }
  t_inside_real_nccl = function;
  entered_ = true;
}

RealNcclCall::~RealNcclCall() {
  if (entered_) t_inside_real_nccl = nullptr;
}

// ---------------------------------------------------------------------------------------------
// A clique's real communicators

CliqueFallback::CliqueFallback(std::shared_ptr<const NcclLibrary> library,
                               std::vector<ncclComm_t> real, std::vector<int> devices)
    : library_(std::move(library)), real_(std::move(real)), devices_(std::move(devices)) {}

CliqueFallback::CliqueFallback(std::shared_ptr<const NcclLibrary> library, std::string unavailable)
    : library_(std::move(library)), unavailable_(std::move(unavailable)) {}

CliqueFallback::~CliqueFallback() {
  DeviceGuard guard;
  RealNcclCall inside("ncclCommAbort");
  if (!inside.status()) return;
  for (ncclComm_t c : real_)
    if (c != nullptr) (void)library_->comm_abort(c);
}

ncclComm_t CliqueFallback::real(int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return rank >= 0 && static_cast<std::size_t>(rank) < real_.size()
             ? real_[static_cast<std::size_t>(rank)]
             : nullptr;
}

ApiStatus CliqueFallback::run(const std::vector<Call>& set, const std::string& why,
                              std::chrono::nanoseconds timeout) {
  const Call& ref = set.front();
  const std::string api = api_name(ref.kind);
  if (!unavailable_.empty())
    return ApiStatus::invalid_usage(api + ": " + why +
                                    "; EFCCL_FALLBACK=nccl cannot run it on "
                                    "this communicator: " +
                                    unavailable_);
  const NcclLibrary& lib = *library_;
  EFCCL_INFO(
      kLogColl | kLogTuning, -1,
      describe(ref) + ": no program covers it (" + why + "); running it on " + lib.describe());
  RealNcclCall inside(api.c_str());
  if (!inside.status()) return inside.status();
  DeviceGuard guard;

  std::vector<ncclComm_t> comms;
  for (const Call& c : set) {
    ncclComm_t comm = real(c.rank);
    if (comm == nullptr)
      return ApiStatus::invalid_usage(api + ": rank " + std::to_string(c.rank) +
                                      "'s NCCL communicator is gone (destroyed or aborted)");
    comms.push_back(comm);
  }
  // A premulsum operator exists per real communicator: one per call, destroyed once the group
  // has been enqueued.
  std::vector<ncclRedOp_t> ops(set.size(), static_cast<ncclRedOp_t>(ref.op));
  std::size_t created = 0;
  ApiStatus status;
  if (ref.op == ef::RedOp::kPreMulSum) {
    for (; created < set.size(); ++created) {
      unsigned char scalar[8] = {};
      encode_scalar(set[created].dtype, set[created].premul_scalar, scalar);
      const ncclResult_t r = lib.red_op_create_pre_mul_sum(
          &ops[created], scalar, static_cast<ncclDataType_t>(set[created].dtype),
          ncclScalarHostImmediate, comms[created]);
      if (r != ncclSuccess) {
        status = real_failure(lib, "ncclRedOpCreatePreMulSum", r);
        break;
      }
    }
  }
  if (status) {
    if (const ncclResult_t r = lib.group_start(); r != ncclSuccess)
      status = real_failure(lib, "ncclGroupStart", r);
  }
  if (status) {
    for (std::size_t i = 0; i < set.size() && status; ++i) {
      const Call& c = set[i];
      const auto dtype = static_cast<ncclDataType_t>(c.dtype);
      if (c.rank >= 0 && static_cast<std::size_t>(c.rank) < devices_.size())
        cudaSetDevice(devices_[static_cast<std::size_t>(c.rank)]);
      ncclResult_t r = ncclSuccess;
      switch (c.kind) {
        case CallKind::kAllReduce:
          r = lib.all_reduce(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], comms[i], c.stream);
          break;
        case CallKind::kBroadcast:
          r = lib.broadcast(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kReduce:
          r = lib.reduce(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], c.root, comms[i],
                         c.stream);
          break;
        case CallKind::kAllGather:
          r = lib.all_gather(c.sendbuff, c.recvbuff, c.count, dtype, comms[i], c.stream);
          break;
        case CallKind::kReduceScatter:
          r = lib.reduce_scatter(c.sendbuff, c.recvbuff, c.count, dtype, ops[i], comms[i],
                                 c.stream);
          break;
        case CallKind::kAllToAll:
          r = lib.all_to_all(c.sendbuff, c.recvbuff, c.count, dtype, comms[i], c.stream);
          break;
        case CallKind::kGather:
          r = lib.gather(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kScatter:
          r = lib.scatter(c.sendbuff, c.recvbuff, c.count, dtype, c.root, comms[i], c.stream);
          break;
        case CallKind::kSend:
        case CallKind::kRecv:
          status = ApiStatus::internal("send/receive never falls back to NCCL");
          continue;
      }
      if (r != ncclSuccess && r != ncclInProgress)
        status = real_failure(lib, api + " of rank " + std::to_string(c.rank), r);
    }
    // The group is closed even after a failed call (NCCL then drops the group's calls).
    const ncclResult_t r = lib.group_end();
    if (r == ncclInProgress) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      ApiStatus s = wait_real(lib, comms, "ncclGroupEnd (" + api + ")", deadline, timeout, nullptr);
      if (!s && status) status = s;
    } else if (r != ncclSuccess && status) {
      status = real_failure(lib, "ncclGroupEnd (" + api + ")", r);
    }
  }
  for (std::size_t i = 0; i < created; ++i) (void)lib.red_op_destroy(ops[i], comms[i]);
  return status;
}

ApiStatus CliqueFallback::release(int32_t rank, bool abort) {
  ncclComm_t comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= real_.size()) return ApiStatus::ok();
    std::swap(comm, real_[static_cast<std::size_t>(rank)]);
  }
  if (comm == nullptr) return ApiStatus::ok();
  const char* what = abort ? "ncclCommAbort" : "ncclCommDestroy";
  RealNcclCall inside(what);
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = abort ? library_->comm_abort(comm) : library_->comm_destroy(comm);
  return r == ncclSuccess
             ? ApiStatus::ok()
             : real_failure(*library_, std::string(what) + " of rank " + std::to_string(rank), r);
}

ApiStatus CliqueFallback::finalize(int32_t rank, std::chrono::nanoseconds timeout) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommFinalize");
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = library_->comm_finalize(comm);
  if (r != ncclSuccess && r != ncclInProgress)
    return real_failure(*library_, "ncclCommFinalize", r);
  return wait_real(*library_, {comm}, "ncclCommFinalize",
                   std::chrono::steady_clock::now() + timeout, timeout, nullptr);
}

ApiStatus CliqueFallback::revoke(int32_t rank, std::chrono::nanoseconds timeout) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommRevoke");
  if (!inside.status()) return inside.status();
  DeviceGuard guard;
  const ncclResult_t r = library_->comm_revoke(comm, NCCL_REVOKE_DEFAULT);
  if (r != ncclSuccess && r != ncclInProgress) return real_failure(*library_, "ncclCommRevoke", r);
  return wait_real(*library_, {comm}, "ncclCommRevoke", std::chrono::steady_clock::now() + timeout,
                   timeout, nullptr);
}

ApiStatus CliqueFallback::async_error(int32_t rank) {
  ncclComm_t comm = real(rank);
  if (comm == nullptr) return ApiStatus::ok();
  RealNcclCall inside("ncclCommGetAsyncError");
  if (!inside.status()) return inside.status();
  ncclResult_t state = ncclSuccess;
  if (const ncclResult_t r = library_->comm_get_async_error(comm, &state); r != ncclSuccess)
    return real_failure(*library_, "ncclCommGetAsyncError", r);
  if (state == ncclSuccess || state == ncclInProgress) return ApiStatus::ok();
  return real_failure(*library_, "the NCCL communicator of rank " + std::to_string(rank), state);
}

// ---------------------------------------------------------------------------------------------
// Creation

FallbackPlan single_process_fallback_plan(const std::vector<int>& devices) {
  FallbackPlan plan;
  plan.nranks = static_cast<int>(devices.size());
  std::map<int, int32_t> first_rank_on;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    const auto rank = static_cast<int32_t>(r);
    plan.ranks.push_back(rank);
    plan.devices.push_back(devices[r]);
    auto [it, fresh] = first_rank_on.emplace(devices[r], rank);
    if (!fresh && plan.shared_gpu.empty())
      plan.shared_gpu = "ranks " + std::to_string(it->second) + " and " + std::to_string(rank) +
                        " share CUDA device " + std::to_string(devices[r]);
  }
  return plan;
}

namespace {

/// Creates the real communicators of the plan's ranks from `id` (non-blocking, polled), and
/// hands out blocking children of them.
ApiStatus create_real_comms(const NcclLibrary& lib, const FallbackPlan& plan,
                            const ncclUniqueId& id, std::vector<ncclComm_t>* out) {
  const std::chrono::nanoseconds timeout = init_timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  DeviceGuard guard;
  std::vector<ncclComm_t> comms(plan.ranks.size(), nullptr);
  ApiStatus status;
  if (const ncclResult_t r = lib.group_start(); r != ncclSuccess)
    return real_failure(lib, "ncclGroupStart", r);
  for (std::size_t i = 0; i < plan.ranks.size() && status; ++i) {
    // Non-blocking, whatever the user asked for: polling keeps a deadline and an abort path.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (i < plan.configs.size()) config = plan.configs[i].get();
    config.blocking = 0;
    if (cudaError_t e = cudaSetDevice(plan.devices[i]); e != cudaSuccess) {
      status = ApiStatus::cuda("cudaSetDevice(" + std::to_string(plan.devices[i]) +
                               "): " + cudaGetErrorString(e));
      break;
    }
    const ncclResult_t r =
        lib.comm_init_rank_config(&comms[i], plan.nranks, id, plan.ranks[i], &config);
    if (r != ncclSuccess && r != ncclInProgress)
      status =
          real_failure(lib, "ncclCommInitRankConfig of rank " + std::to_string(plan.ranks[i]), r);
  }
  const ncclResult_t r = lib.group_end();
  if (status && r != ncclSuccess && r != ncclInProgress)
    status = real_failure(lib, "ncclGroupEnd (ncclCommInitRankConfig)", r);
  if (status)
    status = wait_real(lib, comms, "ncclCommInitRankConfig", deadline, timeout, plan.abort);
  if (!status) {
    for (ncclComm_t c : comms)
      if (c != nullptr) (void)lib.comm_abort(c);
    return status;
  }
  // A non-blocking communicator ends every group on a thread of NCCL's, which the caller must
  // then poll: 50-150 us per call measured. The collectives therefore run on a blocking child,
  // split from the non-blocking parent: the split itself runs as the parent's (non-blocking)
  // job, so it keeps the deadline above, and the child's groups end on the calling thread.
  std::vector<ncclComm_t> children(comms.size(), nullptr);
  if (const ncclResult_t g = lib.group_start(); g != ncclSuccess)
    status = real_failure(lib, "ncclGroupStart", g);
  for (std::size_t i = 0; i < comms.size() && status; ++i) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (i < plan.configs.size()) config = plan.configs[i].get();
    config.blocking = 1;
    if (cudaError_t e = cudaSetDevice(plan.devices[i]); e != cudaSuccess) {
      status = ApiStatus::cuda("cudaSetDevice(" + std::to_string(plan.devices[i]) +
                               "): " + cudaGetErrorString(e));
      break;
    }
    const ncclResult_t s = lib.comm_split(comms[i], 0, plan.ranks[i], &children[i], &config);
    if (s != ncclSuccess && s != ncclInProgress)
      status = real_failure(lib, "ncclCommSplit of rank " + std::to_string(plan.ranks[i]), s);
  }
  if (const ncclResult_t g = lib.group_end(); status && g != ncclSuccess && g != ncclInProgress)
    status = real_failure(lib, "ncclGroupEnd (ncclCommSplit)", g);
  if (status) {
    std::vector<ncclComm_t> both = comms;
    both.insert(both.end(), children.begin(), children.end());
    status = wait_real(lib, both, "ncclCommSplit", deadline, timeout, plan.abort);
  }
  // The parents are not needed any more: finalize (non-blocking, polled) and free them.
  if (status) {
    if (const ncclResult_t g = lib.group_start(); g != ncclSuccess)
      status = real_failure(lib, "ncclGroupStart", g);
    for (std::size_t i = 0; i < comms.size() && status; ++i) {
      const ncclResult_t f = lib.comm_finalize(comms[i]);
      if (f != ncclSuccess && f != ncclInProgress)
        status = real_failure(lib, "ncclCommFinalize of rank " + std::to_string(plan.ranks[i]), f);
    }
    if (const ncclResult_t g = lib.group_end(); status && g != ncclSuccess && g != ncclInProgress)
      status = real_failure(lib, "ncclGroupEnd (ncclCommFinalize)", g);
    if (status) status = wait_real(lib, comms, "ncclCommFinalize", deadline, timeout, plan.abort);
  }
  for (ncclComm_t c : comms)
    if (c != nullptr) (void)(status ? lib.comm_destroy(c) : lib.comm_abort(c));
  if (!status) {
    for (ncclComm_t c : children)
      if (c != nullptr) (void)lib.comm_abort(c);
    return status;
  }
  *out = std::move(children);
  return ApiStatus::ok();
}

}  // namespace

ApiStatus create_fallback(const FallbackPlan& plan, std::shared_ptr<CliqueFallback>* out) {
  out->reset();
  StatusOr<FallbackMode> mode = fallback_mode_from_environment();
  if (!mode) return ApiStatus::invalid_usage(mode.status().message());
  if (*mode == FallbackMode::kOff) return ApiStatus::ok();
  RealNcclCall inside("ncclCommInitRankConfig");
  if (!inside.status()) return inside.status();

  StatusOr<std::shared_ptr<const NcclLibrary>> lib = nccl_library_from_environment();
  ApiStatus status =
      lib ? ApiStatus::ok() : ApiStatus::system("EFCCL_FALLBACK=nccl: " + lib.status().message());
  if (status && !plan.shared_gpu.empty()) {
    // Decided alike in every process (from the table of all ranks): no exchange, no NCCL init.
    EFCCL_WARN(plan.devices.empty() ? -1 : plan.devices.front(),
               "EFCCL_FALLBACK=nccl: this communicator of " + std::to_string(plan.nranks) +
                   " ranks has no NCCL fallback: " + plan.shared_gpu +
                   ", which NCCL refuses; calls that no program covers fail on it");
    *out = std::make_shared<CliqueFallback>(*lib, plan.shared_gpu +
                                                      " (NCCL refuses several "
                                                      "ranks on one GPU)");
    return ApiStatus::ok();
  }
  if (!status && plan.leader == nullptr) return status;

  const bool holds_rank0 = std::find(plan.ranks.begin(), plan.ranks.end(), 0) != plan.ranks.end();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (status && holds_rank0) {
    if (const ncclResult_t r = (*lib)->get_unique_id(&id); r != ncclSuccess)
      status = real_failure(**lib, "ncclGetUniqueId", r);
  }
  if (plan.leader != nullptr) {
    // Every process learns the id from rank 0's, and whether any process failed to get ready
    // (so that none waits for a real init another will never start).
    std::string mine = !status       ? "E" + status.message()
                       : holds_rank0 ? "I" + std::string(id.internal, sizeof(id.internal))
                                     : std::string("K");
    const auto deadline = std::chrono::steady_clock::now() + init_timeout();
    auto all =
        plan.leader->allgather(plan.leaders, kRealIdTag, std::move(mine), deadline, plan.abort);
    if (!all)
      return ApiStatus::system(
          "EFCCL_FALLBACK=nccl: exchanging NCCL's unique id between the "
          "processes (does every process set EFCCL_FALLBACK=nccl?): " +
          all.status().message());
    if (!status) return status;
    bool found = false;
    for (std::size_t i = 0; i < all->size(); ++i) {
      const std::string& e = (*all)[i];
      if (!e.empty() && e[0] == 'E')
        return ApiStatus::invalid_usage("EFCCL_FALLBACK=nccl: the process of rank " +
                                        std::to_string(plan.leaders[i]) +
                                        " could not set up NCCL: " + e.substr(1));
      if (e.size() == 1 + sizeof(id.internal) && e[0] == 'I') {
        std::memcpy(id.internal, e.data() + 1, sizeof(id.internal));
        found = true;
      }
    }
    if (!found) return ApiStatus::internal("EFCCL_FALLBACK=nccl: no process sent NCCL's unique id");
  }
  if (!status) return status;

  std::vector<ncclComm_t> local;
  if (ApiStatus s = create_real_comms(**lib, plan, id, &local); !s) return s;
  std::vector<ncclComm_t> by_rank(static_cast<std::size_t>(plan.nranks), nullptr);
  std::vector<int> devices(static_cast<std::size_t>(plan.nranks), -1);
  for (std::size_t i = 0; i < plan.ranks.size(); ++i) {
    by_rank[static_cast<std::size_t>(plan.ranks[i])] = local[i];
    devices[static_cast<std::size_t>(plan.ranks[i])] = plan.devices[i];
  }
  EFCCL_INFO(kLogInit, plan.devices.empty() ? -1 : plan.devices.front(),
             "EFCCL_FALLBACK=nccl: NCCL communicators of rank(s) " + rank_list(plan.ranks) +
                 " (of " + std::to_string(plan.nranks) + ") created on " + (*lib)->describe());
  *out = std::make_shared<CliqueFallback>(*lib, std::move(by_rank), std::move(devices));
  return ApiStatus::ok();
}

// ---------------------------------------------------------------------------------------------
// API hooks

namespace {
CliqueFallback* fallback_of(ncclComm* comm) {
  return comm != nullptr && comm->clique != nullptr ? comm->clique->fallback() : nullptr;
}
}  // namespace

ApiStatus release_fallback(ncclComm* comm, bool abort) {
  CliqueFallback* f = fallback_of(comm);
  return f != nullptr ? f->release(comm->rank, abort) : ApiStatus::ok();
}

ApiStatus finalize_fallback(ncclComm* comm) {
  CliqueFallback* f = fallback_of(comm);
  return f != nullptr ? f->finalize(comm->rank, comm->clique->timeout()) : ApiStatus::ok();
}

ApiStatus revoke_fallback(ncclComm* comm) {
  CliqueFallback* f = fallback_of(comm);
  return f != nullptr ? f->revoke(comm->rank, comm->clique->timeout()) : ApiStatus::ok();
}

ApiStatus fallback_async_error(ncclComm* comm) {
  CliqueFallback* f = fallback_of(comm);
  return f != nullptr ? f->async_error(comm->rank) : ApiStatus::ok();
}

}  // namespace efccl::runtime
