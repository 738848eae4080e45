// The link-cost model (efccl/host/timing.h): predicted times of built-in algorithms and small
// hand-built programs behave as bandwidth and latency say they must.
#include "efccl/host/timing.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"

namespace efccl::host {
namespace {

using ef::BufferKind;
using ef::BufferRef;
using ef::OpCode;

ef::Program ring_allreduce(int32_t ranks, int32_t channels = 1, int32_t instances = 1) {
  algorithms::AlgorithmParams params;
  params.ranks = ranks;
  params.channels = channels;
  params.instances = instances;
  StatusOr<ef::Program> p = algorithms::generate_algorithm("ring_allreduce", params);
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return p.is_ok() ? *p : ef::Program{};
}

ExecOptions call(uint64_t count, ef::DataType dtype = ef::DataType::kFloat32) {
  ExecOptions o;
  o.count = count;
  o.dtype = dtype;
  return o;
}

/// The largest multiple of the program's granularity that is at most `count` (at least one).
uint64_t fit(const ef::Program& p, uint64_t count) {
  const uint64_t g = ef::count_granularity(p);
  return std::max<uint64_t>(g, count / g * g);
}

double predict(const ef::Program& p, uint64_t count, const LinkCostModel& model = {}) {
  TimingResult t = predict_time(p, call(fit(p, count)), model);
  EXPECT_TRUE(t.status.is_ok()) << t.status.message();
  return t.time_us;
}

/// Ring allreduce's bandwidth bound: every rank sends 2(n-1)/n of the buffer over its port.
double ring_bound_us(int32_t n, uint64_t bytes, double gbps) {
  return 2.0 * (n - 1) / n * static_cast<double>(bytes) / (gbps * 1e3);
}

// ---- Hand-built programs ----

ef::Op op(OpCode code, std::optional<BufferRef> src, std::optional<BufferRef> dst,
          std::vector<ef::Dependency> deps = {}) {
  ef::Op o;
  o.code = code;
  o.src = src;
  o.dst = dst;
  o.count = 1;
  o.deps = std::move(deps);
  return o;
}

ef::Threadblock threadblock(int32_t send, int32_t recv, std::vector<ef::Op> ops) {
  ef::Threadblock tb;
  tb.send_peer = send;
  tb.recv_peer = recv;
  tb.ops = std::move(ops);
  return tb;
}

/// Rank 0's input chunk relayed over `hops` links, 0 -> 1 -> ... -> hops, into every output.
/// A relay rank receives on one threadblock and forwards from another that depends on it, so
/// each hop adds one dependency and one connection to the chain.
ef::Program relay(int32_t hops) {
  ef::Program p;
  p.name = "relay-" + std::to_string(hops);
  p.collective = ef::Collective::kCustom;
  p.nranks = hops + 1;
  p.nchunksperloop = 1;
  p.ranks.resize(static_cast<std::size_t>(p.nranks));
  const BufferRef in{BufferKind::kInput, 0};
  const BufferRef out{BufferKind::kOutput, 0};
  p.ranks[0].input_chunks = 1;
  p.ranks[0].threadblocks.push_back(threadblock(1, -1, {op(OpCode::kSend, in, std::nullopt)}));
  for (int32_t r = 1; r <= hops; ++r) {
    ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.output_chunks = 1;
    rank.threadblocks.push_back(threadblock(-1, r - 1, {op(OpCode::kRecv, std::nullopt, out)}));
    if (r < hops)
      rank.threadblocks.push_back(
          threadblock(r + 1, -1, {op(OpCode::kSend, out, std::nullopt, {{0, 0}})}));
  }
  return p;
}

/// Rank 0 sends chunk c of its input to rank 1 on channel c, for `channels` channels at once.
ef::Program fan(int32_t channels) {
  ef::Program p;
  p.name = "fan-" + std::to_string(channels);
  p.collective = ef::Collective::kCustom;
  p.nranks = 2;
  p.nchunksperloop = channels;
  p.nchannels = channels;
  p.ranks.resize(2);
  p.ranks[0].input_chunks = p.ranks[1].output_chunks = channels;
  for (int32_t c = 0; c < channels; ++c) {
    ef::Threadblock sender =
        threadblock(1, -1, {op(OpCode::kSend, BufferRef{BufferKind::kInput, c}, std::nullopt)});
    ef::Threadblock receiver =
        threadblock(-1, 0, {op(OpCode::kRecv, std::nullopt, BufferRef{BufferKind::kOutput, c})});
    sender.channel = receiver.channel = c;
    p.ranks[0].threadblocks.push_back(sender);
    p.ranks[1].threadblocks.push_back(receiver);
  }
  return p;
}

/// Two ranks that each receive before they send: neither ever can.
ef::Program crossed_receives() {
  ef::Program p = relay(1);
  p.nranks = 2;
  const BufferRef in{BufferKind::kInput, 0};
  const BufferRef out{BufferKind::kOutput, 0};
  for (int32_t r = 0; r < 2; ++r) {
    ef::Rank& rank = p.ranks[static_cast<std::size_t>(r)];
    rank.input_chunks = rank.output_chunks = 1;
    rank.threadblocks = {threadblock(
        1 - r, 1 - r, {op(OpCode::kRecv, std::nullopt, out), op(OpCode::kSend, in, std::nullopt)})};
  }
  return p;
}

// ---- Properties ----

TEST(Timing, GrowsWithBytes) {
  const ef::Program p = ring_allreduce(8);
  double previous = 0;
  for (uint64_t count = 1 << 10; count <= (uint64_t{1} << 28); count <<= 3) {
    const double t = predict(p, count);
    EXPECT_GT(t, previous) << "count " << count;
    previous = t;
  }
}

TEST(Timing, RingAllreduceLargeMessageMeetsTheBandwidthBound) {
  const LinkCostModel model;
  for (int32_t n : {2, 4, 8}) {
    // 32 instances: what the runtime's tuning table runs above 8 MB.
    const ef::Program p = ring_allreduce(n, 1, 32);
    const uint64_t count = fit(p, uint64_t{1} << 28);  // 1 GiB of float
    const TimingResult t = predict_time(p, call(count), model);
    ASSERT_TRUE(t.status.is_ok()) << t.status.message();
    const double bound = ring_bound_us(n, count * 4, model.nvlink.bandwidth_gbps);
    EXPECT_GE(t.time_us, bound) << n << " ranks: faster than the links allow";
    EXPECT_LE(t.time_us, 1.2 * bound) << n << " ranks: bound " << bound << " us";
    EXPECT_EQ(t.link_bytes, 2 * static_cast<uint64_t>(n - 1) * count * 4);
  }
}

TEST(Timing, BandwidthBoundFollowsTheModelsBandwidth) {
  LinkCostModel slow;
  slow.nvlink.bandwidth_gbps = 100;
  const ef::Program p = ring_allreduce(4, 1, 32);
  const uint64_t count = fit(p, uint64_t{1} << 27);
  const double t = predict(p, count, slow);
  const double bound = ring_bound_us(4, count * 4, 100);
  EXPECT_GE(t, bound);
  EXPECT_LE(t, 1.2 * bound);
}

TEST(Timing, OneThreadblockIsLimitedByItsOwnBandwidth) {
  // Calibration: docs/performance.md measured 12.6 GB/s busbw for a one-threadblock ring
  // allreduce over two H200s with 128 KiB slots at 512 MB.
  const ef::Program p = ring_allreduce(2);
  ExecOptions o = call(uint64_t{1} << 27);  // 512 MB of float
  o.slot_bytes = 128 << 10;
  const TimingResult t = predict_time(p, o, {});
  ASSERT_TRUE(t.status.is_ok()) << t.status.message();
  const double busbw = static_cast<double>(o.count * 4) / (t.time_us * 1e3);
  EXPECT_NEAR(busbw, 12.6, 0.2 * 12.6);
}

TEST(Timing, MoreChannelsOrInstancesAreNotSlowerForLargeMessages) {
  const uint64_t count = uint64_t{1} << 26;  // 256 MiB of float
  const double one = predict(ring_allreduce(8), count);
  for (int32_t k : {2, 4, 8}) {
    EXPECT_LE(predict(ring_allreduce(8, k, 1), count), one * 1.001) << k << " channels";
    EXPECT_LE(predict(ring_allreduce(8, 1, k), count), one * 1.001) << k << " instances";
  }
}

TEST(Timing, LatencyDominatesTinyMessages) {
  const LinkCostModel model;
  const ef::Program p = ring_allreduce(8);
  const uint64_t tiny = ef::count_granularity(p);  // one float per chunk
  const double t = predict(p, tiny, model);
  // 2(n-1) hops one after another, each at least one link latency, after the launch.
  const double latency_floor = model.launch_overhead_us + 14 * model.nvlink.latency_us;
  EXPECT_GE(t, latency_floor);
  EXPECT_LE(t, 1.5 * latency_floor);
  // Doubling (and 64-folding) the bytes barely changes it; the bandwidth term is negligible.
  EXPECT_NEAR(predict(p, 2 * tiny, model), t, 0.01 * t);
  EXPECT_NEAR(predict(p, 64 * tiny, model), t, 0.05 * t);
  // Latency, not bandwidth: halving the latency helps a lot, halving the bandwidth does not.
  LinkCostModel fast = model;
  fast.nvlink.latency_us /= 2;
  LinkCostModel thin = model;
  thin.nvlink.bandwidth_gbps /= 2;
  EXPECT_LT(predict(p, tiny, fast), 0.8 * t);
  EXPECT_NEAR(predict(p, tiny, thin), t, 0.01 * t);
}

TEST(Timing, ALongerDependencyChainTakesLonger) {
  const LinkCostModel model;
  for (uint64_t count : {uint64_t{1}, uint64_t{1} << 20}) {
    double previous = 0;
    for (int32_t hops : {1, 2, 4}) {
      const TimingResult t = predict_time(relay(hops), call(count), model);
      ASSERT_TRUE(t.status.is_ok()) << t.status.message();
      // Every extra hop adds at least its latency.
      EXPECT_GT(t.time_us, previous + model.nvlink.latency_us) << hops << " hops";
      previous = t.time_us;
    }
  }
}

TEST(Timing, FewerSlotsThrottleALatencyBoundPipeline) {
  const ef::Program p = relay(1);
  ExecOptions o = call(uint64_t{1} << 24);
  o.slot_bytes = 64 << 10;  // short tiles: the round trip is longer than a tile's transfer
  const TimingResult eight = predict_time(p, o, {});
  o.connection_slots = 1;
  const TimingResult one = predict_time(p, o, {});
  ASSERT_TRUE(eight.status.is_ok() && one.status.is_ok());
  EXPECT_GT(one.time_us, 2 * eight.time_us);
}

TEST(Timing, SlotsBeyondTheUnitsSentChangeNothing) {
  // A connection never holds more units than are sent through it: 2^31-1 slots cost no more
  // memory or time than the 16 units this relay sends.
  const ef::Program p = relay(2);
  ExecOptions o = call(16);
  o.slot_bytes = 4;  // one float per tile: 16 units per connection
  o.connection_slots = 16;
  const TimingResult enough = predict_time(p, o, {});
  o.connection_slots = std::numeric_limits<int>::max();
  const TimingResult huge = predict_time(p, o, {});
  ASSERT_TRUE(enough.status.is_ok() && huge.status.is_ok()) << huge.status.message();
  EXPECT_EQ(huge.time_us, enough.time_us);
  EXPECT_EQ(huge.iterations, 16u);
}

TEST(Timing, TransportsAndDevicePlacement) {
  const ef::Program p = fan(32);             // enough threadblocks to fill a link
  const uint64_t count = uint64_t{1} << 28;  // 1 GiB of float over one link
  const double bytes = static_cast<double>(count * 4);
  LinkCostModel model;
  const double nvlink = predict(p, count, model);
  EXPECT_NEAR(nvlink, bytes / (model.nvlink.bandwidth_gbps * 1e3), 0.05 * nvlink);

  LinkCostModel pcie = model;
  pcie.pair_transport[{0, 1}] = Transport::kPcieHostStaged;
  const double staged = predict(p, count, pcie);
  EXPECT_NEAR(staged, bytes / (model.pcie_host_staged.bandwidth_gbps * 1e3), 0.05 * staged);
  // A connection override wins over the pair's.
  for (int32_t c = 0; c < 32; ++c) pcie.connection_transport[{0, 1, c}] = Transport::kNvlink;
  EXPECT_EQ(pcie.transport(0, 1, 0), Transport::kNvlink);
  EXPECT_DOUBLE_EQ(predict(p, count, pcie), nvlink);
  // A PCIe path beside NVLink adds bandwidth when the split follows the bandwidths: one
  // channel in eight is close to 55 : 395.
  for (int32_t c = 0; c < 32; c += 8)
    pcie.connection_transport[{0, 1, c}] = Transport::kPcieHostStaged;
  EXPECT_LT(predict(p, count, pcie), nvlink);

  LinkCostModel shared = model;
  shared.rank_devices = {0, 0};
  EXPECT_EQ(shared.transport(0, 1, 0), Transport::kSameDevice);
  EXPECT_LT(predict(p, count, shared), nvlink);
}

TEST(Timing, IsDeterministic) {
  const ef::Program p = ring_allreduce(8, 2, 2);
  const uint64_t count = fit(p, 3'000'000);
  const TimingResult a = predict_time(p, call(count), {});
  const TimingResult b = predict_time(p, call(count), {});
  ASSERT_TRUE(a.status.is_ok());
  EXPECT_EQ(a.time_us, b.time_us);
  EXPECT_EQ(a.link_bytes, b.link_bytes);
  EXPECT_EQ(a.busiest_port_us, b.busiest_port_us);
}

TEST(Timing, DatatypeOnlyMattersThroughBytes) {
  const ef::Program p = ring_allreduce(4);
  const uint64_t count = fit(p, uint64_t{1} << 22);
  const TimingResult f32 = predict_time(p, call(count, ef::DataType::kFloat32), {});
  const TimingResult f16 = predict_time(p, call(2 * count, ef::DataType::kFloat16), {});
  ASSERT_TRUE(f32.status.is_ok() && f16.status.is_ok());
  EXPECT_DOUBLE_EQ(f32.time_us, f16.time_us);
}

TEST(Timing, NoDataLaunchesNothing) {
  const TimingResult t = predict_time(ring_allreduce(4), call(0), {});
  ASSERT_TRUE(t.status.is_ok()) << t.status.message();
  EXPECT_EQ(t.time_us, 0);
  EXPECT_EQ(t.iterations, 0u);
}

TEST(Timing, ReportsDeadlocksLikeTheExecutor) {
  const ef::Program p = crossed_receives();
  const TimingResult t = predict_time(p, call(16), {});
  EXPECT_FALSE(t.status.is_ok());
  EXPECT_TRUE(t.deadlock);
  ASSERT_EQ(t.blocked.size(), 2u);
  EXPECT_NE(t.blocked[0].waits_for.find("connection empty"), std::string::npos)
      << t.blocked[0].waits_for;
  // The executor agrees on who is stuck.
  ExecOptions o = call(16);
  StatusOr<std::vector<RankBuffers>> buffers = make_buffers(p, o);
  ASSERT_TRUE(buffers.is_ok());
  const ExecResult e = execute(p, o, *buffers);
  ASSERT_TRUE(e.deadlock);
  ASSERT_EQ(e.blocked.size(), t.blocked.size());
  for (std::size_t i = 0; i < e.blocked.size(); ++i)
    EXPECT_EQ(e.blocked[i].waits_for, t.blocked[i].waits_for);
}

TEST(Timing, RejectsInvalidCallsAndModels) {
  const ef::Program p = ring_allreduce(4);
  EXPECT_FALSE(predict_time(p, call(ef::count_granularity(p) + 1), {}).status.is_ok());
  ExecOptions no_slots = call(ef::count_granularity(p));
  no_slots.connection_slots = 0;
  EXPECT_FALSE(predict_time(p, no_slots, {}).status.is_ok());

  LinkCostModel zero;
  zero.nvlink.bandwidth_gbps = 0;
  const TimingResult t = predict_time(p, call(ef::count_granularity(p)), zero);
  EXPECT_FALSE(t.status.is_ok());
  EXPECT_NE(t.status.message().find("nvlink bandwidth"), std::string::npos) << t.status.message();
  LinkCostModel negative;
  negative.launch_overhead_us = -1;
  EXPECT_FALSE(check_model(negative).is_ok());
  LinkCostModel misplaced;
  misplaced.rank_devices = {0, 1};  // the program has 4 ranks
  EXPECT_FALSE(predict_time(p, call(ef::count_granularity(p)), misplaced).status.is_ok());

  ef::Program broken = relay(1);
  broken.ranks[1].threadblocks[0].recv_peer = 7;
  EXPECT_FALSE(predict_time(broken, call(1), {}).status.is_ok());
}

}  // namespace
}  // namespace efccl::host
