// libFuzzer target for the EF JSON loader: any input must load or be rejected with diagnostics,
// without crashing; a loaded program must survive save -> load -> save byte-identically.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "efccl/ef/json_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using efccl::ef::load_json;
  using efccl::ef::save_json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto loaded = load_json(text, "fuzz.json");
  if (!loaded.program) {
    if (loaded.diagnostics.empty()) {
      std::fputs("load_json rejected the input without a diagnostic\n", stderr);
      std::abort();
    }
    return 0;
  }
  const std::string saved = save_json(*loaded.program);
  const auto reloaded = load_json(saved, "saved.json");
  if (!reloaded.program) {
    std::fprintf(stderr, "save_json output does not load: %s\n%s\n",
                 reloaded.diagnostics.empty() ? "" : reloaded.diagnostics[0].to_string().c_str(),
                 saved.c_str());
    std::abort();
  }
  if (!(*reloaded.program == *loaded.program) || save_json(*reloaded.program) != saved) {
    std::fprintf(stderr, "save -> load -> save is not stable:\n%s\n", saved.c_str());
    std::abort();
  }
  return 0;
}
