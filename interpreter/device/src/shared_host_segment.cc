// POSIX shared-memory segments for host-placed connections between processes.
#include "shared_host_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

namespace efccl::device {
namespace {

constexpr char kPrefix[] = "/efccl-";

std::string errno_text(int e) { return std::string(std::strerror(e)); }

/// Maps `fd` (`bytes`, shared, read-write) and closes it; null and `error` set on failure.
char* map_and_close(int fd, std::size_t bytes, int* error) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  *error = p == MAP_FAILED ? errno : 0;
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace

SharedHostSegment& SharedHostSegment::operator=(SharedHostSegment&& o) noexcept {
  std::swap(name_, o.name_);
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(linked_, o.linked_);
  return *this;
}

SharedHostSegment::~SharedHostSegment() {
  if (data_ != nullptr) munmap(data_, bytes_);
  unlink();
}

void SharedHostSegment::unlink() {
  if (!linked_) return;
  shm_unlink(name_.c_str());  // ENOENT: the other process removed it already
  linked_ = false;
}

bool SharedHostSegment::is_valid_name(const std::string& name) {
  if (name.size() > kMaxNameLength || name.rfind(kPrefix, 0) != 0 ||
      name.size() == sizeof(kPrefix) - 1)
    return false;
  for (std::size_t i = sizeof(kPrefix) - 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) return false;
  }
  return true;
}

StatusOr<SharedHostSegment> SharedHostSegment::create(std::size_t bytes) {
  if (bytes == 0) return Status::error("a shared host segment needs at least one byte");
  static std::atomic<uint64_t> next{0};
  static const uint32_t salt = std::random_device{}();
  char name[kMaxNameLength + 1];
  std::snprintf(name, sizeof(name), "%s%x-%llx-%x", kPrefix, static_cast<unsigned>(getpid()),
                static_cast<unsigned long long>(next++), salt);
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return Status::error("shm_open(" + std::string(name) + ", create): " + errno_text(errno));
  SharedHostSegment s;
  s.name_ = name;
  s.linked_ = true;  // from here on, the destructor removes the name
  // posix_fallocate reserves the pages: without it, a full /dev/shm would only show as a
  // SIGBUS when the memory is first touched.
  int e = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (e == 0) e = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (e != 0) {
    close(fd);
    return Status::error("reserving " + std::to_string(bytes) + " bytes of shared memory " +
                         s.name_ + " (/dev/shm): " + errno_text(e));
  }
  s.data_ = map_and_close(fd, bytes, &e);
  if (s.data_ == nullptr)
    return Status::error("mmap of shared memory " + s.name_ + ": " + errno_text(e));
  s.bytes_ = bytes;
  return s;
}

StatusOr<SharedHostSegment> SharedHostSegment::open_and_unlink(const std::string& name,
                                                               std::size_t bytes) {
  if (!is_valid_name(name))
    return Status::error("'" + name + "' is not the name of an efccl shared memory segment");
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Status::error("shm_open(" + name + "): " + errno_text(errno));
  // Mapped or not, the name has served its purpose: this is the one process that opens it.
  shm_unlink(name.c_str());
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    const std::string found = std::to_string(static_cast<long long>(st.st_size));
    close(fd);
    return Status::error("shared memory " + name + " holds " + found + " bytes, expected " +
                         std::to_string(bytes));
  }
  SharedHostSegment s;
  s.name_ = name;
  int e = 0;
  s.data_ = map_and_close(fd, bytes, &e);
  if (s.data_ == nullptr)
    return Status::error("mmap of shared memory " + name + ": " + errno_text(e));
  s.bytes_ = bytes;
  return s;
}

}  // namespace efccl::device
