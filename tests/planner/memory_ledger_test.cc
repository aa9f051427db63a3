// The memory ledger alone, and the simulator's peaks with the transfer
// buffers the communication plan keeps alive (memory_ledger.h).
#include "planner/sim/memory_ledger.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/simulator.h"

namespace varipipe::planner {
namespace {

TEST(MemoryLedger, PeakIsTheLargestSumOverTime) {
  MemoryLedger ledger(2);
  ledger.Starts(0, 0, 100);
  ledger.Starts(0, 1, 50);
  ledger.Ends(0, 2, -120);
  ledger.Starts(0, 3, 60);
  ledger.Starts(1, 0, 10);
  EXPECT_EQ(ledger.Peaks(), (std::vector<double>{150, 10}));
}

// At one time an op's end comes first, then what is received, then an op's
// start (a RecvStart precedes a compute starting at the same time).
TEST(MemoryLedger, AtOneTimeEndsThenReceivedThenStarts) {
  MemoryLedger ledger(2);
  ledger.Starts(1, 0, 100);  // an op from 0 to 2
  ledger.Ends(1, 2, -100);
  ledger.Received(1, 0, 1, 40);  // arrives during the op
  ledger.Starts(1, 4, 30 - 40);  // its consumer starts: the buffer becomes its own
  EXPECT_EQ(ledger.Peaks()[1], 140);
  MemoryLedger ending(2);
  ending.Starts(1, 0, 100);
  ending.Ends(1, 2, -100);
  ending.Received(1, 0, 2, 40);  // arrives as the op ends
  EXPECT_EQ(ending.Peaks()[1], 100);
  MemoryLedger starting(2);
  starting.Starts(1, 0, 100);
  starting.Ends(1, 2, -100);
  starting.Received(1, 0, 2, 40);  // arrives as the next op starts
  starting.Starts(1, 2, 90);
  EXPECT_EQ(starting.Peaks()[1], 130);
  // Changes of one kind at one time net out.
  MemoryLedger netted(1);
  netted.Ends(0, 1, 50);
  netted.Ends(0, 1, -80);
  netted.Starts(0, 1, 60);
  EXPECT_EQ(netted.Peaks()[0], 30);
}

StageCostTable Costs(const PipelineShape& shape, double activation, double gradient) {
  StageCostTable costs(shape.stages(), std::vector<StageOpCost>(shape.micro_batches));
  for (auto& stage : costs) {
    for (StageOpCost& c : stage) {
      c.forward_ms = 1;
      c.backward_ms = 2;
      c.stored_bytes = 100;
      c.peak_bytes = 150;
      c.activation_bytes = activation;
      c.gradient_bytes = gradient;
    }
  }
  return costs;
}

// Two devices, 1F1B, transfers free: the last device sends every
// micro-batch's input gradient and keeps it until the iteration ends, so its
// peak grows by one gradient per micro-batch; the first keeps each sent
// activation until its backward and receives each gradient before it.
TEST(SimulatedMemory, SentGradientsAddUpOnTheLastDevice) {
  for (uint32_t m : {1u, 4u, 14u}) {
    const PipelineShape shape{2, 1, m};
    const absl::StatusOr<DeviceOrder> order = OneFOneBSchedule(shape);
    ASSERT_TRUE(order.ok());
    const SimulationResult without = Simulate(shape, *order, Costs(shape, 0, 0), ClusterNetwork{});
    const SimulationResult with = Simulate(shape, *order, Costs(shape, 7, 3), ClusterNetwork{});
    ASSERT_TRUE(without.completed && with.completed);
    // Device 1: one micro-batch in flight (stored 100 + transient 50). Its
    // last backward runs beside the m - 1 gradients sent before it, and the
    // activation it received became its input (charged in stored).
    EXPECT_DOUBLE_EQ(without.peak_bytes[1], 150) << "m=" << m;
    EXPECT_DOUBLE_EQ(with.peak_bytes[1], 150 + 3.0 * (m - 1)) << "m=" << m;
    // Device 0: two in flight at most. Its peak is a second forward's start,
    // while the first's sent activation (7) waits for its backward; a
    // received gradient (3) is freed as its backward starts.
    EXPECT_DOUBLE_EQ(without.peak_bytes[0], 100.0 * std::min(2u, m) + 50) << "m=" << m;
    EXPECT_DOUBLE_EQ(with.peak_bytes[0], without.peak_bytes[0] + (m > 1 ? 7 : 0)) << "m=" << m;
  }
}

}  // namespace
}  // namespace varipipe::planner
