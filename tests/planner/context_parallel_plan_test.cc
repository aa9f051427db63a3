// Context parallelism in the planner (docs/microbatching.md, "Context
// parallelism"): the lanes' placement and slots, the lanes' simulation
// against a hand-computed timeline, the validator's split-order and
// collective checks, and randomized plans under every split policy.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/config/rank_layout.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/microbatch/context_placement.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/validator.h"
#include "planner/planner.h"
#include "planner/schedule/lane_projection.h"
#include "planner/sim/simulator.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

// --- Placement and slots ----------------------------------------------------

std::vector<bool> Flags(std::initializer_list<int> bits) {
  std::vector<bool> flags;
  for (int b : bits) flags.push_back(b != 0);
  return flags;
}

LanePlacement Place(const std::vector<bool>& split, const std::vector<double>& whole,
                    const std::vector<double>& split_ms, uint32_t lanes) {
  std::unique_ptr<bool[]> flags(new bool[split.size()]);
  for (size_t i = 0; i < split.size(); ++i) flags[i] = split[i];
  return PlaceOnLanes(std::span<const bool>(flags.get(), split.size()), whole, split_ms, lanes);
}

TEST(ContextPlacement, LongestFirstOntoTheLeastLoadedLaneAndSlotsPerLane) {
  // Whole times 5, 4, 3, 3, 1 on 2 lanes, one split micro-batch (index 5)
  // of 2 ms: LPT puts 5 on lane 0, 4 on lane 1, 3 (index 2) on lane 1, 3
  // (index 3) on lane 0, 1 on lane 1 (8 + 2 / 8 + 2 each).
  const LanePlacement p =
      Place(Flags({0, 0, 0, 0, 0, 1}), {5, 4, 3, 3, 1, 9}, {0, 0, 0, 0, 0, 2}, 2);
  EXPECT_EQ(p.lane, (std::vector<uint32_t>{0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(p.lane_ms, (std::vector<double>{10, 10}));
  EXPECT_EQ(p.split_count(), 1u);
  // Lane 0 runs 0, 3; lane 1 runs 1, 2, 4: three whole slots, the split
  // slot at (0 + 1/2) / 1 = the middle: after whole slot 0 ((0 + 1/2) / 3).
  ASSERT_EQ(p.slots.size(), 4u);
  EXPECT_EQ(p.slots[0].by_lane, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.slots[1].split, 5);
  EXPECT_EQ(p.slots[2].by_lane, (std::vector<int>{3, 2}));
  EXPECT_EQ(p.slots[3].by_lane, (std::vector<int>{-1, 4}));
  // Every micro-batch is in exactly one slot, and every lane's slots hold
  // its own whole ones and every split one.
  std::multiset<int> seen;
  for (const ContextSlot& slot : p.slots) {
    if (slot.split >= 0) seen.insert(slot.split);
    for (int mb : slot.by_lane) {
      if (mb >= 0) seen.insert(mb);
    }
  }
  EXPECT_EQ(seen, (std::multiset<int>{0, 1, 2, 3, 4, 5}));
}

// The LPT placement's busiest lane against every assignment of up to 7
// whole micro-batches to 2 or 3 lanes: at most 4/3 - 1/(3 lanes) of the
// optimum (Graham's bound), and each lane's load is what it holds.
TEST(ContextPlacement, LongestFirstIsWithinGrahamsBoundOfTheOptimum) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("ContextPlacement.LongestFirstIsWithinGrahamsBoundOfTheOptimum"));
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t lanes = 2 + rng() % 2;
    const size_t n = 1 + rng() % 7;
    std::vector<double> whole(n);
    for (double& t : whole) t = 1 + rng() % 20;
    const std::vector<bool> split(n, false);
    const LanePlacement p = Place(split, whole, std::vector<double>(n, 0), lanes);
    std::vector<double> load(lanes, 0);
    for (size_t i = 0; i < n; ++i) load[p.lane[i]] += whole[i];
    EXPECT_EQ(load, p.lane_ms);
    double best = 1e300;
    size_t assignments = 1;
    for (size_t i = 0; i < n; ++i) assignments *= lanes;
    for (size_t a = 0; a < assignments; ++a) {
      std::vector<double> l(lanes, 0);
      size_t code = a;
      for (size_t i = 0; i < n; ++i, code /= lanes) l[code % lanes] += whole[i];
      best = std::min(best, *std::max_element(l.begin(), l.end()));
    }
    EXPECT_LE(p.busiest_lane_ms(), best * (4.0 / 3 - 1.0 / (3 * lanes)) + 1e-9)
        << "trial " << trial;
  }
}

TEST(ContextPlacement, ChoiceFollowsThePolicy) {
  // 0: fits only split; 1: a long one that fits both ways; 2, 3: short.
  const std::vector<SplitOption> options = {
      {.fits_whole = false, .fits_split = true, .whole_ms = 30, .split_ms = 16},
      {.fits_whole = true, .fits_split = true, .whole_ms = 20, .split_ms = 11},
      {.fits_whole = true, .fits_split = true, .whole_ms = 2, .split_ms = 1.5},
      {.fits_whole = true, .fits_split = true, .whole_ms = 2, .split_ms = 1.5}};
  std::vector<bool> split;
  std::string why;
  ASSERT_TRUE(ChooseSplits(v1::ALWAYS, options, 2, 1, &split, &why));
  EXPECT_EQ(split, Flags({1, 1, 1, 1}));
  EXPECT_FALSE(ChooseSplits(v1::NEVER, options, 2, 1, &split, &why));
  EXPECT_THAT(why, HasSubstr("micro-batch 0 fits one lane's memory neither whole"));
  // Per micro-batch: 0 must split (16 on both lanes); whole, 1 (20) on
  // lane 0 makes it 36; split it is 27 + the short ones: 1 and 0 split,
  // 2 and 3 whole on one lane each (29 each): better than 36, while
  // splitting a short one (1.5 on both) is no better than 2 on one lane.
  ASSERT_TRUE(ChooseSplits(v1::PER_MICRO_BATCH, options, 2, 1, &split, &why));
  EXPECT_EQ(split, Flags({1, 1, 0, 0}));
  // Four equal micro-batches (10 ms whole, 5.5 ms split) on 2 lanes: on
  // one device whole wins (20 ms per lane against 22); on a pipeline of 4,
  // splitting all of them halves the fill and drain:
  // 22 / 4 + 3/4 x 5.5 = 9.625 ms against 20 / 4 + 3/4 x 10 = 12.5 ms,
  // and splitting only some keeps a 10 ms micro-batch (the best such, two:
  // 21 / 4 + 7.5 = 12.75 ms).
  const std::vector<SplitOption> equal(
      4, {.fits_whole = true, .fits_split = true, .whole_ms = 10, .split_ms = 5.5});
  ASSERT_TRUE(ChooseSplits(v1::PER_MICRO_BATCH, equal, 2, 1, &split, &why));
  EXPECT_EQ(split, Flags({0, 0, 0, 0}));
  ASSERT_TRUE(ChooseSplits(v1::PER_MICRO_BATCH, equal, 2, 4, &split, &why));
  EXPECT_EQ(split, Flags({1, 1, 1, 1}));
  // Nothing fits split: ALWAYS fails naming the micro-batch.
  std::vector<SplitOption> no_split = options;
  no_split[2].fits_split = false;
  no_split[0].fits_whole = true;
  EXPECT_FALSE(ChooseSplits(v1::ALWAYS, no_split, 2, 1, &split, &why));
  EXPECT_THAT(why, HasSubstr("micro-batch 2"));
}

TEST(LaneProjection, EachLaneRunsItsOwnMicroBatchesOfTheSlotOrder) {
  const std::vector<ContextSlot> slots = {{.split = 4, .by_lane = {}},
                                          {.split = -1, .by_lane = {0, 1}},
                                          {.split = -1, .by_lane = {2, -1}}};
  const DeviceOrder slot_order = {{{OpKind::kForward, 0, 0},
                                   {OpKind::kForward, 0, 1},
                                   {OpKind::kForward, 0, 2},
                                   {OpKind::kBackward, 0, 2},
                                   {OpKind::kBackward, 0, 0},
                                   {OpKind::kBackward, 0, 1}}};
  EXPECT_EQ(FormatDeviceOrder(ProjectOntoLane(slot_order, slots, 0)),
            FormatDeviceOrder({{{OpKind::kForward, 0, 4},
                                {OpKind::kForward, 0, 0},
                                {OpKind::kForward, 0, 2},
                                {OpKind::kBackward, 0, 2},
                                {OpKind::kBackward, 0, 4},
                                {OpKind::kBackward, 0, 0}}}));
  EXPECT_EQ(FormatDeviceOrder(ProjectOntoLane(slot_order, slots, 1)),
            FormatDeviceOrder({{{OpKind::kForward, 0, 4},
                                {OpKind::kForward, 0, 1},
                                {OpKind::kBackward, 0, 4},
                                {OpKind::kBackward, 0, 1}}}));
  // Slot costs: the largest of the slot's micro-batches.
  StageCostTable costs(1, std::vector<StageOpCost>(5));
  costs[0][0] = {.forward_ms = 1, .backward_ms = 5, .stored_bytes = 10};
  costs[0][1] = {.forward_ms = 3, .backward_ms = 2, .stored_bytes = 4};
  const StageCostTable slot_costs = SlotCosts(costs, slots);
  EXPECT_EQ(slot_costs[0][1].forward_ms, 3);
  EXPECT_EQ(slot_costs[0][1].backward_ms, 5);
  EXPECT_EQ(slot_costs[0][1].stored_bytes, 10);
}

// --- The lanes' simulation ----------------------------------------------------

StageOpCost Cost(double forward, double backward) {
  return {.forward_ms = forward, .backward_ms = backward};
}

// pipeline 2, context 2: micro-batch 0 split (forward 2, backward 4 on
// every stage, on each lane), whole micro-batches 1 and 3 on lane 0
// (1/2 and 1/1), 2 on lane 1 (3/3); free transfers. Each lane runs GPipe
// over its slots (slot 0: the split one; slot 1: 1 and 2; slot 2: 3):
//
//   lane 0 device 0: 0F0 [0,2]  0F1 [2,3]  0F3 [3,4]  0B0 [12,16] 0B1 [16,18] 0B3 [18,19]
//   lane 0 device 1: 1F0 [2,4]  1F1 [4,5]  1F3 [5,6]  1B0 [8,12]  1B1 [12,14] 1B3 [14,15]
//   lane 1 device 0: 0F0 [0,2]  0F2 [2,5]             0B0 [12,16] 0B2 [16,19]
//   lane 1 device 1: 1F0 [2,4]  1F2 [5,8]             1B0 [8,12]  1B2 [12,15]
//
// Lane 0's device 1 could start 1B0 at 6, but the split backward runs on
// both lanes together, and lane 1's device 1 is busy with 1F2 until 8:
// the makespan is 19 (each lane on its own: lane 0 would end at 17).
TEST(LaneSimulation, MakespanMatchesTheHandComputedTimeline) {
  LanePipelines lanes;
  lanes.shape = {.devices = 2, .chunks = 1, .micro_batches = 4};
  lanes.split = Flags({1, 0, 0, 0});
  StageCostTable costs(2, std::vector<StageOpCost>(4));
  for (uint32_t s = 0; s < 2; ++s) {
    costs[s] = {Cost(2, 4), Cost(1, 2), Cost(3, 3), Cost(1, 1)};
  }
  lanes.costs = {costs, costs};
  const auto f = [](uint32_t s, uint32_t m) { return Op{OpKind::kForward, s, m}; };
  const auto b = [](uint32_t s, uint32_t m) { return Op{OpKind::kBackward, s, m}; };
  lanes.orders = {{{f(0, 0), f(0, 1), f(0, 3), b(0, 0), b(0, 1), b(0, 3)},
                   {f(1, 0), f(1, 1), f(1, 3), b(1, 0), b(1, 1), b(1, 3)}},
                  {{f(0, 0), f(0, 2), b(0, 0), b(0, 2)}, {f(1, 0), f(1, 2), b(1, 0), b(1, 2)}}};
  ClusterNetwork network;
  network.intra_node = {.latency_ms = 0, .bytes_per_ms = 0};
  network.inter_node = network.intra_node;
  lanes.networks = {network};
  const LaneSimulationResult r = SimulateLanes(lanes);
  ASSERT_TRUE(r.completed) << r.deadlock;
  EXPECT_DOUBLE_EQ(r.makespan_ms, 19);
  ASSERT_EQ(r.lanes.size(), 2u);
  // Every op's start, per lane.
  const auto start_of = [&](uint32_t lane, Op op) {
    for (const TimedOp& t : r.lanes[lane].ops) {
      if (t.op == op) return t.start_ms;
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(start_of(0, b(1, 0)), 8);
  EXPECT_DOUBLE_EQ(start_of(1, b(1, 0)), 8);
  EXPECT_DOUBLE_EQ(start_of(0, b(0, 0)), 12);
  EXPECT_DOUBLE_EQ(start_of(1, f(1, 2)), 5);
  EXPECT_DOUBLE_EQ(start_of(0, b(0, 3)), 18);
  EXPECT_DOUBLE_EQ(start_of(1, b(0, 2)), 16);
  // Busy time: lane 0 device 0 runs 2+1+1+4+2+1 = 11 ms.
  EXPECT_DOUBLE_EQ(r.lanes[0].busy_ms[0], 11);
  EXPECT_DOUBLE_EQ(r.lanes[1].busy_ms[0], 12);
  // Each lane alone (nothing split): lane 0's 1B0 starts at 6 and it ends
  // at 17.
  LanePipelines alone = lanes;
  alone.orders = {lanes.orders[0]};
  alone.costs = {costs};
  alone.split = Flags({0, 0, 0, 0});
  EXPECT_DOUBLE_EQ(SimulateLanes(alone).makespan_ms, 17);
}

TEST(LaneSimulation, OneLaneIsTheSimulator) {
  const PipelineShape shape{.devices = 3, .chunks = 1, .micro_batches = 5};
  StageCostTable costs(3, std::vector<StageOpCost>(5));
  for (uint32_t s = 0; s < 3; ++s) {
    for (uint32_t m = 0; m < 5; ++m) {
      costs[s][m] = {.forward_ms = 1.0 + m % 3,
                     .backward_ms = 2.0 + s,
                     .stored_bytes = 100.0 * m,
                     .peak_bytes = 150.0 * m,
                     .activation_bytes = 10,
                     .gradient_bytes = 10};
    }
  }
  DeviceOrder order(3);
  for (uint32_t s = 0; s < 3; ++s) {
    for (uint32_t m = 0; m < 5; ++m) order[s].push_back({OpKind::kForward, s, m});
    for (uint32_t m = 0; m < 5; ++m) order[s].push_back({OpKind::kBackward, s, m});
  }
  ClusterNetwork network;
  network.devices_per_node = 2;
  network.intra_node = {.latency_ms = 0.1, .bytes_per_ms = 100};
  network.inter_node = {.latency_ms = 0.5, .bytes_per_ms = 10};
  const SimulationResult one = Simulate(shape, order, costs, network);
  const LaneSimulationResult lanes = SimulateLanes(
      {.shape = shape, .orders = {order}, .costs = {costs}, .split = {}, .networks = {network}});
  ASSERT_TRUE(one.completed);
  ASSERT_TRUE(lanes.completed);
  EXPECT_EQ(lanes.makespan_ms, one.makespan_ms);
  EXPECT_EQ(lanes.lanes[0].peak_bytes, one.peak_bytes);
  EXPECT_EQ(lanes.lanes[0].busy_ms, one.busy_ms);
  ASSERT_EQ(lanes.lanes[0].ops.size(), one.ops.size());
  for (size_t i = 0; i < one.ops.size(); ++i) {
    EXPECT_EQ(lanes.lanes[0].ops[i].op, one.ops[i].op);
    EXPECT_EQ(lanes.lanes[0].ops[i].start_ms, one.ops[i].start_ms);
  }
}

TEST(LaneSimulation, SplitPassesInDifferentOrdersDeadlock) {
  LanePipelines lanes;
  lanes.shape = {.devices = 1, .chunks = 1, .micro_batches = 2};
  lanes.split = Flags({1, 1});
  StageCostTable costs(1, {Cost(1, 1), Cost(1, 1)});
  lanes.costs = {costs, costs};
  const auto f = [](uint32_t m) { return Op{OpKind::kForward, 0, m}; };
  const auto b = [](uint32_t m) { return Op{OpKind::kBackward, 0, m}; };
  lanes.orders = {{{f(0), f(1), b(0), b(1)}}, {{f(1), f(0), b(0), b(1)}}};
  lanes.networks = {ClusterNetwork()};
  const LaneSimulationResult r = SimulateLanes(lanes);
  EXPECT_FALSE(r.completed);
  EXPECT_THAT(r.deadlock, HasSubstr("lane 0 device 0 waits at 0F0"));
  EXPECT_THAT(r.deadlock, HasSubstr("other lanes"));
}

// --- The planner ----------------------------------------------------------------

v1::JobConfig Config(uint32_t pp, uint32_t dp, uint32_t context, v1::ContextSplitPolicy policy,
                     std::vector<v1::ScheduleKind> schedules, uint32_t memory_mib = 4096,
                     uint32_t max_length = 2048) {
  const std::string json = absl::StrCat(
      R"({"job_id": "test", "model": {"kind": "GPT", "num_layers": 8, "hidden_size": 256,
      "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": )",
      pp, R"(, "data": )", dp, R"(, "context": )", context, R"(},
      "cluster": {"device_memory_limit_mib": )",
      memory_mib, R"(, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 16384, "max_sequence_length": )",
      max_length, R"(},
      "planner": {"tmax_interval_ms": 0.05},
      "training": {"iterations": 1}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_THAT(config, IsOk());
  config->mutable_parallelism()->set_context_split(policy);
  config->mutable_planner()->clear_schedules();
  for (auto s : schedules) config->mutable_planner()->add_schedules(s);
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  return *config;
}

// A long-tailed mini-batch of GPT sequences: one of `max_length` / 2 to
// `max_length` tokens, then mostly 32-512 tokens and about one in eight of
// 1,024 to `max_length`, 16,384 tokens in all.
MiniBatch LongTail(std::mt19937& rng, uint32_t max_length, uint64_t* cursor) {
  MiniBatch mb;
  const uint32_t longest = max_length / 2 + rng() % (max_length / 2 + 1);
  mb.sample_ids.push_back((*cursor)++);
  mb.lengths.push_back({.input = longest - longest / 4, .target = longest / 4});
  uint64_t tokens = longest;
  while (true) {
    const uint32_t length = rng() % 8 == 0 ? 1024 + rng() % (max_length - 1023) : 32 + rng() % 481;
    if (tokens + length > 16384) break;
    tokens += length;
    mb.sample_ids.push_back((*cursor)++);
    mb.lengths.push_back({.input = length - length / 4, .target = length / 4});
  }
  return mb;
}

// Every lane's split passes in one order, per context group.
void ExpectSplitOrderAgrees(const std::vector<v1::ExecutionPlan>& plans) {
  std::map<std::pair<int, int>, std::vector<std::string>> first;
  for (const v1::ExecutionPlan& plan : plans) {
    std::vector<std::string> passes;
    for (const v1::Instruction& in : plan.instructions()) {
      if (in.op_case() != v1::Instruction::kForward && in.op_case() != v1::Instruction::kBackward) {
        continue;
      }
      if (!plan.micro_batches(in.micro_batch()).context().split()) continue;
      passes.push_back(absl::StrCat(in.op_case(), "/", in.stage(), "/", in.micro_batch()));
    }
    const auto [it, added] = first.emplace(std::make_pair(plan.dp_rank(), plan.pp_rank()), passes);
    if (!added) {
      EXPECT_EQ(passes, it->second) << "rank " << plan.rank();
    }
  }
}

struct CpShape {
  uint32_t pp, dp, context;
  v1::ContextSplitPolicy policy;
  std::vector<v1::ScheduleKind> schedules;
};

TEST(ContextParallelPlans, RandomMiniBatchesValidateUnderEveryPolicy) {
  std::mt19937 rng(varipipe::testing::TestSeed(
      "ContextParallelPlans.RandomMiniBatchesValidateUnderEveryPolicy"));
  std::vector<CpShape> shapes;
  for (v1::ContextSplitPolicy policy : {v1::ALWAYS, v1::NEVER, v1::PER_MICRO_BATCH}) {
    for (uint32_t c : {2u, 4u}) {
      for (uint32_t pp : {1u, 2u}) {
        for (uint32_t dp : {1u, 2u}) {
          const std::vector<std::vector<v1::ScheduleKind>> schedules = {
              {v1::ONE_F_ONE_B},
              {v1::ADAPTIVE, v1::ZERO_BUBBLE_H1},
              {v1::GPIPE, v1::KFKB},
              {v1::ADAPTIVE_ZERO_BUBBLE}};
          shapes.push_back({pp, dp, c, policy, schedules[rng() % schedules.size()]});
        }
      }
    }
  }
  int mixed = 0;
  int plans_checked = 0;
  for (const CpShape& shape : shapes) {
    const v1::JobConfig config =
        Config(shape.pp, shape.dp, shape.context, shape.policy, shape.schedules, 4096, 4096);
    absl::StatusOr<Planner> planner = Planner::Create(config);
    ASSERT_THAT(planner, IsOk());
    const RankLayout ranks = RankLayout::Of(config.parallelism());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < 3; ++iteration) {
      MiniBatch mb = LongTail(rng, 4096, &cursor);
      mb.iteration = iteration;
      SCOPED_TRACE(absl::StrCat("pp=", shape.pp, " dp=", shape.dp, " c=", shape.context, " ",
                                v1::ContextSplitPolicy_Name(shape.policy), " iteration ",
                                iteration));
      absl::StatusOr<PlanningResult> result = planner->Plan(mb);
      ASSERT_THAT(result, IsOk());
      const std::vector<v1::ExecutionPlan>& plans = result->plans;
      ASSERT_EQ(plans.size(), static_cast<size_t>(ranks.plan_ranks()));
      // The validator with every lane's plan: structure, lanes, split
      // order, and the channel replay with the split passes as collectives
      // of their context groups (no deadlock).
      EXPECT_THAT(ValidatePlans(plans), IsOk());
      ExpectSplitOrderAgrees(plans);
      ++plans_checked;
      int split = 0;
      int whole = 0;
      std::multiset<uint64_t> samples;
      for (const v1::ExecutionPlan& plan : plans) {
        EXPECT_EQ(plan.rank(), ranks.Rank(plan.dp_rank(), plan.pp_rank(), plan.context_rank()));
        EXPECT_EQ(plan.context_parallel(), shape.context);
        if (plan.pp_rank() != 0 || plan.context_rank() != 0) continue;
        for (const v1::MicroBatch& m : plan.micro_batches()) {
          (m.context().split() ? split : whole) += 1;
          samples.insert(m.sample_ids().begin(), m.sample_ids().end());
          if (m.context().split()) {
            // [1, A]: one row, target 0.
            EXPECT_EQ(m.row_starts_size(), 1);
            EXPECT_EQ(m.target_len(), 0u);
          } else {
            EXPECT_LT(m.context().lane(), shape.context);
          }
        }
      }
      // Every sample in exactly one micro-batch.
      EXPECT_EQ(samples, std::multiset<uint64_t>(mb.sample_ids.begin(), mb.sample_ids.end()));
      if (shape.policy == v1::ALWAYS) {
        EXPECT_EQ(whole, 0);
      }
      if (shape.policy == v1::NEVER) {
        EXPECT_EQ(split, 0);
      }
      if (split > 0 && whole > 0) ++mixed;
      EXPECT_EQ(result->report.split_micro_batches, split);
      EXPECT_EQ(result->report.context_parallel, shape.context);
      EXPECT_EQ(result->report.lane_compute_ms.size(), size_t{shape.dp} * shape.context);
      // The gradient group: every replica's every lane at the pipeline rank.
      for (const v1::ExecutionPlan& plan : plans) {
        const v1::Instruction& reduce = plan.instructions(plan.instructions_size() - 2);
        ASSERT_TRUE(reduce.has_all_reduce());
        const std::vector<int> group = ranks.DataParallelGroup(plan.pp_rank());
        EXPECT_EQ(std::vector<int>(reduce.all_reduce().group_ranks().begin(),
                                   reduce.all_reduce().group_ranks().end()),
                  group);
      }
    }
  }
  std::printf("%d plans checked, %d mixing split and whole micro-batches\n", plans_checked, mixed);
  EXPECT_GT(plans_checked, 0);
  // The per-micro-batch choice mixes split and whole micro-batches in
  // some plans of long-tailed data.
  EXPECT_GT(mixed, 0);
}

TEST(ContextParallelPlans, ByteIdenticalForAnyThreadCount) {
  v1::JobConfig config = Config(2, 2, 2, v1::PER_MICRO_BATCH, {v1::ADAPTIVE, v1::ONE_F_ONE_B});
  std::mt19937 rng(
      varipipe::testing::TestSeed("ContextParallelPlans.ByteIdenticalForAnyThreadCount"));
  uint64_t cursor = 0;
  MiniBatch mb = LongTail(rng, 2048, &cursor);
  std::vector<std::string> first;
  for (int threads : {1, 3}) {
    config.mutable_planner()->set_threads(threads);
    absl::StatusOr<Planner> planner = Planner::Create(config);
    ASSERT_THAT(planner, IsOk());
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    ASSERT_THAT(result, IsOk());
    std::vector<std::string> bytes;
    for (const v1::ExecutionPlan& plan : result->plans) {
      bytes.push_back(SerializePlanDeterministically(plan));
    }
    if (first.empty()) {
      first = bytes;
    } else {
      EXPECT_EQ(bytes, first) << threads << " threads";
    }
  }
}

// A lane that runs two split micro-batches' passes in another order than
// its group's other lane fails validation, naming the order.
TEST(ContextParallelPlans, ReorderedSplitPassesOnOneLaneFailValidation) {
  const v1::JobConfig config = Config(1, 1, 2, v1::ALWAYS, {v1::ONE_F_ONE_B});
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  std::mt19937 rng(varipipe::testing::TestSeed(
      "ContextParallelPlans.ReorderedSplitPassesOnOneLaneFailValidation"));
  uint64_t cursor = 0;
  const MiniBatch mb = LongTail(rng, 2048, &cursor);
  absl::StatusOr<PlanningResult> result = planner->Plan(mb);
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->plans.size(), 2u);
  ASSERT_GE(result->plans[1].micro_batches_size(), 2);
  ASSERT_THAT(ValidatePlans(result->plans), IsOk());
  // Lane 1 runs micro-batch 1's instructions where micro-batch 0's were
  // and the other way round.
  std::vector<v1::ExecutionPlan> broken = result->plans;
  for (v1::Instruction& in : *broken[1].mutable_instructions()) {
    if (in.has_all_reduce() || in.has_optimizer_step()) continue;
    if (in.micro_batch() <= 1) in.set_micro_batch(1 - in.micro_batch());
  }
  EXPECT_THAT(ValidatePlans(broken),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("split micro-batches out of order in the context group")));
  // A lane that runs another lane's whole micro-batch fails too.
  const v1::JobConfig never = Config(1, 1, 2, v1::NEVER, {v1::ONE_F_ONE_B});
  absl::StatusOr<Planner> whole_planner = Planner::Create(never);
  ASSERT_THAT(whole_planner, IsOk());
  absl::StatusOr<PlanningResult> whole = whole_planner->Plan(mb);
  ASSERT_THAT(whole, IsOk());
  std::vector<v1::ExecutionPlan> stolen = whole->plans;
  for (v1::MicroBatch& m : *stolen[0].mutable_micro_batches()) {
    if (m.context().lane() == 0) m.mutable_context()->set_lane(1);
  }
  EXPECT_THAT(ValidatePlans(stolen),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not on this lane")));
}

// One long sample among short ones: whole, its lane would carry most of
// the group's work; the per-micro-batch choice splits it and keeps the
// short ones whole, and the plan is faster than never splitting and than
// splitting everything.
// Sample 100 of 4,000 tokens among 24 short ones (128-208 tokens).
MiniBatch OneLongSampleAmongShortOnes() {
  MiniBatch mb;
  mb.lengths.push_back({.input = 3000, .target = 1000});
  mb.sample_ids.push_back(100);
  for (uint64_t i = 0; i < 24; ++i) {
    mb.lengths.push_back({.input = 100 + static_cast<uint32_t>(i % 5) * 20, .target = 28});
    mb.sample_ids.push_back(101 + i);
  }
  return mb;
}

TEST(ContextParallelPlans, PerMicroBatchChoiceSplitsTheLongSampleOnly) {
  const MiniBatch mb = OneLongSampleAmongShortOnes();
  std::map<v1::ContextSplitPolicy, double> iteration_ms;
  for (v1::ContextSplitPolicy policy : {v1::PER_MICRO_BATCH, v1::ALWAYS, v1::NEVER}) {
    absl::StatusOr<Planner> planner =
        Planner::Create(Config(1, 1, 4, policy, {v1::ONE_F_ONE_B}, 4096, 4096));
    ASSERT_THAT(planner, IsOk());
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    ASSERT_THAT(result, IsOk());
    EXPECT_THAT(ValidatePlans(result->plans), IsOk());
    iteration_ms[policy] = result->report.predicted_makespan_ms;
    if (policy != v1::PER_MICRO_BATCH) continue;
    int split = 0;
    int whole = 0;
    for (const v1::MicroBatch& m : result->plans[0].micro_batches()) {
      const bool has_long =
          std::find(m.sample_ids().begin(), m.sample_ids().end(), 100u) != m.sample_ids().end();
      if (has_long) {
        EXPECT_TRUE(m.context().split());
      }
      (m.context().split() ? split : whole) += 1;
    }
    EXPECT_GE(split, 1);
    EXPECT_GE(whole, 1);
    // The lanes' predicted compute is reported per lane.
    ASSERT_EQ(result->report.lane_compute_ms.size(), 4u);
  }
  std::printf("makespan: per micro-batch %.3f ms, always %.3f ms, never %.3f ms\n",
              iteration_ms[v1::PER_MICRO_BATCH], iteration_ms[v1::ALWAYS], iteration_ms[v1::NEVER]);
  EXPECT_LE(iteration_ms[v1::PER_MICRO_BATCH], iteration_ms[v1::NEVER]);
  EXPECT_LE(iteration_ms[v1::PER_MICRO_BATCH], iteration_ms[v1::ALWAYS]);
}

// A context group whose ranks sit on more than one node gathers over the
// inter-node link: splitting every micro-batch over 4 lanes predicts slower
// with nodes of 2 devices (1 GB/s between them) than with nodes of 8, 4
// or 6 (the one group of ranks 0-3 inside a node: the same plan); the
// per-micro-batch choice is never slower than splitting everything.
TEST(ContextParallelPlans, AGroupAcrossNodesGathersOverTheInterNodeLink) {
  const MiniBatch mb = OneLongSampleAmongShortOnes();
  const auto makespan = [&](v1::ContextSplitPolicy policy, uint32_t devices_per_node) {
    v1::JobConfig config = Config(1, 1, 4, policy, {v1::ONE_F_ONE_B}, 4096, 4096);
    config.mutable_cluster()->set_devices_per_node(devices_per_node);
    config.mutable_cluster()->set_inter_node_bandwidth_gbps(1);
    absl::StatusOr<Planner> planner = Planner::Create(config);
    EXPECT_THAT(planner, IsOk());
    if (!planner.ok()) return 0.0;
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    EXPECT_THAT(result, IsOk());
    if (!result.ok()) return 0.0;
    EXPECT_THAT(ValidatePlans(result->plans), IsOk());
    return result->report.predicted_makespan_ms;
  };
  const double inside = makespan(v1::ALWAYS, 8);
  const double across = makespan(v1::ALWAYS, 2);
  std::printf("split everything: group inside a node %.3f ms, across nodes %.3f ms\n", inside,
              across);
  EXPECT_GT(across, inside);
  EXPECT_DOUBLE_EQ(makespan(v1::ALWAYS, 4), inside);
  EXPECT_DOUBLE_EQ(makespan(v1::ALWAYS, 6), inside);
  EXPECT_LE(makespan(v1::PER_MICRO_BATCH, 2), across);
}

// A sample too long for one device under any recompute mode: the job
// fails at context 1 and plans at context 2, the long sample split and
// the short ones whole. Over a ladder of device limits 4% apart, every
// limit that plans at context 1 plans at context 2, and some plan only
// there.
TEST(ContextParallelPlans, JobsThatDoNotFitWithoutContextParallelismPlan) {
  MiniBatch mb;
  mb.lengths = {{.input = 6000, .target = 2000},
                {.input = 300, .target = 100},
                {.input = 200, .target = 56},
                {.input = 500, .target = 12}};
  mb.sample_ids = {10, 11, 12, 13};
  int only_with_context = 0;
  for (uint32_t memory_mib = 400; memory_mib <= 4096; memory_mib = memory_mib * 26 / 25) {
    SCOPED_TRACE(absl::StrCat(memory_mib, " MiB"));
    absl::StatusOr<Planner> one =
        Planner::Create(Config(1, 1, 1, v1::PER_MICRO_BATCH, {v1::ONE_F_ONE_B}, memory_mib, 8192));
    absl::StatusOr<Planner> two =
        Planner::Create(Config(1, 1, 2, v1::PER_MICRO_BATCH, {v1::ONE_F_ONE_B}, memory_mib, 8192));
    if (!one.ok() || !two.ok()) continue;  // the model state alone does not fit
    const absl::StatusOr<PlanningResult> without = one->Plan(mb);
    const absl::StatusOr<PlanningResult> with = two->Plan(mb);
    if (without.ok()) {
      EXPECT_THAT(with, IsOk());
      continue;
    }
    EXPECT_THAT(without, StatusIs(absl::StatusCode::kResourceExhausted));
    if (!with.ok()) continue;
    ++only_with_context;
    EXPECT_THAT(ValidatePlans(with->plans), IsOk());
    // The long sample runs split; the report says so.
    bool long_split = false;
    for (const v1::MicroBatch& m : with->plans[0].micro_batches()) {
      for (uint64_t id : m.sample_ids()) {
        if (id == 10) long_split = m.context().split();
      }
    }
    EXPECT_TRUE(long_split);
    EXPECT_GE(with->report.split_micro_batches, 1);
  }
  EXPECT_GT(only_with_context, 0);
}

// One long sample among 40 short ones at pp 2 and `context` lanes, over a
// ladder of device limits 4% apart, planned with one recompute mode per
// iteration (uniform_recompute) and with modes per micro-batch: wherever
// one mode plans, modes per micro-batch plan too, and validate. Where a
// micro-batch runs under its own mode (MicroBatch.recompute, the same on
// every rank and lane), it is the long sample alone (split with context
// parallelism), above the iteration's mode, and the iteration predicts
// faster than with one mode. Returns at how many limits that happened.
int LimitsWhereOnlyTheLongSampleRecomputesMore(uint32_t context) {
  MiniBatch mb;
  mb.lengths = {{.input = 6000, .target = 2000}};
  mb.sample_ids = {10};
  for (uint64_t i = 0; i < 40; ++i) {
    mb.lengths.push_back({.input = 200 + static_cast<uint32_t>(i % 7) * 40, .target = 56});
    mb.sample_ids.push_back(11 + i);
  }
  int raised = 0;
  for (uint32_t memory_mib = 400; memory_mib <= 4096; memory_mib = memory_mib * 26 / 25) {
    SCOPED_TRACE(absl::StrCat(memory_mib, " MiB"));
    v1::JobConfig uniform_config =
        Config(2, 1, context, v1::PER_MICRO_BATCH, {v1::ONE_F_ONE_B}, memory_mib, 8192);
    const v1::JobConfig mixed_config = uniform_config;
    uniform_config.mutable_planner()->set_uniform_recompute(true);
    absl::StatusOr<Planner> uniform = Planner::Create(uniform_config);
    absl::StatusOr<Planner> mixed = Planner::Create(mixed_config);
    if (!uniform.ok() || !mixed.ok()) continue;  // the model state alone does not fit
    const absl::StatusOr<PlanningResult> one_mode = uniform->Plan(mb);
    const absl::StatusOr<PlanningResult> own_modes = mixed->Plan(mb);
    if (one_mode.ok()) {
      EXPECT_THAT(own_modes, IsOk());
      EXPECT_EQ(one_mode->report.raised_recompute_micro_batches, 0);
      for (const v1::ExecutionPlan& plan : one_mode->plans) {
        for (const v1::MicroBatch& m : plan.micro_batches()) EXPECT_EQ(m.recompute(), "");
      }
    }
    if (!own_modes.ok()) continue;
    EXPECT_THAT(ValidatePlans(own_modes->plans), IsOk());
    int raised_here = 0;
    for (const v1::ExecutionPlan& plan : own_modes->plans) {
      for (const v1::MicroBatch& m : plan.micro_batches()) {
        if (m.recompute().empty()) continue;
        ++raised_here;
        // Only the long sample, alone (split with lanes), above the
        // iteration's mode.
        EXPECT_THAT(m.sample_ids(), ::testing::ElementsAre(10u));
        if (context > 1) {
          EXPECT_TRUE(m.context().split());
        }
        EXPECT_NE(m.recompute(), plan.recompute());
        EXPECT_NE(plan.recompute(), "full");
      }
    }
    const int per_plan = own_modes->report.raised_recompute_micro_batches;
    EXPECT_EQ(raised_here, per_plan * static_cast<int>(own_modes->plans.size()));
    if (per_plan == 0) continue;
    ++raised;
    const double own_ms = own_modes->report.predicted_iteration_ms;
    const double one_ms = one_mode.ok() ? one_mode->report.predicted_iteration_ms : 0;
    std::printf(
        "c %u, %u MiB: iteration recompute %s with %d micro-batch(es) raised, %.3f ms; one mode: "
        "%s %.3f ms\n",
        context, memory_mib, own_modes->report.recompute.c_str(), per_plan, own_ms,
        one_mode.ok() ? one_mode->report.recompute.c_str() : "no plan", one_ms);
    if (one_mode.ok()) {
      EXPECT_LT(own_ms, one_ms);
    }
  }
  return raised;
}

// The long sample's split fits a lane only under full recomputation, the
// short ones under none.
TEST(ContextParallelPlans, OnlyTheMicroBatchThatNeedsItRecomputesMore) {
  EXPECT_GT(LimitsWhereOnlyTheLongSampleRecomputesMore(2), 0);
}

// Without context parallelism: the long sample runs alone under its own
// mode (LoneSamples), the iteration under a lighter one.
TEST(PerMicroBatchRecompute, ALongSampleAloneRecomputesMoreWithoutContextParallelism) {
  EXPECT_GT(LimitsWhereOnlyTheLongSampleRecomputesMore(1), 0);
}

// The validator refuses an unknown mode and a micro-batch whose ranks
// disagree on its mode, naming the rank and the micro-batch.
TEST(ContextParallelPlans, MicroBatchModesAreKnownAndAgreeOnEveryRank) {
  MiniBatch mb;
  mb.lengths = {{.input = 3000, .target = 1000}};
  mb.sample_ids = {10};
  for (uint64_t i = 0; i < 12; ++i) {
    mb.lengths.push_back({.input = 200, .target = 56});
    mb.sample_ids.push_back(11 + i);
  }
  absl::StatusOr<Planner> planner =
      Planner::Create(Config(2, 1, 2, v1::PER_MICRO_BATCH, {v1::ONE_F_ONE_B}, 4096, 8192));
  ASSERT_THAT(planner, IsOk());
  absl::StatusOr<PlanningResult> result = planner->Plan(mb);
  ASSERT_THAT(result, IsOk());
  ASSERT_GE(result->plans.size(), 2u);
  std::vector<v1::ExecutionPlan> plans = result->plans;
  // Every rank raising micro-batch 0 alike is valid.
  for (v1::ExecutionPlan& plan : plans) plan.mutable_micro_batches(0)->set_recompute("full");
  EXPECT_THAT(ValidatePlans(plans), IsOk());
  plans[1].mutable_micro_batches(0)->set_recompute("selective");
  EXPECT_THAT(ValidatePlans(plans),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro-batch 0 recomputes")));
  plans = result->plans;
  plans[0].mutable_micro_batches(0)->set_recompute("sometimes");
  EXPECT_THAT(ValidatePlans(plans),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("micro_batches[0].recompute is 'sometimes'")));
}

}  // namespace
}  // namespace varipipe::planner
