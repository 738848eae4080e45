// TEMPORARY (branch topo-cli only): stand-ins for nccl_xml.cc and detect.cc, which other
// branches are writing, so that efccl_topology links here. DELETE THIS FILE AT MERGE (and its
// line in topology/CMakeLists.txt). Nothing committed relies on what these return.
#include "efccl/topology/detect.h"
#include "efccl/topology/nccl_xml.h"

namespace efccl::topo {

StatusOr<Topology> from_nccl_xml(std::string_view, std::string_view where) {
  return Status::error(std::string(where) + ": NCCL XML import not built yet (pending_stubs.cc)");
}

StatusOr<Topology> load_nccl_xml(const std::string& path) {
  return Status::error(path + ": NCCL XML import not built yet (pending_stubs.cc)");
}

Detection detect_host(const DetectOptions&) {
  Detection d;
  d.notes.push_back("detection not built yet (pending_stubs.cc): no GPU listed");
  return d;
}

}  // namespace efccl::topo
