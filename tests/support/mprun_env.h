// For multi-process tests started by efccl-mprun (tools/mprun): this process's rank, the
// number of ranks, and one ncclUniqueId shared by all of them through EFCCL_MPRUN_ID_FILE.
// Without efccl-mprun a process is rank 0 of 1. Header-only: include it and link NCCL's API
// (efccl_runtime or libefccl.so).
#pragma once

#include <nccl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

/// True when this process was started by efccl-mprun.
inline bool mprun_launched() { return std::getenv("EFCCL_MPRUN_SIZE") != nullptr; }

namespace mprun_env_detail {

inline int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 0 || v > 1 << 20)
    throw std::runtime_error(std::string(name) + "='" + text + "' is not a rank count or number");
  return static_cast<int>(v);
}

}  // namespace mprun_env_detail

/// This process's rank (EFCCL_MPRUN_RANK; 0 without efccl-mprun).
inline int mprun_rank() { return mprun_env_detail::env_int("EFCCL_MPRUN_RANK", 0); }

/// The number of ranks (EFCCL_MPRUN_SIZE; 1 without efccl-mprun).
inline int mprun_size() { return mprun_env_detail::env_int("EFCCL_MPRUN_SIZE", 1); }

/// One ncclUniqueId for every rank of the job: rank 0 calls ncclGetUniqueId and publishes it
/// atomically in EFCCL_MPRUN_ID_FILE (written to a temporary name, then renamed); the others
/// wait for the file, up to `timeout`. Throws std::runtime_error saying why when it cannot.
inline ncclUniqueId share_unique_id(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  ncclUniqueId id{};
  const int rank = mprun_rank();
  const char* path = std::getenv("EFCCL_MPRUN_ID_FILE");
  if (rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r) +
                               ": " + ncclGetLastError(nullptr));
    if (mprun_size() == 1 && path == nullptr) return id;
  }
  if (path == nullptr || path[0] == '\0')
    throw std::runtime_error("EFCCL_MPRUN_ID_FILE is not set (start the ranks with efccl-mprun)");
  if (rank == 0) {
    const std::string tmp = std::string(path) + ".tmp." + std::to_string(::getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr)
      throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
    const bool written = std::fwrite(&id, sizeof(id), 1, f) == 1;
    const bool closed = std::fclose(f) == 0;
    if (!written || !closed || std::rename(tmp.c_str(), path) != 0) {
      std::remove(tmp.c_str());
      throw std::runtime_error(std::string("cannot publish the unique id in ") + path + ": " +
                               std::strerror(errno));
    }
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (std::FILE* f = std::fopen(path, "rb"); f != nullptr) {
      const bool read = std::fread(&id, sizeof(id), 1, f) == 1;
      std::fclose(f);
      if (read) return id;  // renamed into place whole, so a complete id or no file at all
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error(std::string("rank ") + std::to_string(rank) +
                               ": rank 0 did not publish a unique id in " + path + " within " +
                               std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
