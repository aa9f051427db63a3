// Static schedules simulated over a grid of pipeline shapes: coverage,
// deadlock freedom, the closed-form bubble fractions and 1F1B's in-flight
// counts.
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/chrome_trace.h"
#include "planner/sim/simulator.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

// Equal costs per micro-batch; each of the shape's stages takes 1/chunks of
// a device's per-micro-batch time.
StageCostTable Uniform(const PipelineShape& shape, double forward_ms, double backward_ms) {
  StageCostTable costs(shape.stages(), std::vector<StageOpCost>(shape.micro_batches));
  for (auto& stage : costs) {
    for (StageOpCost& c : stage) {
      c.forward_ms = forward_ms / shape.chunks;
      c.backward_ms = backward_ms / shape.chunks;
      c.stored_bytes = 100;
      c.peak_bytes = 150;
      c.activation_bytes = c.gradient_bytes = 1000;
    }
  }
  return costs;
}

ClusterNetwork FreeNetwork() { return ClusterNetwork{}; }

enum class Kind { kGpipe, kOneFOneB, kInterleaved, kKfkb2, kKfkb3 };

absl::StatusOr<DeviceOrder> Build(Kind kind, const PipelineShape& shape) {
  switch (kind) {
    case Kind::kGpipe:
      return GpipeSchedule(shape);
    case Kind::kOneFOneB:
      return OneFOneBSchedule(shape);
    case Kind::kInterleaved:
      return InterleavedOneFOneBSchedule(shape);
    case Kind::kKfkb2:
      return KfkbSchedule(shape, 2);
    case Kind::kKfkb3:
      return KfkbSchedule(shape, 3);
  }
  return absl::InternalError("unknown");
}

TEST(Op, RoundTripsThroughText) {
  const Op op{OpKind::kBackward, 3, 12};
  EXPECT_EQ(op.ToString(), "3B12");
  absl::StatusOr<Op> parsed = ParseOp("3B12");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(*parsed, op);
  EXPECT_THAT(ParseOp("F1"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'F1'")));
  EXPECT_THAT(ParseOp("2X1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Every schedule covers every op once and completes (no deadlock) for
// 1-8 devices, 1-4 chunks (interleaved, GPipe) and 1-20 micro-batches,
// with random costs.
TEST(StaticSchedules, CompleteOverAGridOfShapes) {
  std::mt19937 rng(99);
  int simulated = 0;
  for (Kind kind :
       {Kind::kGpipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kKfkb2, Kind::kKfkb3}) {
    for (uint32_t p = 1; p <= 8; ++p) {
      for (uint32_t v = 1; v <= 4; ++v) {
        if (v > 1 && kind != Kind::kInterleaved && kind != Kind::kGpipe) continue;
        for (uint32_t m = 1; m <= 20; ++m) {
          const PipelineShape shape{p, v, m};
          absl::StatusOr<DeviceOrder> order = Build(kind, shape);
          ASSERT_THAT(order, IsOk());
          ASSERT_EQ(CheckScheduleCoverage(shape, *order), "")
              << "p=" << p << " v=" << v << " m=" << m << "\n"
              << FormatDeviceOrder(*order);
          StageCostTable costs = Uniform(shape, 1, 2);
          for (auto& stage : costs) {
            for (StageOpCost& c : stage) {
              c.forward_ms *= 0.5 + (rng() % 100) / 50.0;
              c.backward_ms *= 0.5 + (rng() % 100) / 50.0;
            }
          }
          ClusterNetwork net{
              .devices_per_node = 2, .intra_node = {0.01, 1e6}, .inter_node = {0.05, 1e5}};
          const SimulationResult r = Simulate(shape, *order, costs, net);
          ASSERT_TRUE(r.completed) << "kind " << static_cast<int>(kind) << " p=" << p << " v=" << v
                                   << " m=" << m << ": " << r.deadlock << "\n"
                                   << FormatDeviceOrder(*order);
          ++simulated;
        }
      }
    }
  }
  EXPECT_GT(simulated, 1000);
}

// Equal micro-batch times, free communication: GPipe and 1F1B bubbles are
// (p - 1) / (m + p - 1) on every device.
TEST(StaticSchedules, BubbleFractionMatchesTheClosedForm) {
  for (Kind kind : {Kind::kGpipe, Kind::kOneFOneB}) {
    for (uint32_t p : {2u, 4u, 8u}) {
      for (uint32_t m : {1u, 4u, 8u, 13u, 32u}) {
        const PipelineShape shape{p, 1, m};
        const SimulationResult r =
            Simulate(shape, *Build(kind, shape), Uniform(shape, 1.0, 2.0), FreeNetwork());
        ASSERT_TRUE(r.completed) << r.deadlock;
        const double expected = (p - 1.0) / (m + p - 1.0);
        EXPECT_NEAR(r.makespan_ms, (m + p - 1) * 3.0, 1e-9) << "p=" << p << " m=" << m;
        for (double b : r.bubble_fraction)
          EXPECT_NEAR(b, expected, 1e-9) << "p=" << p << " m=" << m;
      }
    }
  }
}

// Interleaved with v chunks: (p - 1) / (v * m + p - 1) when m is a multiple
// of p (Narayanan et al. 2021, section 2.2).
TEST(StaticSchedules, InterleavedBubbleMatchesTheClosedForm) {
  for (uint32_t p : {2u, 4u}) {
    for (uint32_t v : {2u, 3u, 4u}) {
      for (uint32_t rounds : {1u, 2u, 3u}) {
        const uint32_t m = rounds * p;
        const PipelineShape shape{p, v, m};
        const SimulationResult r = Simulate(shape, *InterleavedOneFOneBSchedule(shape),
                                            Uniform(shape, 1.0, 2.0), FreeNetwork());
        ASSERT_TRUE(r.completed) << r.deadlock;
        const double expected = (p - 1.0) / (v * m + p - 1.0);
        for (double b : r.bubble_fraction) {
          EXPECT_NEAR(b, expected, 1e-9) << "p=" << p << " v=" << v << " m=" << m;
        }
      }
    }
  }
}

TEST(StaticSchedules, OneFOneBKeepsPMinusIInFlight) {
  for (uint32_t p : {2u, 4u, 8u}) {
    for (uint32_t m : {1u, 3u, 8u, 20u}) {
      const PipelineShape shape{p, 1, m};
      // Without transfer buffers (memory_ledger_test covers them) the peak
      // is what the micro-batches in flight store plus one transient.
      StageCostTable costs = Uniform(shape, 1, 2);
      for (auto& stage : costs) {
        for (StageOpCost& c : stage) c.activation_bytes = c.gradient_bytes = 0;
      }
      const SimulationResult r = Simulate(shape, *OneFOneBSchedule(shape), costs, FreeNetwork());
      ASSERT_TRUE(r.completed);
      for (uint32_t i = 0; i < p; ++i) {
        EXPECT_EQ(r.peak_in_flight[i], std::min(p - i, m)) << "p=" << p << " m=" << m << " i=" << i;
        EXPECT_DOUBLE_EQ(r.peak_bytes[i], 100.0 * std::min(p - i, m) + 50);
      }
      const SimulationResult g =
          Simulate(shape, *GpipeSchedule(shape), Uniform(shape, 1, 2), FreeNetwork());
      for (uint32_t i = 0; i < p; ++i) EXPECT_EQ(g.peak_in_flight[i], m);
    }
  }
}

TEST(StaticSchedules, KfkbWithKOneIsOneFOneB) {
  for (uint32_t p = 1; p <= 6; ++p) {
    for (uint32_t m = 1; m <= 12; ++m) {
      const PipelineShape shape{p, 1, m};
      EXPECT_EQ(*KfkbSchedule(shape, 1), *OneFOneBSchedule(shape)) << "p=" << p << " m=" << m;
    }
  }
  EXPECT_THAT(KfkbSchedule({2, 1, 4}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(OneFOneBSchedule({2, 2, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("interleaved")));
}

TEST(Simulator, ReportsADeadlock) {
  // Device 1 wants the backward of micro-batch 1 before running forward 0.
  const PipelineShape shape{2, 1, 2};
  DeviceOrder order = *OneFOneBSchedule(shape);
  order[1] = {{OpKind::kForward, 1, 1},
              {OpKind::kBackward, 1, 1},
              {OpKind::kForward, 1, 0},
              {OpKind::kBackward, 1, 0}};
  order[0] = {{OpKind::kForward, 0, 0},
              {OpKind::kBackward, 0, 0},
              {OpKind::kForward, 0, 1},
              {OpKind::kBackward, 0, 1}};
  const SimulationResult r = Simulate(shape, order, Uniform(shape, 1, 2), FreeNetwork());
  EXPECT_FALSE(r.completed);
  EXPECT_THAT(r.deadlock, HasSubstr("device 1 waits at 1F1"));
  EXPECT_THAT(r.deadlock, HasSubstr("device 0 waits at 0B0"));
}

TEST(Simulator, CommunicationDelaysAndTrace) {
  const PipelineShape shape{2, 1, 4};
  const DeviceOrder order = *OneFOneBSchedule(shape);
  const StageCostTable costs = Uniform(shape, 1, 2);
  const SimulationResult free = Simulate(shape, order, costs, FreeNetwork());
  // 1000 bytes at 100 bytes/ms plus 1 ms latency: 11 ms per transfer.
  const ClusterNetwork slow{.devices_per_node = 1, .intra_node = {}, .inter_node = {1, 100}};
  const SimulationResult r = Simulate(shape, order, costs, slow);
  ASSERT_TRUE(r.completed);
  EXPECT_GT(r.makespan_ms, free.makespan_ms + 2 * 11 - 1e-9);
  EXPECT_EQ(r.transfers.size(), 8u);  // 4 activations, 4 gradients
  // Transfers on one channel never overlap.
  for (size_t a = 0; a < r.transfers.size(); ++a) {
    for (size_t b = a + 1; b < r.transfers.size(); ++b) {
      const TimedTransfer& x = r.transfers[a];
      const TimedTransfer& y = r.transfers[b];
      if (x.from == y.from && x.to == y.to) {
        EXPECT_TRUE(x.end_ms <= y.start_ms + 1e-9 || y.end_ms <= x.start_ms + 1e-9);
      }
    }
  }
  const std::string json = ChromeTraceJson(r, "test \"trace\"", 4);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_THAT(json, HasSubstr("\"F mb3 s1\""));
  EXPECT_THAT(json, HasSubstr("device 1 (rank 5)"));
  EXPECT_EQ(parsed.fields().at("traceEvents").list_value().values_size(),
            2 * 3 + 16 + 8);  // metadata, ops, transfers
}

}  // namespace
}  // namespace varipipe::planner
