// libFuzzer target for efccl-mprun's line protocol (efccl/mprun/rendezvous.h): any line must
// parse or be rejected with a printable, bounded message, and what parses must survive
// format -> parse unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "efccl/mprun/rendezvous.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_mprun_protocol: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_message(const efccl::Status& s, std::size_t limit) {
  if (s.message().empty()) fail("rejected without a reason", "");
  if (s.message().size() > limit) fail("an unbounded message", s.message().substr(0, 200));
  for (char c : s.message())
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      fail("a message with raw bytes", s.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace efccl::mprun;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  // Messages quote at most a bounded part of what they reject (an ERROR line's reason: the line).
  const std::size_t limit = 1024;

  if (auto hello = parse_hello(line)) {
    const std::string again = format_hello(*hello);
    auto reparsed = parse_hello(std::string_view(again).substr(0, again.size() - 1));
    if (!reparsed || reparsed->job != hello->job || reparsed->rank != hello->rank ||
        reparsed->size != hello->size || !(reparsed->listen == hello->listen))
      fail("HELLO does not survive format -> parse", again);
  } else {
    check_message(hello.status(), limit);
  }

  const int size_hint = size > 0 ? 1 + data[0] % 8 : 1;
  if (auto peers = parse_peers(line, size_hint)) {
    if (static_cast<int>(peers->size()) != size_hint) fail("PEERS of the wrong size", "");
    const std::string again = format_peers(*peers);
    auto reparsed = parse_peers(std::string_view(again).substr(0, again.size() - 1), size_hint);
    if (!reparsed) fail("PEERS does not survive format -> parse", again);
  } else if (line.substr(0, 6) != "ERROR ") {
    check_message(peers.status(), limit);
  } else {
    const std::string& m = peers.status().message();
    for (char c : m)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        fail("an ERROR reason with raw bytes", m);
  }

  if (auto abort = parse_abort(line)) {
    const std::string again = format_abort(abort->first, abort->second);
    auto reparsed = parse_abort(std::string_view(again).substr(0, again.size() - 1));
    if (!reparsed || *reparsed != *abort) fail("ABORT does not survive format -> parse", again);
  } else {
    check_message(abort.status(), limit);
  }
  return 0;
}
