// libFuzzer target for NCCL's topology XML (efccl/topology/nccl_xml.h): any input must become a
// graph or be rejected with a message naming the file, never crash or run unbounded. An
// accepted graph must pass Topology::check() and survive to_json / from_json unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "efccl/topology/nccl_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const efccl::StatusOr<efccl::topo::Topology> t = efccl::topo::from_nccl_xml(text, "fuzz.xml");
  if (!t) {
    // A rejection must say where and why.
    if (t.status().message().rfind("fuzz.xml", 0) != 0) std::abort();
    return 0;
  }
  if (!t->check()) std::abort();
  const std::string json = efccl::topo::to_json(*t);
  const efccl::StatusOr<efccl::topo::Topology> back = efccl::topo::from_json(json, "fuzz.json");
  if (!back || efccl::topo::to_json(*back) != json || back->hash() != t->hash()) std::abort();
  // Every GPU hangs under a CPU over PCIe.
  for (efccl::topo::NodeIndex g : t->gpus())
    if (!t->local_cpu(g)) std::abort();
  return 0;
}
