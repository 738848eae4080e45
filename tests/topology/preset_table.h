// The balancer's candidate table of a preset machine, every GPU a rank: what the planner tests
// plan on.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "efccl/balance/planner.h"
#include "efccl/topology/presets.h"

namespace efccl::test_support {

/// `name` x `nodes` hosts (a failure is the calling test's).
inline std::shared_ptr<const balance::PathTable> table_of(const char* name, int nodes) {
  auto t = topo::preset(name, nodes);
  EXPECT_TRUE(t) << t.status().message();
  auto table = balance::PathTable::build(*t, t->gpus());
  EXPECT_TRUE(table) << table.status().message();
  return *table;
}

}  // namespace efccl::test_support
