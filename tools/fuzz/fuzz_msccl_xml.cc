// libFuzzer target for the MSCCL XML loader: any input must load or be rejected with a
// diagnostic, never crash. A loaded program must survive export and import unchanged (up to
// hasdep, which export recomputes), and exporting it again must give the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "efccl/ef/msccl_xml.h"

namespace {

efccl::ef::Program without_declared_hasdep(efccl::ef::Program p) {
  for (efccl::ef::Rank& rank : p.ranks)
    for (efccl::ef::Threadblock& tb : rank.threadblocks)
      for (efccl::ef::Op& op : tb.ops) op.declared_hasdep.reset();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const efccl::ef::XmlLoadResult loaded = efccl::ef::load_msccl_xml(text, "fuzz.xml");
  if (!loaded.program) {
    if (loaded.diagnostics.empty()) std::abort();  // a rejection must say why
    return 0;
  }
  // Export refuses what MSCCL XML cannot express (e.g. dangling dependencies).
  const efccl::StatusOr<std::string> saved = efccl::ef::save_msccl_xml(*loaded.program);
  if (!saved.is_ok()) return 0;
  const efccl::ef::XmlLoadResult reloaded = efccl::ef::load_msccl_xml(*saved, "export.xml");
  if (!reloaded.program) std::abort();
  // Imports carry at most one dependency per op, so export inserts no nops: same program.
  if (without_declared_hasdep(*reloaded.program) != without_declared_hasdep(*loaded.program))
    std::abort();
  const efccl::StatusOr<std::string> resaved = efccl::ef::save_msccl_xml(*reloaded.program);
  if (!resaved.is_ok() || *resaved != *saved) std::abort();
  return 0;
}
