// Loading a program file of either format: the format chosen by content, the file checks, and the
// memory budget, which must turn hostile files (tiny elements, many of them) into a clear error
// inside an address space of 1 GiB instead of an abort.
#include "efccl/ef/load.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "efccl/ef/json_io.h"

#if defined(__SANITIZE_ADDRESS__)
#define EFCCL_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EFCCL_TEST_UNDER_ASAN 1
#endif
#endif

namespace efccl::ef {
namespace {

namespace fs = std::filesystem;

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("efccl_load_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  fs::path dir_;
};

/// A one-rank custom program that copies its input chunk to its output.
std::string small_program_json() {
  return R"({"format": "efccl-ef", "version": 1, "collective": "custom", "protocol": "Simple",
  "nranks": 1, "nchunksperloop": 1,
  "ranks": [{"input_chunks": 1, "output_chunks": 1, "threadblocks": [
    {"send": -1, "recv": -1, "channel": 0, "ops": [
      {"op": "copy", "src": {"buf": "input", "off": 0}, "dst": {"buf": "output", "off": 0},
       "count": 1}]}]}],
  "postconditions": [{"rank": 0, "index": 0, "sources": [{"rank": 0, "index": 0}]}]})";
}

std::string small_program_xml() {
  return R"(<algo name="copy" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="1"
  coll="allreduce" inplace="0" outofplace="1"><gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
  <tb id="0" send="-1" recv="-1" chan="0"><step s="0" type="cpy" srcbuf="i" srcoff="0"
  dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/></tb></gpu></algo>)";
}

TEST_F(LoadTest, ChoosesTheFormatByContent) {
  const LoadResult json = load_program_file(write("program.xml", "\n " + small_program_json()));
  ASSERT_TRUE(json.program) << (json.diagnostics.empty() ? "" : json.diagnostics[0].to_string());
  EXPECT_EQ(json.program->source.format, SourceMap::Format::kJson);
  const LoadResult xml = load_program_file(write("program.json", small_program_xml()));
  ASSERT_TRUE(xml.program) << (xml.diagnostics.empty() ? "" : xml.diagnostics[0].to_string());
  EXPECT_EQ(xml.program->source.format, SourceMap::Format::kMscclXml);

  const LoadResult other = load_program_text("  name: x", "f.yaml");
  ASSERT_EQ(other.diagnostics.size(), 1u);
  EXPECT_EQ(other.diagnostics[0].rule, "unknown-format");
  EXPECT_EQ(other.diagnostics[0].location, "byte 2");
  const LoadResult empty = load_program_text(" \n", "empty");
  ASSERT_EQ(empty.diagnostics.size(), 1u);
  EXPECT_EQ(empty.diagnostics[0].message, "the file is empty");
}

TEST_F(LoadTest, NamesMissingUnreadableAndOversizedFiles) {
  const std::string missing = (dir_ / "missing.json").string();
  LoadResult r = load_program_file(missing);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_FALSE(r.program);
  EXPECT_EQ(r.diagnostics[0].to_string(), missing + ": (file): cannot open: no such file [io]");

  r = load_program_file(dir_.string());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].message, "not a regular file");

  LoadLimits limits;
  limits.max_file_bytes = 100;
  r = load_program_file(write("big.json", small_program_json()), limits);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].rule, "file-too-large");
  EXPECT_EQ(r.diagnostics[0].message,
            "file is " + std::to_string(small_program_json().size()) + " bytes; the limit is 100");
}

TEST_F(LoadTest, TheMemoryBudgetAppliesToBothFormats) {
  // Each program loads with the default budget and is refused with one too small for it.
  LoadLimits tiny;
  tiny.max_memory_bytes = 1000;
  for (const std::string& text : {small_program_json(), small_program_xml()}) {
    const std::string file = write("program", text);
    const LoadResult fits = load_program_file(file);
    EXPECT_TRUE(fits.program);
    EXPECT_TRUE(fits.diagnostics.empty());
    const LoadResult refused = load_program_file(file, tiny);
    EXPECT_FALSE(refused.program);
    ASSERT_EQ(refused.diagnostics.size(), 1u);
    EXPECT_EQ(refused.diagnostics[0].rule, "syntax");
    EXPECT_NE(refused.diagnostics[0].message.find(
                  "loading the document needs more than 1000 bytes of memory, the loaders' budget"),
              std::string::npos)
        << refused.diagnostics[0].message;
  }
}

/// Loads `path` in a child process whose address space is limited to 1 GiB (not under
/// AddressSanitizer, which reserves terabytes of address space for its shadow memory); the
/// child exits 0 when loading ended in `expected` and 3 when it ended otherwise, and the
/// parent checks that it exited at all (an abort or a kill is a failure).
void expect_refused_within_one_gib(const std::string& path, const std::string& expected) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
#ifndef EFCCL_TEST_UNDER_ASAN
    const rlimit one_gib{rlim_t{1} << 30, rlim_t{1} << 30};
    if (setrlimit(RLIMIT_AS, &one_gib) != 0) _exit(4);
#endif
    const LoadResult r = load_program_file(path);
    std::string report;
    for (const Diagnostic& d : r.diagnostics) report += d.to_string() + "\n";
    if (write(pipe_fds[1], report.data(), report.size()) < 0) _exit(5);
    const bool ok = !r.program && r.diagnostics.size() == 1 &&
                    r.diagnostics[0].message.find(expected) != std::string::npos;
    _exit(ok ? 0 : 3);
  }
  close(pipe_fds[1]);
  std::string report;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(pipe_fds[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) report.append(buffer, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the loader did not exit normally (signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "what the loader reported:\n" << report;
  EXPECT_EQ(report.rfind(path + ": ", 0), 0u) << report;
}

TEST_F(LoadTest, FiftyMegabytesOfEmptyJsonObjectsEndInAnError) {
  // {"ranks": [{}, {}, ...]}: about 30 bytes of parsed document per 3 bytes of text.
  constexpr std::size_t kBytes = 50u << 20;
  std::string text = "{\"ranks\": [";
  text.reserve(kBytes + 16);
  while (text.size() < kBytes) text += "{},";
  text += "{}]}";
  const std::string path = write("empty_objects.json", text);
  text.clear();
  text.shrink_to_fit();
  expect_refused_within_one_gib(path, "of memory, the loaders' budget");
}

TEST_F(LoadTest, TwoHundredMegabytesOfEmptyXmlElementsEndInAnError) {
  // <algo><a/><a/>...</algo>: below the 256 MiB file limit, 50 million elements.
  constexpr std::size_t kBytes = 200u << 20;
  std::string text = "<algo>";
  text.reserve(kBytes + 16);
  while (text.size() < kBytes) text += "<a/>";
  text += "</algo>";
  const std::string path = write("empty_elements.xml", text);
  text.clear();
  text.shrink_to_fit();
  expect_refused_within_one_gib(path, "of memory, the loaders' budget");
}

}  // namespace
}  // namespace efccl::ef
