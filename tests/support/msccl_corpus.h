// Where the tests find the MSCCL XML compatibility corpus (msccl-tools' and MSCCL's own
// algorithm files), which is not part of this repository. Tests that need it skip, saying how
// to point at one, when none is configured; a build configured with
// -DEFCCL_REQUIRE_MSCCL_XML=ON (CI) fails them instead. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace efccl::test_support {

/// The corpus directory: $EFCCL_MSCCL_XML_DIR when set, else the one CMake was configured with
/// (-DEFCCL_MSCCL_XML_DIR); empty when that names no directory.
inline std::string msccl_corpus_dir() {
  const char* env = std::getenv("EFCCL_MSCCL_XML_DIR");
  const std::string dir = env != nullptr && *env != '\0' ? env : EFCCL_MSCCL_XML_DIR;
  std::error_code ec;
  return !dir.empty() && std::filesystem::is_directory(dir, ec) ? dir : std::string();
}

/// The path of corpus file `name` (in an empty directory when there is no corpus).
inline std::string msccl_corpus_file(const std::string& name) {
  return msccl_corpus_dir() + "/" + name;
}

/// Why a corpus test does not run: the text of its skip (or failure, where the corpus is
/// required).
inline std::string msccl_corpus_missing_message() {
  const char* env = std::getenv("EFCCL_MSCCL_XML_DIR");
  return std::string("no MSCCL XML corpus (") +
         (env != nullptr && *env != '\0' ? "$EFCCL_MSCCL_XML_DIR=" + std::string(env)
                                         : "configured: '" + std::string(EFCCL_MSCCL_XML_DIR) + "'") +
         " is not a directory); point at one with cmake -DEFCCL_MSCCL_XML_DIR=DIR or "
         "EFCCL_MSCCL_XML_DIR=DIR at run time (the files of ROCm/rccl tools/msccl-algorithms/ and tools/msccl-unit-test-algorithms/)";
}

}  // namespace efccl::test_support

#ifdef EFCCL_MSCCL_XML_REQUIRED
/// Fails the test when the corpus is missing: this build requires it.
#define EFCCL_REQUIRE_MSCCL_CORPUS()                                         \
  do {                                                                       \
    if (::efccl::test_support::msccl_corpus_dir().empty())                        \
      GTEST_FAIL() << ::efccl::test_support::msccl_corpus_missing_message()       \
                   << " (required: EFCCL_REQUIRE_MSCCL_XML=ON)";             \
  } while (0)
#else
/// Skips the test, saying how to point at a corpus, when there is none.
#define EFCCL_REQUIRE_MSCCL_CORPUS()                                         \
  do {                                                                       \
    if (::efccl::test_support::msccl_corpus_dir().empty())                        \
      GTEST_SKIP() << ::efccl::test_support::msccl_corpus_missing_message();      \
  } while (0)
#endif
