// `efccl plan`: the balancer's plan for a demand matrix on a topology (docs/balancer.md).
#pragma once

#include <string>
#include <vector>

namespace efccl::cli {

/// Runs `efccl plan ARGS` (the arguments after "plan"); returns the exit code (0 success,
/// 1 an input cannot be read or is invalid). Usage problems throw UsageError (exit 2).
int cmd_plan(const std::vector<std::string>& argv);

}  // namespace efccl::cli
