// A micro-batch split across a context group (context_split_cost.h): the
// lane counts against ContextParallelSplit, the per-lane costs against
// hand-computed analytic components, the bounds a split must respect (no
// lane faster than 1/c of the whole, less memory per lane for long
// samples), and a 64k-token Llama-3-8B-like sample that fits only split.
#include "planner/cost/context_split_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/plan_contract/context_parallel_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::varipipe::testing::IsOk;

Hardware Preset(const char* name) {
  absl::StatusOr<Hardware> hw = HardwarePreset(name);
  EXPECT_THAT(hw, IsOk());
  return *hw;
}

// A small GPT: 4 layers, h = 64, 4 heads of 16, MLP 256, vocabulary 128.
ModelDims SmallGpt(AttentionKernel kernel = AttentionKernel::kExplicit) {
  return {.kind = ModelKind::kGpt,
          .encoder_layers = 4,
          .hidden = 64,
          .heads = 4,
          .kv_channels = 16,
          .ffn = 256,
          .vocab = 128,
          .dtype_bytes = 2,
          .attention_kernel = kernel};
}

// Llama-3-8B-like: 32 layers, h = 4,096, 32 heads of 128 with 8 key/value
// heads, SwiGLU 14,336, vocabulary 128,256, bf16, FlashAttention.
ModelDims Llama3_8b() {
  return {.kind = ModelKind::kGpt,
          .encoder_layers = 32,
          .hidden = 4096,
          .heads = 32,
          .kv_channels = 128,
          .ffn = 14336,
          .vocab = 128256,
          .dtype_bytes = 2,
          .attention_kernel = AttentionKernel::kFused,
          .architecture = Architecture::kLlama,
          .kv_heads = 8};
}

CostModel Analytic(const ModelDims& dims, const Hardware& hw, uint32_t max_seq_len,
                   uint32_t max_b = 4) {
  AnalyticGridOptions options;
  options.max_micro_batch_size = max_b;
  options.max_seq_len = max_seq_len;
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(dims, hw, options);
  EXPECT_THAT(model, IsOk());
  return *std::move(model);
}

// `model` without its attention-core grids.
CostModel WithoutCore(const CostModel& model) {
  CostModel out;
  for (const auto& [key, grid] : model.grids()) {
    if (key.component == Component::kAttentionCore) continue;
    EXPECT_THAT(out.SetGrid(key.component, key.recompute, key.tensor_parallel, grid), IsOk());
  }
  if (model.profiled_dims().has_value()) out.set_profiled_dims(*model.profiled_dims());
  return out;
}

double Time(const std::vector<StageOpCost>& stages) {
  double t = 0;
  for (const StageOpCost& s : stages) t += s.forward_ms + s.backward_ms;
  return t;
}
double MostPeak(const std::vector<StageOpCost>& stages) {
  double p = 0;
  for (const StageOpCost& s : stages) p = std::max(p, s.peak_bytes);
  return p;
}
double MostStored(const std::vector<StageOpCost>& stages) {
  double p = 0;
  for (const StageOpCost& s : stages) p = std::max(p, s.stored_bytes);
  return p;
}

TEST(ContextSplitCost, SlowestLaneMatchesTheSplitRule) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t c = 1 + rng() % 8;
    std::vector<uint32_t> lengths(1 + rng() % 5);
    std::vector<int64_t> lengths64;
    for (uint32_t& l : lengths) {
      l = 1 + rng() % 300;
      lengths64.push_back(l);
    }
    int64_t most_pairs = -1, most_local = 0;
    ContextParallelSplit slowest = *ContextParallelSplit::Of(lengths64, static_cast<int>(c), 0);
    for (uint32_t r = 0; r < c; ++r) {
      absl::StatusOr<ContextParallelSplit> split =
          ContextParallelSplit::Of(lengths64, static_cast<int>(c), static_cast<int>(r));
      ASSERT_THAT(split, IsOk());
      most_local = std::max(most_local, split->local_count());
      if (split->causal_pairs() > most_pairs) {
        most_pairs = split->causal_pairs();
        slowest = *split;
      }
    }
    const ContextLane lane = ContextSplitCostModel::SlowestLane(lengths, c);
    EXPECT_EQ(lane.lane, static_cast<uint32_t>(slowest.index()));
    EXPECT_EQ(lane.causal_pairs, most_pairs);
    EXPECT_EQ(lane.padded_tokens, slowest.all_gather_count());
    EXPECT_EQ(lane.padded_tokens, most_local);
    EXPECT_EQ(lane.local_tokens, slowest.local_count());
    EXPECT_EQ(lane.key_prefix_tokens, slowest.key_offsets().back());
    ASSERT_EQ(lane.chunk_pairs.size(), slowest.chunks().size());
    int64_t sum = 0;
    for (int64_t p : lane.chunk_pairs) sum += p;
    EXPECT_EQ(sum, lane.causal_pairs);
  }
}

TEST(ContextSplitCost, RefusesOneLaneAndT5) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Analytic(dims, Preset("a100-80gb"), 64);
  const StageLayout layout = *MakeStageLayout(dims, 1, 1);
  const MicroBatchCostModel whole =
      *MicroBatchCostModel::Create(model, layout, Recompute::kNone, 1);
  EXPECT_FALSE(ContextSplitCostModel::Create(whole, model, dims, 1).ok());
  ModelDims t5 = dims;
  t5.kind = ModelKind::kT5;
  t5.decoder_layers = 2;
  absl::StatusOr<ContextSplitCostModel> refused =
      ContextSplitCostModel::Create(whole, model, t5, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("parallelism.context"));
}

// One sample of 16 tokens over c = 2: lane 0 holds chunks [0, 4) and
// [12, 16) (10 + 58 = 68 pairs, key prefixes 4 + 16 = 20), lane 1 [4, 8)
// and [8, 12) (26 + 42 = 68 pairs): a tie, lane 0. A = 8. Without an
// attention-core grid the layer at 8 tokens (a grid point) trades its core
// for the analytic cores of sides sqrt(20) and sqrt(116); the all-gathers
// are one ring step each of K and of V, 8 tokens x 4 heads x 16 x 2 bytes =
// 1,024 bytes on the link; the reduce-scatters of their gradients the same
// steps of fp32, 2,048 bytes.
TEST(ContextSplitCost, HandComputedOneStageWithoutCoreGrid) {
  const ModelDims dims = SmallGpt();
  const Hardware hw = Preset("a100-80gb");
  const CostModel model = WithoutCore(Analytic(dims, hw, 64));
  const StageLayout layout = *MakeStageLayout(dims, 1, 1);
  const ContextLane lane = ContextSplitCostModel::SlowestLane({16}, 2);
  EXPECT_EQ(lane.lane, 0u);
  EXPECT_EQ(lane.causal_pairs, 68);
  EXPECT_EQ(lane.padded_tokens, 8);
  EXPECT_EQ(lane.key_prefix_tokens, 20);
  EXPECT_THAT(lane.chunk_pairs, ::testing::ElementsAre(10, 58));
  const Link link{.latency_ms = 0.01, .bytes_per_ms = 1e6};
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    const MicroBatchCostModel whole = *MicroBatchCostModel::Create(model, layout, mode, 1);
    ASSERT_FALSE(whole.prices_per_sample_attention());
    absl::StatusOr<ContextSplitCostModel> split =
        ContextSplitCostModel::Create(whole, model, dims, 2, {.link = link, .hardware = hw});
    ASSERT_THAT(split, IsOk());
    const double gather = 2 * (0.01 + 1024 / 1e6);
    const double scatter = 2 * (0.01 + 2048 / 1e6);
    EXPECT_DOUBLE_EQ(split->GatherMs(8), gather);
    EXPECT_DOUBLE_EQ(split->ReduceScatterMs(8), scatter);
    std::vector<StageOpCost> stages;
    ASSERT_TRUE(
        split->EvaluateStages({16}, MicroBatchCostModel::kEveryPosition, 1, 64, 2, &stages));
    ASSERT_EQ(stages.size(), 1u);
    const auto at = [&](Component c, double s) {
      return AnalyticComponentCost(dims, hw, c, mode, 1, 1, s, 0);
    };
    const auto core = [&](double s) {
      return AnalyticComponentCost(dims, hw, Component::kAttentionCore, Recompute::kNone, 1, 1, s,
                                   0);
    };
    const CostValues layer = at(Component::kEncoderLayer, 8);
    const CostValues embedding = at(Component::kEmbedding, 8);
    const CostValues head = at(Component::kPostprocess, 8);
    const CostValues row = core(8), c0 = core(std::sqrt(20.0)), c1 = core(std::sqrt(116.0));
    const double core_forward = c0.forward_ms + c1.forward_ms - row.forward_ms;
    const bool recomputed = mode != Recompute::kNone;  // explicit kernel
    const double core_backward =
        c0.backward_ms + c1.backward_ms - row.backward_ms + (recomputed ? core_forward : 0);
    const double core_stored =
        recomputed ? 0 : c0.stored_bytes + c1.stored_bytes - row.stored_bytes;
    const bool full = mode == Recompute::kFull;
    const double prefixes = 20.0 * 4 * 16 * 2 * 2;  // key prefixes' K and V
    const double layers = 4;
    EXPECT_NEAR(stages[0].forward_ms,
                layers * (layer.forward_ms + core_forward + gather) + embedding.forward_ms +
                    head.forward_ms,
                1e-9);
    EXPECT_NEAR(stages[0].backward_ms,
                layers * (layer.backward_ms + core_backward + scatter + (full ? gather : 0)) +
                    embedding.backward_ms + head.backward_ms,
                1e-9);
    EXPECT_NEAR(stages[0].stored_bytes,
                layers * (layer.stored_bytes + core_stored + (full ? 0 : prefixes)) +
                    embedding.stored_bytes + head.stored_bytes,
                1e-6);
    EXPECT_DOUBLE_EQ(stages[0].activation_bytes, 0);  // the last stage sends nothing
    // The peak: the A-token row's, plus what the lane keeps beside it, plus
    // the backward's transient: the prefixes' gradients and the gathered
    // buffer's (2 lanes x 8 tokens of K and V, fp32), and under full
    // recomputation the prefixes gathered again.
    std::vector<StageOpCost> row_stages;
    ASSERT_TRUE(whole.EvaluateStages(1, 8, 0, nullptr, 8, 1, 64, 2, &row_stages));
    const double kept = layers * (core_stored + (full ? 0 : prefixes));
    const double transient = prefixes + 2 * 8 * 4 * 16 * 2 * 4.0 + (full ? prefixes : 0);
    EXPECT_NEAR(stages[0].peak_bytes,
                std::max(stages[0].stored_bytes, row_stages[0].peak_bytes + kept + transient),
                1e-6);
  }
}

// With a core grid (the analytic model's) the lane's chunks are priced per
// pseudo-sample through MicroBatchCostModel: close to the analytic cores
// (the grid interpolates between powers of two); the measured
// point-to-point link replaces the configured one, and measured collective
// steps replace both.
TEST(ContextSplitCost, CoreGridAgreesWithAnalyticCoresAndMeasuredLinkWins) {
  const ModelDims dims = SmallGpt(AttentionKernel::kFused);
  const Hardware hw = Preset("a100-80gb");
  CostModel with_core = Analytic(dims, hw, 8192);
  const CostModel without = WithoutCore(with_core);
  const StageLayout layout = *MakeStageLayout(dims, 2, 1);
  const std::vector<uint32_t> lengths = {4096, 1024};
  for (uint32_t c : {2u, 4u}) {
    SCOPED_TRACE(c);
    const MicroBatchCostModel a =
        *MicroBatchCostModel::Create(with_core, layout, Recompute::kNone, 1);
    const MicroBatchCostModel b =
        *MicroBatchCostModel::Create(without, layout, Recompute::kNone, 1);
    const ContextSplitCostModel grid =
        *ContextSplitCostModel::Create(a, with_core, dims, c, {.hardware = hw});
    const ContextSplitCostModel formula =
        *ContextSplitCostModel::Create(b, without, dims, c, {.hardware = hw});
    std::vector<StageOpCost> x, y;
    ASSERT_TRUE(grid.EvaluateStages(lengths, MicroBatchCostModel::kEveryPosition, 1, 64, 2, &x));
    ASSERT_TRUE(formula.EvaluateStages(lengths, MicroBatchCostModel::kEveryPosition, 1, 64, 2, &y));
    ASSERT_EQ(x.size(), 2u);
    EXPECT_NEAR(Time(x), Time(y), 0.1 * Time(y));
    EXPECT_NEAR(MostStored(x), MostStored(y), 0.1 * MostStored(y));
    // A tokens per lane go to the next stage.
    const ContextLane lane = ContextSplitCostModel::SlowestLane(lengths, c);
    EXPECT_DOUBLE_EQ(x[0].activation_bytes, lane.padded_tokens * 64.0 * 2);
    EXPECT_DOUBLE_EQ(x[1].gradient_bytes, lane.padded_tokens * 64.0 * 2);
  }
  CommunicationCosts measured_costs;
  measured_costs.p2p = {.latency_ms = 0.5, .bytes_per_ms = 2e6};
  with_core.set_communication(measured_costs);
  const MicroBatchCostModel a =
      *MicroBatchCostModel::Create(with_core, layout, Recompute::kNone, 1);
  const ContextSplitCostModel measured = *ContextSplitCostModel::Create(a, with_core, dims, 4);
  EXPECT_DOUBLE_EQ(measured.gather_step().latency_ms, 0.5);
  // Three ring steps each of 100 tokens' K and of their V (4 x 16 x 2 bytes
  // each); the gradients' in fp32.
  EXPECT_DOUBLE_EQ(measured.GatherMs(100), 2 * 3 * (0.5 + 100 * 128 / 2e6));
  EXPECT_DOUBLE_EQ(measured.ReduceScatterMs(100), 2 * 3 * (0.5 + 100 * 256 / 2e6));
  measured_costs.all_gather_step = Link{.latency_ms = 0.02, .bytes_per_ms = 8e6};
  measured_costs.reduce_scatter_step = Link{.latency_ms = 0.03, .bytes_per_ms = 4e6};
  measured_costs.collective_ranks = 2;
  with_core.set_communication(measured_costs);
  const MicroBatchCostModel b =
      *MicroBatchCostModel::Create(with_core, layout, Recompute::kNone, 1);
  const ContextSplitCostModel steps = *ContextSplitCostModel::Create(b, with_core, dims, 4);
  EXPECT_DOUBLE_EQ(steps.GatherMs(100), 2 * 3 * (0.02 + 100 * 128 / 8e6));
  EXPECT_DOUBLE_EQ(steps.ReduceScatterMs(100), 2 * 3 * (0.03 + 100 * 256 / 4e6));
  // A group across nodes: the given (inter-node) link, whatever was measured
  // inside a node.
  const ContextSplitCostModel across = *ContextSplitCostModel::Create(
      b, with_core, dims, 4,
      {.link = Link{.latency_ms = 0.1, .bytes_per_ms = 1e6}, .spans_nodes = true});
  EXPECT_DOUBLE_EQ(across.GatherMs(100), 2 * 3 * (0.1 + 100 * 128 / 1e6));
  EXPECT_DOUBLE_EQ(across.ReduceScatterMs(100), 2 * 3 * (0.1 + 100 * 256 / 1e6));
}

// The what-if (ContextSplitOptions::ideal): each lane's times are exactly
// 1/c of the micro-batch's on one device (one packed row, each sample's
// attention its own), below the real split's; its memory is the real
// lane's.
TEST(ContextSplitCost, IdealLanesTakeAFairShareAndTransferNothing) {
  const ModelDims dims = SmallGpt(AttentionKernel::kFused);
  const Hardware hw = Preset("a100-80gb");
  const CostModel model = Analytic(dims, hw, 8192);
  const StageLayout layout = *MakeStageLayout(dims, 2, 1);
  const std::vector<uint32_t> lengths = {4096, 1024, 300};
  PackedSamples packed{.rows = 1};
  for (const uint32_t l : lengths) packed.samples.push_back({.input = l});
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (uint32_t c : {2u, 4u}) {
      SCOPED_TRACE(::testing::Message() << RecomputeName(mode) << ", c " << c);
      const MicroBatchCostModel whole = *MicroBatchCostModel::Create(model, layout, mode, 1);
      const ContextSplitCostModel real =
          *ContextSplitCostModel::Create(whole, model, dims, c, {.hardware = hw});
      const ContextSplitCostModel ideal =
          *ContextSplitCostModel::Create(whole, model, dims, c, {.ideal = true, .hardware = hw});
      std::vector<StageOpCost> one, r, i;
      ASSERT_TRUE(whole.EvaluateStages(1, 5420, 0, &packed, MicroBatchCostModel::kEveryPosition, 1,
                                       64, 2, &one));
      ASSERT_TRUE(real.EvaluateStages(lengths, MicroBatchCostModel::kEveryPosition, 1, 64, 2, &r));
      ASSERT_TRUE(ideal.EvaluateStages(lengths, MicroBatchCostModel::kEveryPosition, 1, 64, 2, &i));
      ASSERT_EQ(i.size(), 2u);
      for (size_t st = 0; st < 2; ++st) {
        EXPECT_DOUBLE_EQ(i[st].forward_ms, one[st].forward_ms / c);
        EXPECT_DOUBLE_EQ(i[st].backward_ms, one[st].backward_ms / c);
        EXPECT_DOUBLE_EQ(i[st].weight_ms, one[st].weight_ms / c);
        EXPECT_LT(i[st].forward_ms + i[st].backward_ms, r[st].forward_ms + r[st].backward_ms);
        EXPECT_DOUBLE_EQ(i[st].stored_bytes, r[st].stored_bytes);
        EXPECT_DOUBLE_EQ(i[st].peak_bytes, r[st].peak_bytes);
        EXPECT_DOUBLE_EQ(i[st].activation_bytes, r[st].activation_bytes);
      }
    }
  }
}

// No lane finishes a split micro-batch in less than 1/c of the whole one's
// time on one device (the same samples as a packed row priced per sample);
// and for long samples each lane keeps less than the whole micro-batch.
TEST(ContextSplitCost, SplitIsNoFasterThanAFairShareAndSmallerForLongSamples) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Hardware hw = Preset("h100-80gb");
  for (AttentionKernel kernel : {AttentionKernel::kExplicit, AttentionKernel::kFused}) {
    ModelDims dims = SmallGpt(kernel);
    dims.hidden = 256;
    dims.heads = 8;
    dims.kv_channels = 32;
    dims.ffn = 1024;
    const CostModel model = Analytic(dims, hw, 16384);
    const StageLayout layout = *MakeStageLayout(dims, 2, 1);
    for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      const MicroBatchCostModel whole = *MicroBatchCostModel::Create(model, layout, mode, 1);
      for (int trial = 0; trial < 20; ++trial) {
        const uint32_t c = 2u << (rng() % 3);
        std::vector<uint32_t> lengths(1 + rng() % 4);
        PackedSamples packed{.rows = 1, .samples = {}};
        uint32_t total = 0;
        for (uint32_t& l : lengths) {
          l = 1 + rng() % 4096;
          total += l;
          packed.samples.push_back({.input = l});
        }
        SCOPED_TRACE(::testing::Message()
                     << AttentionKernelName(kernel) << " " << RecomputeName(mode) << " c " << c
                     << " trial " << trial);
        const ContextSplitCostModel split = *ContextSplitCostModel::Create(whole, model, dims, c);
        std::vector<StageOpCost> lane, one;
        ASSERT_TRUE(
            split.EvaluateStages(lengths, MicroBatchCostModel::kEveryPosition, 1, 256, 2, &lane));
        ASSERT_TRUE(whole.EvaluateStages(1, total, 0, &packed, 1, 256, 2, &one));
        EXPECT_GE(Time(lane), Time(one) / c);
      }
      // One long sample: less per lane.
      for (uint32_t c : {2u, 4u, 8u}) {
        const ContextSplitCostModel split = *ContextSplitCostModel::Create(whole, model, dims, c);
        std::vector<StageOpCost> lane, one;
        ASSERT_TRUE(
            split.EvaluateStages({16384}, MicroBatchCostModel::kEveryPosition, 1, 256, 2, &lane));
        ASSERT_TRUE(whole.EvaluateStages(1, 16384, 0, 1, 256, 2, &one));
        EXPECT_LT(MostPeak(lane), MostPeak(one)) << RecomputeName(mode) << " c " << c;
        if (mode != Recompute::kFull) {
          EXPECT_LT(MostStored(lane), MostStored(one)) << RecomputeName(mode) << " c " << c;
        }
      }
    }
  }
}

// A 64k-token sample on a Llama-3-8B-like model over 4 pipeline stages of
// 80 GiB devices (ZeRO-1 over 8 data-parallel replicas, H100 analytic
// model, no recomputation): whole, the busiest stage's activations exceed
// its room; split over c = 4 or 8 they fit.
TEST(ContextSplitCost, Llama3_8bSampleOf64kFitsOnlySplit) {
  const ModelDims dims = Llama3_8b();
  const Hardware hw = Preset("h100-80gb");
  const CostModel model = Analytic(dims, hw, 65536, 1);
  const StageLayout layout = *MakeStageLayout(dims, 4, 1);
  absl::StatusOr<std::vector<double>> room =
      AvailableActivationBytesPerDevice(model, layout, ZeroStage::k1, 8, 80.0 * 1024 * 1024 * 1024);
  ASSERT_THAT(room, IsOk());
  const MicroBatchCostModel whole =
      *MicroBatchCostModel::Create(model, layout, Recompute::kNone, 1);
  std::vector<StageOpCost> one;
  ASSERT_TRUE(whole.EvaluateStages(1, 65536, 0, 1, dims.hidden, 2, &one));
  const auto fits = [&](const std::vector<StageOpCost>& stages) {
    for (size_t s = 0; s < stages.size(); ++s) {
      if (stages[s].peak_bytes > (*room)[s]) return false;
    }
    return true;
  };
  EXPECT_FALSE(fits(one)) << "whole peak " << MostPeak(one) / (1 << 30) << " GiB";
  for (uint32_t c : {4u, 8u}) {
    const ContextSplitCostModel split = *ContextSplitCostModel::Create(whole, model, dims, c);
    std::vector<StageOpCost> lane;
    ASSERT_TRUE(split.EvaluateStages({65536}, MicroBatchCostModel::kEveryPosition, 1, dims.hidden,
                                     2, &lane));
    EXPECT_TRUE(fits(lane)) << "c " << c << " peak " << MostPeak(lane) / (1 << 30) << " GiB, room "
                            << (*room)[0] / (1 << 30) << " GiB";
    // And no faster than a fair share of the whole.
    EXPECT_GE(Time(lane), Time(one) / c);
  }
}

}  // namespace
}  // namespace varipipe::planner
