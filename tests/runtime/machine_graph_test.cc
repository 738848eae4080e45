// The communicator's machine graph (runtime/src/comm/machine_graph.h): detected at init, every
// rank placed on the GPU node of its device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include "comm/communicator.h"
#include "comm/machine_graph.h"
#include "enqueue/clique.h"
#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

TEST(MachineGraph, EveryRankSitsOnItsDevicesGpuNode) {
  EFCCL_REQUIRE_GPUS(1);
  char bus[32] = {};
  CUDA_OK(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, 0));
  TestClique clique({0, 0});
  ASSERT_EQ(clique.comms.size(), 2u);
  const topo::ClusterGraph* graph = clique.comms[0]->clique->machine_graph();
  ASSERT_NE(graph, nullptr);
  EXPECT_TRUE(graph->topology.check()) << graph->topology.check().message();
  EXPECT_EQ(graph->hash, graph->topology.hash());
  EXPECT_EQ(graph->topology.hosts(), 1);
  ASSERT_EQ(graph->rank_gpu.size(), 2u);
  ASSERT_TRUE(graph->rank_gpu[0]) << (graph->notes.empty() ? "" : graph->notes.front());
  EXPECT_EQ(graph->rank_gpu[0], graph->rank_gpu[1]) << "both ranks on device 0";
  const topo::Node& gpu = graph->topology.node(*graph->rank_gpu[0]);
  EXPECT_EQ(gpu.pci, topo::normal_bus_id(bus));
  EXPECT_EQ(gpu.kind, topo::NodeKind::kGpu);
  EXPECT_GE(gpu.sm, 90) << "the GPUs we run on are Hopper or newer";
  // The host graph detected once per process is the one the communicator's graph holds.
  EXPECT_EQ(this_host().topology.gpus().size(), graph->topology.gpus().size());
}

}  // namespace
}  // namespace efccl::runtime::testing
