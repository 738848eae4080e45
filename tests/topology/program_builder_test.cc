// Balanced transfers as EF programs (efccl/balance/program_builder.h, plan_program.h): every
// route kind validates and verifies on the host executor, errors name the transfer, chunk
// splits round as documented, and plans of random demands on every preset become programs
// that verify bit-exactly, identical however often and from whichever table they are built.
#include "efccl/balance/program_builder.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "efccl/balance/plan_program.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "efccl/host/topology_model.h"
#include "efccl/topology/presets.h"

namespace {

using namespace efccl;
using balance::ProgramTransfer;
using balance::Route;
using balance::RouteHop;

constexpr uint64_t MiB = 1u << 20;

std::string diagnostics(const ef::Program& p) {
  std::string out;
  for (const Diagnostic& d : ef::validate(p)) out += d.to_string() + "\n";
  return out;
}

/// Validates and verifies `p` on the host executor (int8, 64 bytes a chunk, and 7-byte tiles
/// so that every chunk crosses its connections in several slots).
void expect_verifies(const ef::Program& p, const std::string& what) {
  ASSERT_EQ(diagnostics(p), "") << what;
  for (std::size_t slot : {std::size_t{0}, std::size_t{7}}) {
    host::ExecOptions o;
    o.count = 64;
    o.dtype = ef::DataType::kInt8;
    o.slot_bytes = slot;
    const host::VerifyResult r = host::run_and_verify(p, o, 11);
    EXPECT_TRUE(r.pass) << what << ": " << r.message;
  }
}

ProgramTransfer every_route_kind() {
  ProgramTransfer t;
  t.sender = 0;
  t.receiver = 1;
  t.src_chunk = 2;
  t.dst_chunk = 1;
  t.chunks = 17;
  t.shares = {{Route::direct(), 8, 4},
              {Route::forward(2), 5, 2},
              {Route::slot_device(0), 2, 0},
              {Route::host(), 2, 0}};
  return t;
}

TEST(ProgramBuilder, EveryRouteKindOfALonePairVerifies) {
  const ProgramTransfer t = every_route_kind();
  balance::ProgramBuildOptions o;
  o.nranks = 3;
  o.slot_devices = 1;
  o.forward_op_chunks = 2;
  StatusOr<ef::Program> p = balance::build_program({&t, 1}, o);
  ASSERT_TRUE(p) << p.status().message();
  expect_verifies(*p, "lone pair");
  EXPECT_EQ(p->collective, ef::Collective::kCustom);
  EXPECT_EQ(p->nchunksperloop, 1);
  EXPECT_EQ(p->slot_devices, 1);
  EXPECT_EQ(p->ranks[0].input_chunks, 19);
  EXPECT_EQ(p->ranks[1].output_chunks, 18);
  EXPECT_EQ(p->ranks[2].input_chunks, 0);
  EXPECT_EQ(p->ranks[2].output_chunks, 0);
  // Direct on channels 0-3; the forward on 0-1 of 0->2 and 2->1 (free there); slots on the
  // device and in host memory on the next free channels of 0->1: 4 and 5.
  EXPECT_EQ(p->placements,
            (std::vector<ef::ConnectionPlacement>{{0, 1, 4, ef::SlotLocation::kDevice, 0},
                                                  {0, 1, 5, ef::SlotLocation::kHost, 0}}));
  EXPECT_EQ(p->nchannels, 6);
  // The relay forwards with rcs through 2 chunks of scratch per forwarding threadblock.
  EXPECT_EQ(p->ranks[2].scratch_chunks, 4);
  int rcs = 0;
  for (const ef::Threadblock& tb : p->ranks[2].threadblocks) {
    EXPECT_EQ(tb.recv_peer, 0);
    EXPECT_EQ(tb.send_peer, 1);
    for (const ef::Op& op : tb.ops) {
      EXPECT_EQ(op.code, ef::OpCode::kRecvCopySend);
      EXPECT_LE(op.count, 2);
      rcs += static_cast<int>(op.count);
    }
  }
  EXPECT_EQ(rcs, 5);
  // One postcondition per chunk, in order.
  ASSERT_EQ(p->postconditions.size(), 17u);
  EXPECT_EQ(p->postconditions[3], (ef::Postcondition{1, 4, {{0, 5}}}));
  // The same inputs give the same program, byte for byte.
  EXPECT_EQ(ef::save_json(*balance::build_program({&t, 1}, o)), ef::save_json(*p));
}

TEST(ProgramBuilder, ManyTransfersShareLanesAndRoutesMayChainForwardsAndPlacements) {
  // Four ranks: 0 -> 3 through 1 then 2, its first hop's slots on slot device 1, its second
  // in host memory; 3 -> 0 direct twice (one lane, two transfers); a local copy on 2; 1 -> 2
  // with slots on slot device 0.
  std::vector<ProgramTransfer> ts(5);
  ts[0] = {0, 3, 0, 0, 6, {}};
  ts[0].shares = {{Route{{RouteHop{1, ef::SlotLocation::kDevice, 1},
                          RouteHop{2, ef::SlotLocation::kHost, 0}, RouteHop{}}},
                   6, 2}};
  ts[1] = {3, 0, 0, 0, 3, {}};
  ts[2] = {3, 0, 5, 3, 4, {{Route::direct(), 4, 2}}};
  ts[3] = {2, 2, 0, 0, 3, {}};
  ts[4] = {1, 2, 0, 3, 2, {{Route::slot_device(0), 2, 0}}};
  balance::ProgramBuildOptions o;
  o.nranks = 4;
  o.slot_devices = 2;
  StatusOr<ef::Program> p = balance::build_program(ts, o);
  ASSERT_TRUE(p) << p.status().message();
  expect_verifies(*p, "chain");
  // 0 -> 3 takes channels 0-1 on all three of its connections; 1 -> 2 through slot device 0
  // then channel 2, the first free one on 1 -> 2.
  EXPECT_EQ(p->placements,
            (std::vector<ef::ConnectionPlacement>{{0, 1, 0, ef::SlotLocation::kDevice, 1},
                                                  {0, 1, 1, ef::SlotLocation::kDevice, 1},
                                                  {1, 2, 0, ef::SlotLocation::kHost, 0},
                                                  {1, 2, 1, ef::SlotLocation::kHost, 0},
                                                  {1, 2, 2, ef::SlotLocation::kDevice, 0}}));
  // 3 -> 0: one lane of 2 channels carries both transfers (4 and 3 chunks, in order).
  int lane_tbs = 0;
  for (const ef::Threadblock& tb : p->ranks[3].threadblocks) lane_tbs += tb.send_peer == 0;
  EXPECT_EQ(lane_tbs, 2);
}

TEST(ProgramBuilder, ErrorsNameTheTransfer) {
  balance::ProgramBuildOptions o;
  o.nranks = 3;
  o.slot_devices = 1;
  const auto fails = [&](ProgramTransfer t, const std::string& expected,
                         std::vector<ProgramTransfer> more = {}) {
    more.insert(more.begin(), t);
    StatusOr<ef::Program> p = balance::build_program(more, o);
    ASSERT_FALSE(p) << expected;
    EXPECT_NE(p.status().message().find(expected), std::string::npos) << p.status().message();
  };
  ProgramTransfer t = every_route_kind();
  t.shares[0].chunks = 7;
  fails(t, "transfer 0 (rank 0 -> rank 1): its shares carry 16 chunks; expected 17");
  t = every_route_kind();
  t.receiver = 3;
  fails(t, "transfer 0 (rank 0 -> rank 3): ranks must be 0..2");
  t = every_route_kind();
  t.shares[1].route = Route::forward(1);
  fails(t,
        "hop 0 forwards through rank 1; expected a rank of the program other than the "
        "route's ends");
  t = every_route_kind();
  t.shares[2].route = Route::slot_device(1);
  fails(t, "names slot device 1 with slots at the device; the program has 1 slot devices");
  t = every_route_kind();
  t.shares[3].route.hops[0].device = 2;
  fails(t, "names slot device 2 with slots at the host");
  t = every_route_kind();
  t.shares[0].route.hops[0].to = 2;  // the last hop must reach the receiver
  fails(t, "a route's last hop must reach the receiver");
  t = every_route_kind();
  ProgramTransfer overlap = t;
  overlap.sender = 2;
  overlap.dst_chunk = 17;
  overlap.shares.clear();
  fails(t,
        "transfer 1 (rank 2 -> rank 1) writes output chunks of rank 1 that transfer 0 (rank "
        "0 -> rank 1) writes too",
        {overlap});
  ProgramTransfer local{1, 1, 0, 0, 2, {{Route::host(), 2, 0}}};
  fails(local, "a copy within one rank takes the direct route only");
  o.nranks = 0;
  EXPECT_FALSE(balance::build_program({}, o));
}

TEST(PlanProgram, ChunkSplitsRoundByLargestRemainder) {
  balance::PairPlan pair;
  pair.src = 0;
  pair.dst = 1;
  pair.bytes = 10 * MiB + 100;
  pair.paths = {{0, 5 * MiB + 512 * 1024}, {1, 3 * MiB + 600 * 1024 + 100}, {3, 936 * 1024}};
  StatusOr<balance::ChunkSplit> s = balance::split_into_chunks(pair, MiB);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->chunks, 10);
  EXPECT_EQ(s->tail_bytes, 100u);
  // Whole chunks 5, 3, 0 (8); the two left go to the largest remainders: 936 KiB, then 600 KiB.
  ASSERT_EQ(s->shares.size(), 3u);
  EXPECT_EQ(s->shares[0].chunks, 5);
  EXPECT_EQ(s->shares[1].chunks, 4);
  EXPECT_EQ(s->shares[2].candidate, 3u);
  EXPECT_EQ(s->shares[2].chunks, 1);
  // Exact when shares are whole chunks; a share of no chunk disappears.
  pair.bytes = 4 * MiB;
  pair.paths = {{0, 4 * MiB}, {2, 0}};
  s = balance::split_into_chunks(pair, MiB);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->tail_bytes, 0u);
  ASSERT_EQ(s->shares.size(), 1u);
  EXPECT_FALSE(balance::split_into_chunks(pair, 0));
  pair.paths[0].bytes = 3 * MiB;  // shares that do not add up
  EXPECT_FALSE(balance::split_into_chunks(pair, MiB));
}

TEST(PlanProgram, CandidatesSayWhatTheyAre) {
  const topo::Topology t = *topo::preset("nimble-h100", 2);
  const std::vector<topo::NodeIndex> g = t.gpus();
  auto table = balance::PathTable::build(t, g);
  ASSERT_TRUE(table) << table.status().message();
  // Inside a host: direct, through each other GPU, through host memory.
  auto in = (*table)->candidates(0, 1);
  ASSERT_TRUE(in);
  const auto& inside = *in;
  ASSERT_EQ(inside->size(), 4u);
  EXPECT_EQ((*inside)[0].kind, balance::CandidateKind::kDirect);
  EXPECT_EQ((*inside)[1].kind, balance::CandidateKind::kRelay);
  EXPECT_EQ((*inside)[1].relays, (std::vector<topo::NodeIndex>{g[2]}));
  EXPECT_EQ((*inside)[2].relays, (std::vector<topo::NodeIndex>{g[3]}));
  EXPECT_EQ((*inside)[3].kind, balance::CandidateKind::kHost);
  EXPECT_TRUE((*inside)[3].relays.empty());
  // Between hosts: the own rail, then every rail through the GPUs owning it on each side.
  auto out = (*table)->candidates(0, 5);
  ASSERT_TRUE(out);
  const auto& across = *out;
  EXPECT_EQ((*across)[0].kind, balance::CandidateKind::kDirect);
  EXPECT_EQ((*across)[0].rail, 0);
  for (std::size_t c = 1; c < across->size(); ++c) {
    const balance::Candidate& k = (*across)[c];
    EXPECT_EQ(k.kind, balance::CandidateKind::kRail) << k.via;
    const int32_t r = k.rail;
    std::vector<topo::NodeIndex> owners;
    if (r != 0) owners.push_back(g[static_cast<std::size_t>(r)]);      // h0.gpu<r>
    if (r != 1) owners.push_back(g[static_cast<std::size_t>(4 + r)]);  // h1.gpu<r>
    EXPECT_EQ(k.relays, owners) << k.via;
  }
  auto local = balance::PathTable::build(t, {g[0], g[0]});
  ASSERT_TRUE(local);
  EXPECT_EQ((**(*local)->candidates(0, 1))[0].kind, balance::CandidateKind::kLocal);
}

TEST(PlanProgram, RelayPoliciesPickForwardsSlotDevicesOrNewRanks) {
  const topo::Topology t = *topo::preset("nimble-h100", 2);
  const std::vector<topo::NodeIndex> g = t.gpus();
  balance::Candidate relay;
  relay.kind = balance::CandidateKind::kRelay;
  relay.relays = {g[2]};
  balance::Candidate rail;  // h0.gpu0 -> h1.gpu1 through the owners of rail 3 on both sides
  rail.kind = balance::CandidateKind::kRail;
  rail.relays = {g[3], g[7]};
  // Program ranks on g0, g1 (host 0) and g5 (host 1): g2, g3, g7 have no rank.
  const std::vector<topo::NodeIndex> ranks = {g[0], g[1], g[5]};
  {
    balance::RouteResolver r(t, ranks, balance::RelayPolicy::kForward);
    EXPECT_EQ(*r.route(relay), Route::forward(3));
    EXPECT_EQ(*r.route(rail), (Route{{RouteHop{4}, RouteHop{5}, RouteHop{}}}));
    EXPECT_EQ(r.binding().rank_gpus,
              (std::vector<topo::NodeIndex>{g[0], g[1], g[5], g[2], g[3], g[7]}));
    EXPECT_EQ(r.slot_devices(), 0);
  }
  {
    balance::RouteResolver r(t, ranks, balance::RelayPolicy::kForwardOrSlotDevice);
    EXPECT_EQ(*r.route(relay), Route::slot_device(0));
    // The first relay takes the slots; the second forwards through a rank added for it.
    EXPECT_EQ(*r.route(rail), (Route{{RouteHop{3, ef::SlotLocation::kDevice, 1}, RouteHop{}}}));
    EXPECT_EQ(r.binding().slot_device_gpus, (std::vector<topo::NodeIndex>{g[2], g[3]}));
    EXPECT_EQ(r.nranks(), 4);
  }
  {
    // With ranks on every GPU: forwards under kForwardOrSlotDevice, slots under kSlotDevice.
    balance::RouteResolver f(t, g, balance::RelayPolicy::kForwardOrSlotDevice);
    EXPECT_EQ(*f.route(relay), Route::forward(2));
    balance::RouteResolver s(t, g, balance::RelayPolicy::kSlotDevice);
    EXPECT_EQ(*s.route(relay), Route::slot_device(0));
    EXPECT_EQ(*s.route(rail), (Route{{RouteHop{7, ef::SlotLocation::kDevice, 1}, RouteHop{}}}));
    EXPECT_EQ(s.nranks(), 8);
  }
  balance::Candidate host;
  host.kind = balance::CandidateKind::kHost;
  balance::RouteResolver r(t, ranks, balance::RelayPolicy::kSlotDevice);
  EXPECT_EQ(*r.route(host), Route::host());
}

// ---- The property test: random demands on every preset ----

using balance::Demand;

Demand zeros(int n) { return Demand{n, std::vector<uint64_t>(static_cast<std::size_t>(n * n), 0)}; }
void set(Demand& d, int s, int t, uint64_t b) {
  d.bytes[static_cast<std::size_t>(s * d.nranks + t)] = b;
}

/// A random demand of one of four shapes, in whole units (so that plans stay coarse).
Demand random_demand(int n, std::mt19937& rng, int shape, uint64_t unit) {
  Demand d = zeros(n);
  const auto units = [&](uint32_t most) { return (1 + rng() % most) * unit; };
  switch (shape) {
    case 0: {  // skew: one hot destination takes most of every rank's bytes
      const int hot = static_cast<int>(rng() % static_cast<uint32_t>(n));
      for (int s = 0; s < n; ++s)
        for (int t = 0; t < n; ++t)
          if (s != t) set(d, s, t, t == hot ? units(48) + 32 * unit : units(4));
      break;
    }
    case 1:  // sparse: a few random pairs, some local
      for (int k = 0; k < n; ++k)
        set(d, static_cast<int>(rng() % static_cast<uint32_t>(n)),
            static_cast<int>(rng() % static_cast<uint32_t>(n)), units(64));
      break;
    case 2: {  // MoE-like: top-2 experts, one of them hot
      for (int s = 0; s < n; ++s)
        for (int t = 0; t < n; ++t)
          if (s != t) set(d, s, t, (t == 1 ? 12 : 2) * unit + units(3));
      break;
    }
    default:  // uniform
      for (int s = 0; s < n; ++s)
        for (int t = 0; t < n; ++t)
          if (s != t) set(d, s, t, 8 * unit);
  }
  return d;
}

struct Case {
  const char* preset;
  int nodes;
};

TEST(PlanProgram, RandomDemandsOnEveryPresetBecomeProgramsThatVerify) {
  const Case cases[] = {{"nimble-h100", 1}, {"nimble-h100", 2}, {"nimble-h100", 4}, {"dgx-h100", 1},
                        {"dgx-h100", 2},    {"hgx-h200", 1},    {"h200-nv18-x2", 1}};
  std::mt19937 rng(20261127);
  int programs = 0, relayed = 0, hosted = 0, slotted = 0, exact = 0;
  for (const Case& c : cases) {
    auto t = topo::preset(c.preset, c.nodes);
    ASSERT_TRUE(t) << t.status().message();
    const int n = static_cast<int>(t->gpus().size());
    auto table = balance::PathTable::build(*t, t->gpus());
    auto other = balance::PathTable::build(*t, t->gpus());
    ASSERT_TRUE(table && other);
    balance::PlannerOptions po;
    po.min_split_bytes = 2 * MiB;  // small pairs stay direct, large ones split
    for (int shape = 0; shape < 4; ++shape) {
      const std::string what = std::string(c.preset) + " x" + std::to_string(c.nodes) + " shape " +
                               std::to_string(shape);
      SCOPED_TRACE(what);
      const Demand d = random_demand(n, rng, shape, MiB);
      auto plan = balance::Planner(*table, po).plan(d);
      auto again = balance::Planner(*other, po).plan(d);
      ASSERT_TRUE(plan) << plan.status().message();
      ASSERT_TRUE(again) << again.status().message();
      // At most 4096 chunks (exact where the plan allows, else shares rounded to chunks).
      const uint64_t chunk = balance::demand_chunk_bytes(*plan, 4096);
      ASSERT_GT(chunk, 0u);
      ASSERT_EQ(chunk % balance::exact_chunk_bytes(*plan), 0u);
      exact += chunk == balance::exact_chunk_bytes(*plan);
      for (balance::RelayPolicy policy :
           {balance::RelayPolicy::kForwardOrSlotDevice, balance::RelayPolicy::kSlotDevice,
            balance::RelayPolicy::kForward}) {
        balance::DemandProgramOptions o;
        o.relays = policy;
        auto built = balance::build_demand_program(**table, *plan, chunk, o);
        ASSERT_TRUE(built) << built.status().message();
        expect_verifies(built->program, what);
        ++programs;
        for (const ef::ConnectionPlacement& pl : built->program.placements) {
          hosted += pl.location == ef::SlotLocation::kHost;
          slotted += pl.location == ef::SlotLocation::kDevice;
        }
        for (const ef::Rank& r : built->program.ranks) relayed += r.scratch_chunks > 0;
        // Built twice, and from the other table's plan: the same program, byte for byte.
        auto twice = balance::build_demand_program(**table, *plan, chunk, o);
        auto from_other = balance::build_demand_program(**other, *again, chunk, o);
        ASSERT_TRUE(twice && from_other);
        EXPECT_EQ(ef::save_json(twice->program), ef::save_json(built->program));
        EXPECT_EQ(ef::save_json(from_other->program), ef::save_json(built->program));
        EXPECT_EQ(from_other->binding.slot_device_gpus, built->binding.slot_device_gpus);
        // The timing model runs it on the machine it was planned for.
        auto model = host::model_for_topology(*t, built->binding.rank_gpus, {},
                                              built->binding.slot_device_gpus);
        ASSERT_TRUE(model) << model.status().message();
        host::ExecOptions call;
        call.count = chunk;
        call.dtype = ef::DataType::kInt8;
        const host::TimingResult time = host::predict_time(built->program, call, *model);
        EXPECT_TRUE(time.status.is_ok()) << time.status.message();
        EXPECT_GT(time.time_us, 0);
      }
    }
  }
  EXPECT_EQ(programs, 7 * 4 * 3);
  // The random demands exercised every route kind.
  EXPECT_GT(relayed, 0);
  EXPECT_GT(hosted, 0);
  EXPECT_GT(slotted, 0);
  EXPECT_GT(exact, 0);
}

TEST(PlanProgram, APlanByClassBecomesTheProgramOfItsListing) {
  // A plan by class lists its pairs lazily (planner.h, PairList): the program, the chunking and
  // the direct plan are those of the same pairs listed one by one.
  auto t = topo::preset("dgx-h100", 2);
  ASSERT_TRUE(t) << t.status().message();
  auto table = balance::PathTable::build(*t, t->gpus());
  ASSERT_TRUE(table);
  const int n = static_cast<int>(t->gpus().size());
  Demand d{n, std::vector<uint64_t>(static_cast<std::size_t>(n * n), 16 * MiB)};
  for (int r = 0; r < n; ++r) d.bytes[static_cast<std::size_t>(r * (n + 1))] = 0;
  auto plan = balance::Planner(*table, balance::PlannerOptions{}).plan(d);
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_TRUE(plan->by_class);
  ASSERT_TRUE(plan->pairs.lazy());
  balance::Plan listed = *plan;
  listed.pairs = std::vector<balance::PairPlan>(plan->pairs.begin(), plan->pairs.end());
  ASSERT_FALSE(listed.pairs.lazy());
  const uint64_t chunk = balance::demand_chunk_bytes(*plan, 4096);
  EXPECT_EQ(chunk, balance::demand_chunk_bytes(listed, 4096));
  auto built = balance::build_demand_program(**table, *plan, chunk);
  auto from_list = balance::build_demand_program(**table, listed, chunk);
  ASSERT_TRUE(built && from_list);
  EXPECT_EQ(ef::save_json(built->program), ef::save_json(from_list->program));
  expect_verifies(built->program, "dgx-h100 x2 uniform by class");
  const balance::Plan direct = balance::direct_plan(*plan);
  EXPECT_FALSE(direct.pairs.lazy());
  EXPECT_EQ(direct.link_bytes, balance::direct_plan(listed).link_bytes);
  EXPECT_EQ(balance::max_load_us(*t, direct.link_bytes), plan->direct_max_load_us);
}

TEST(PlanProgram, DemandChunksAreExactWhereTheBudgetAllows) {
  balance::Plan plan;
  balance::PairPlan a;
  a.bytes = 12 * MiB;
  a.paths = {{0, 8 * MiB}, {1, 4 * MiB - 4096}, {2, 4096}};
  balance::PairPlan b;
  b.bytes = 18 * MiB;
  b.paths = {{0, 18 * MiB}};
  plan.pairs = {a, b};
  EXPECT_EQ(balance::exact_chunk_bytes(plan), 4096u);
  EXPECT_EQ(balance::demand_chunk_bytes(plan, 1u << 20), 4096u);  // 7680 chunks fit
  // 30 MiB in at most 100 chunks: the smallest multiple of 4 KiB dividing gcd(12, 18) MiB =
  // 6 MiB that gives <= 100 chunks is 96 x 4 KiB = 384 KiB (80 chunks).
  EXPECT_EQ(balance::demand_chunk_bytes(plan, 100), 384u * 1024);
  EXPECT_EQ(balance::demand_chunk_bytes(plan, 2), 6 * MiB);  // the coarsest: still 5 chunks
  EXPECT_EQ(balance::demand_chunk_bytes(balance::Plan{}, 10), 0u);
  // A cap on the chunk: the largest divisor of the exact one under it (still exact).
  balance::Plan coarse;
  balance::PairPlan c;
  c.bytes = 768 * MiB;
  c.paths = {{0, 512 * MiB}, {1, 256 * MiB}};
  coarse.pairs = {c};
  EXPECT_EQ(balance::exact_chunk_bytes(coarse), 256 * MiB);
  EXPECT_EQ(balance::demand_chunk_bytes(coarse, 1u << 20), 256 * MiB);
  EXPECT_EQ(balance::demand_chunk_bytes(coarse, 1u << 20, 3 * MiB), 2 * MiB);
  EXPECT_EQ(balance::demand_chunk_bytes(coarse, 1u << 20, MiB), MiB);
  EXPECT_EQ(balance::demand_chunk_bytes(coarse, 100, MiB), 256 * MiB);  // 768 chunks do not fit
}

}  // namespace
