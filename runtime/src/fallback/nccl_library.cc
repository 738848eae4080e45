#include "fallback/nccl_library.h"

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

#include "base/device_guard.h"
#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

/// The ELF note libefccl.so carries (shared_library.cc): name "efccl", this type.
constexpr uint32_t kEfcclNoteType = 0xefcc1;
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

}  // namespace efccl::runtime
