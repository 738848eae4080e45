#include "efccl_library.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace efccl::torch_backend {
namespace {

std::mutex g_mutex;
std::unique_ptr<EfcclLibrary> g_library;  // set once, never freed (works may outlive groups)
std::atomic<const EfcclLibrary*> g_loaded{nullptr};  // g_library once complete: lock-free reads

/// The ELF note every libefccl.so carries (runtime/src/api/shared_library.cc).
constexpr uint32_t kEfcclNoteType = 0xefcc1;

/// Whether the loaded object containing `address` carries efccl's note; `object` names it.
bool in_efccl_object(const void* address, std::string* object) {
  struct Search {
    uintptr_t address = 0;
    bool found = false;
    bool efccl = false;
    std::string name;
  } search;
  search.address = reinterpret_cast<uintptr_t>(address);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        bool contains = false;
        for (ElfW(Half) i = 0; i < info->dlpi_phnum && !contains; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          contains = ph.p_type == PT_LOAD && s->address >= start && s->address < start + ph.p_memsz;
        }
        if (!contains) return 0;
        s->found = true;
        s->name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        for (ElfW(Half) i = 0; i < info->dlpi_phnum && !s->efccl; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
          const unsigned char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) note;
            std::memcpy(&note, p, sizeof(note));
            const unsigned char* name = p + sizeof(note);
            const std::size_t name_bytes = (note.n_namesz + 3u) & ~3u;
            const std::size_t desc_bytes = (note.n_descsz + 3u) & ~3u;
            if (name + name_bytes + desc_bytes > end) break;
            if (note.n_type == kEfcclNoteType && note.n_namesz == 6 &&
                std::memcmp(name, "efccl", 6) == 0) {
              s->efccl = true;
              break;
            }
            p = name + name_bytes + desc_bytes;
          }
        }
        return 1;
      },
      &search);
  *object = search.found ? search.name : "";
  return search.efccl;
}

template <typename Fn>
void resolve(EfcclLibrary& lib, Fn& fn, const char* name, bool required) {
  void* symbol = dlsym(lib.handle, name);
  if (symbol == nullptr && required)
    throw std::runtime_error("efccl.torch: " + lib.path + " does not export " + name +
                             " (is it libefccl.so, built from this repository?)");
  fn = reinterpret_cast<Fn>(symbol);
}

}  // namespace

const EfcclLibrary& load_efccl_library(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_library) {
    if (g_library->path != path)
      throw std::runtime_error("efccl.torch: libefccl.so was already loaded from " +
                               g_library->path + "; cannot load " + path + " as well");
    return *g_library;
  }
  auto lib = std::make_unique<EfcclLibrary>();
  lib->path = path;
  // RTLD_LOCAL: none of efccl's nccl* joins the global scope, where torch's NCCL lives.
  lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("efccl.torch: cannot load " + path + ": " +
                             (why != nullptr ? why : "dlopen failed") +
                             " (set EFCCL_LIBRARY to the path of libefccl.so)");
  }
  resolve(*lib, lib->GetVersion, "ncclGetVersion", true);
  resolve(*lib, lib->GetErrorString, "ncclGetErrorString", true);
  resolve(*lib, lib->GetLastError, "ncclGetLastError", true);
  resolve(*lib, lib->GetUniqueId, "ncclGetUniqueId", true);
  resolve(*lib, lib->CommInitRankConfig, "ncclCommInitRankConfig", true);
  resolve(*lib, lib->CommSplit, "ncclCommSplit", true);
  resolve(*lib, lib->CommDestroy, "ncclCommDestroy", true);
  resolve(*lib, lib->CommAbort, "ncclCommAbort", true);
  resolve(*lib, lib->CommRevoke, "ncclCommRevoke", true);
  resolve(*lib, lib->CommGetAsyncError, "ncclCommGetAsyncError", true);
  resolve(*lib, lib->CommCount, "ncclCommCount", true);
  resolve(*lib, lib->CommUserRank, "ncclCommUserRank", true);
  resolve(*lib, lib->AllReduce, "ncclAllReduce", true);
  resolve(*lib, lib->Broadcast, "ncclBroadcast", true);
  resolve(*lib, lib->Reduce, "ncclReduce", true);
  resolve(*lib, lib->AllGather, "ncclAllGather", true);
  resolve(*lib, lib->ReduceScatter, "ncclReduceScatter", true);
  resolve(*lib, lib->AlltoAll, "ncclAlltoAll", true);
  resolve(*lib, lib->Gather, "ncclGather", true);
  resolve(*lib, lib->Scatter, "ncclScatter", true);
  resolve(*lib, lib->Send, "ncclSend", true);
  resolve(*lib, lib->Recv, "ncclRecv", true);
  resolve(*lib, lib->GroupStart, "ncclGroupStart", true);
  resolve(*lib, lib->GroupEnd, "ncclGroupEnd", true);
  resolve(*lib, lib->RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", true);
  resolve(*lib, lib->RedOpDestroy, "ncclRedOpDestroy", true);
  resolve(*lib, lib->SetSelectionCallback, "efcclSetSelectionCallback", false);

  // The functions must be efccl's: a real NCCL under the name libefccl.so (or a libnccl.so.2
  // given by mistake) has no efccl note.
  std::string object;
  if (!in_efccl_object(reinterpret_cast<const void*>(lib->AllReduce), &object))
    throw std::runtime_error("efccl.torch: ncclAllReduce from " + path + " resolves into " +
                             (object.empty() ? std::string("an unknown object") : object) +
                             ", which is not an efccl library (no efccl ELF note): refusing to "
                             "run the efccl backend on it");
  if (lib->GetVersion(&lib->version) != ncclSuccess) lib->version = 0;
  g_library = std::move(lib);
  g_loaded.store(g_library.get(), std::memory_order_release);
  return *g_library;
}

const EfcclLibrary& efccl_library() {
  const EfcclLibrary* lib = g_loaded.load(std::memory_order_acquire);
  if (lib == nullptr)
    throw std::runtime_error(
        "efccl.torch: libefccl.so is not loaded (import efccl.torch loads it)");
  return *lib;
}

bool efccl_library_loaded() { return g_loaded.load(std::memory_order_acquire) != nullptr; }

std::string describe_failure(const char* function, ncclResult_t result) {
  const EfcclLibrary& lib = efccl_library();
  std::string text = std::string(function) + " failed: " + lib.GetErrorString(result);
  const char* last = lib.GetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

}  // namespace efccl::torch_backend
