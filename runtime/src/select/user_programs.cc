#include "select/user_programs.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <system_error>

#include "efccl/common/log.h"
#include "efccl/ef/load.h"
#include "efccl/ef/validate.h"
#include "select/name_list.h"

namespace efccl::runtime {
namespace {

/// The files EFCCL_ALGO_DIR and EFCCL_ALGO_FILES name, in that order.
std::vector<std::string> user_program_files() {
  std::vector<std::string> files;
  if (const char* dir = std::getenv("EFCCL_ALGO_DIR"); dir != nullptr && *dir != '\0') {
    std::error_code ec;
    std::vector<std::string> found;
    std::filesystem::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string ext = lowercase(it->path().extension().string());
      std::error_code type_ec;
      if (it->is_regular_file(type_ec) && (ext == ".json" || ext == ".xml"))
        found.push_back(it->path().string());
    }
    if (ec) EFCCL_WARN(-1, "EFCCL_ALGO_DIR=" + std::string(dir) + ": " + ec.message());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  if (const char* list = std::getenv("EFCCL_ALGO_FILES")) {
    for (const std::string& f : split_name_list(list)) files.push_back(f);
  }
  return files;
}

}  // namespace

std::vector<std::pair<ef::Program, std::string>> load_user_programs() {
  std::vector<std::pair<ef::Program, std::string>> programs;
  std::vector<std::string> files;
  try {
    files = user_program_files();
  } catch (const std::exception& e) {
    EFCCL_WARN(-1, std::string("EFCCL_ALGO_DIR / EFCCL_ALGO_FILES: listing the user programs "
                               "failed (") +
                       e.what() + "); none is used");
    return programs;
  }
  for (const std::string& file : files) {
    try {
      ef::LoadResult loaded = ef::load_program_file(file);
      Diagnostics problems = loaded.diagnostics;
      if (loaded.program && problems.empty()) problems = ef::validate(*loaded.program);
      if (!loaded.program || !problems.empty()) {
        std::string message = "user program " + file + " is not used:";
        for (const auto& d : problems) message += "\n  " + d.to_string();
        EFCCL_WARN(-1, message);
        continue;
      }
      const ef::Program& p = *loaded.program;
      EFCCL_INFO(kLogInit | kLogTuning, -1,
                 "loaded user program '" + p.name + "' from " + file + ": " +
                     std::string(ef::to_string(p.collective)) + ", " + std::to_string(p.nranks) +
                     " ranks, " + std::string(ef::to_string(p.protocol)) + ", bytes [" +
                     std::to_string(p.min_bytes) + ", " +
                     (p.max_bytes ? std::to_string(*p.max_bytes) : std::string("inf")) + "]");
      programs.emplace_back(std::move(*loaded.program), file);
    } catch (const std::exception& e) {  // e.g. std::bad_alloc on a hostile file
      EFCCL_WARN(-1, "user program " + file + " is not used: loading it failed (" + e.what() + ")");
    }
  }
  return programs;
}

bool builtins_from_environment() {
  const char* v = std::getenv("EFCCL_BUILTINS");
  if (v == nullptr || *v == '\0') return true;
  const std::string value = lowercase(v);
  if (value == "1" || value == "on") return true;
  if (value == "0" || value == "off") return false;
  EFCCL_WARN(-1, "EFCCL_BUILTINS=" + std::string(v) +
                     " is not 0/off or 1/on; the built-in algorithms stay enabled");
  return true;
}

}  // namespace efccl::runtime
