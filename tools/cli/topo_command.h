// `efccl topo`: the machine as a graph (docs/topology.md), from detection, NCCL topology XML,
// a preset or efccl's topology JSON; printed as a summary or JSON, drawn as SVG.
#pragma once

#include <string>
#include <vector>

namespace efccl::cli {

/// Runs `efccl topo ARGS` (the arguments after "topo"); returns the exit code (0 success,
/// 1 a file cannot be read or is invalid). Usage problems throw UsageError (exit 2).
int cmd_topo(const std::vector<std::string>& argv);

}  // namespace efccl::cli
