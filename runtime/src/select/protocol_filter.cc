#include "select/protocol_filter.h"

#include <cstdlib>
#include <string_view>

#include "efccl/common/log.h"
#include "select/name_list.h"

namespace efccl::runtime {

ProtocolFilter ProtocolFilter::from_environment() {
  ProtocolFilter f;
  const char* v = std::getenv("NCCL_PROTO");
  if (v == nullptr || *v == '\0') return f;
  f.spec = v;
  std::string_view spec = v;
  const bool exclude = spec.front() == '^';
  if (exclude) spec.remove_prefix(1);
  bool listed[3] = {false, false, false};
  for (const std::string& name : split_name_list(spec)) {
    const std::string n = lowercase(name);
    if (n == "simple")
      listed[0] = true;
    else if (n == "ll")
      listed[1] = true;
    else if (n == "ll128")
      listed[2] = true;
    else
      EFCCL_WARN(-1, "NCCL_PROTO: unknown protocol '" + name + "' ignored");
  }
  for (int i = 0; i < 3; ++i) f.allowed[i] = exclude ? !listed[i] : listed[i];
  return f;
}

}  // namespace efccl::runtime
