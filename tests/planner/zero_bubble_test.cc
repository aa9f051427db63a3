// Split backward (F, B, W): the IR's text form, the simulator's W timing and
// memory, ZB-H1's closed form and its bubble against 1F1B on the analytic
// A100 model, and the adaptive zero-bubble schedule's invariants.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/schedule/adaptive.h"
#include "planner/schedule/backward_split.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/chrome_trace.h"
#include "planner/sim/order_search.h"
#include "planner/sim/simulator.h"
#include "planner/sim/weight_fill.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::Gpt67bDims;
using ::varipipe::testing::IsOk;

TEST(ZeroBubbleOp, WeightOpsRoundTripThroughText) {
  const Op w{OpKind::kWeight, 2, 0};
  EXPECT_EQ(w.ToString(), "2W0");
  absl::StatusOr<Op> parsed = ParseOp("2W0");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(*parsed, w);
  EXPECT_EQ(ParseOp("7B3")->kind, OpKind::kBackward);
  EXPECT_FALSE(ParseOp("W3").ok());
}

// The linear layers of one transformer layer as the executor builds them
// (executor/model/transformer_layer.cc): input width, output width and
// whether they run over encoder tokens (T5 cross-attention keys and values)
// instead of the layer's own tokens.
struct Linear {
  double in, out;
  bool over_encoder_tokens = false;
};
std::vector<Linear> LayerLinears(const ModelDims& d, bool decoder) {
  const double h = d.hidden, i = static_cast<double>(d.attention_width()), f = d.ffn;
  std::vector<Linear> l = {{h, 3 * i}, {i, h}, {h, f}, {f, h}};
  if (decoder) {
    l.push_back({h, i});
    l.push_back({h, 2 * i, true});
    l.push_back({i, h});
  }
  return l;
}

// The split rule against a layer-by-layer count of the linear layers: W's
// FLOPs are the weight GEMMs (2 * in * out per token), the attention core
// 4 * s * i per token and attended position count s, and B keeps every
// linear layer's input and output gradient (the encoder output once per
// stage); the LM head's weight gradient is B's (chunked_loss_head.h): its
// forward FLOPs join the denominator and it keeps nothing for W. Dimensions
// off GPT's proportions (i != h,
// f != 4i) so that no shortcut formula passes.
TEST(ZeroBubbleSplit, FollowsTheLinearLayersOfTheModel) {
  const ModelDims t5{.kind = ModelKind::kT5,
                     .encoder_layers = 6,
                     .decoder_layers = 6,
                     .hidden = 512,
                     .heads = 12,
                     .kv_channels = 96,
                     .ffn = 3000,
                     .vocab = 32128,
                     .dtype_bytes = 2};
  const BackwardSplitRule rule(t5);
  const double i = static_cast<double>(t5.attention_width());
  for (const bool decoder : {false, true}) {
    const StageLayers stage{.samples = 3,
                            .input_len = 700,
                            .target_len = 90,
                            .encoder_layers = decoder ? 0u : 2u,
                            .decoder_layers = decoder ? 2u : 0u,
                            .head = decoder};
    const double own = decoder ? stage.target_len : stage.input_len;
    double weight = 0, kept = 0, head = 0;
    for (const Linear& l : LayerLinears(t5, decoder)) {
      const double tokens = l.over_encoder_tokens ? stage.input_len : own;
      weight += 2 * l.in * l.out * tokens;
      kept += (l.in + l.out) * tokens - (l.over_encoder_tokens ? l.in * tokens : 0);
    }
    weight *= 2;  // two layers
    kept *= 2;
    if (decoder) {
      kept += t5.hidden * stage.input_len;  // the encoder output, once
      // The LM head's forward over the target tokens.
      head = 2.0 * t5.hidden * t5.vocab * own;
    }
    const double attention =
        2 * own * 4 * i * (decoder ? stage.target_len + stage.input_len : stage.input_len);
    SCOPED_TRACE(decoder ? "decoder stage" : "encoder stage");
    EXPECT_NEAR(rule.WeightGemmShare(stage), weight / (weight + attention + head), 1e-12);
    EXPECT_NEAR(rule.KeptBytes(stage), kept * stage.samples * 2, 1e-6 * kept);
    StageOpCost c{.forward_ms = 10, .backward_ms = 20};
    rule.Split(stage, &c);
    EXPECT_NEAR(c.weight_ms, 10 * weight / (weight + attention + head), 1e-9);
    EXPECT_NEAR(c.input_grad_ms(), 20 - c.weight_ms, 1e-9);
    EXPECT_DOUBLE_EQ(c.weight_stored_bytes, rule.KeptBytes(stage));
  }
  // GPT proportions: the share is 6h / (6h + s) and B keeps 16h values per
  // token and layer (Qi et al.'s 32 b s h bytes at 2-byte activations).
  const ModelDims gpt = Gpt67bDims();
  const StageLayers layer{.samples = 2, .input_len = 2048, .encoder_layers = 1};
  EXPECT_NEAR(BackwardSplitRule(gpt).WeightGemmShare(layer), 6.0 * 4096 / (6.0 * 4096 + 2048),
              1e-12);
  EXPECT_DOUBLE_EQ(BackwardSplitRule(gpt).KeptBytes(layer), 32.0 * 2 * 2048 * 4096);
  // W never exceeds half the backward.
  StageOpCost short_backward{.forward_ms = 10, .backward_ms = 8};
  BackwardSplitRule(gpt).Split({.samples = 1, .input_len = 16, .encoder_layers = 1},
                               &short_backward);
  EXPECT_DOUBLE_EQ(short_backward.weight_ms, 4);
}

// A LLAMA layer's linear layers (docs/models.md): q [h -> A], k and v
// [h -> K] (grouped-query), o [A -> h]; gate and up [h -> f], down [f -> h].
// q, k and v read one tensor, gate and up another: B keeps each input once.
// Grouped-query heads (K != A) and f off 4h so no shortcut passes.
TEST(ZeroBubbleSplit, FollowsTheLinearLayersOfALlamaLayer) {
  const ModelDims llama{.kind = ModelKind::kGpt,
                        .encoder_layers = 8,
                        .hidden = 1024,
                        .heads = 16,
                        .kv_channels = 96,
                        .ffn = 2816,
                        .vocab = 32000,
                        .dtype_bytes = 2,
                        .architecture = Architecture::kLlama,
                        .kv_heads = 4};
  const double h = 1024, A = 16 * 96, K = 4 * 96, f = 2816;
  const std::vector<Linear> linears = {{h, A}, {h, K}, {h, K}, {A, h}, {h, f}, {h, f}, {f, h}};
  const BackwardSplitRule rule(llama);
  for (const bool head : {false, true}) {
    SCOPED_TRACE(head ? "with the LM head" : "layers only");
    const StageLayers stage{.samples = 3, .input_len = 700, .encoder_layers = 2, .head = head};
    const double tokens = stage.input_len;
    double weight = 0, kept = 0, head_flops = 0;
    for (const Linear& l : linears) {
      weight += 2 * l.in * l.out * tokens;
      kept += (l.in + l.out) * tokens;
    }
    kept -= 3 * h * tokens;  // h was counted three times for q/k/v and twice for gate/up
    weight *= 2;             // two layers
    kept *= 2;
    if (head) head_flops = 2.0 * h * llama.vocab * tokens;  // B's; nothing kept for W
    const double attention = 2 * tokens * 4 * A * stage.input_len;
    EXPECT_NEAR(rule.WeightGemmShare(stage), weight / (weight + attention + head_flops), 1e-12);
    EXPECT_NEAR(rule.KeptBytes(stage), kept * stage.samples * 2, 1e-9 * kept);
  }
  // Grouped-query attention: K and V's GEMMs and gradients shrink.
  ModelDims mha = llama;
  mha.kv_heads = 16;
  const StageLayers layer{.samples = 1, .input_len = 512, .encoder_layers = 1};
  EXPECT_LT(BackwardSplitRule(llama).WeightGemmShare(layer),
            BackwardSplitRule(mha).WeightGemmShare(layer));
  EXPECT_DOUBLE_EQ(
      BackwardSplitRule(mha).KeptBytes(layer) - BackwardSplitRule(llama).KeptBytes(layer),
      2 * (A - K) * 512 * 2);
}

// A T5V11 layer's linear layers (docs/models.md, "The T5V11 layers"): q, k
// and v [h -> A] reading one normed input, o [A -> h]; gate and up [h -> f]
// reading another, down [f -> h]; decoder layers add xq [h -> A] and xo
// [A -> h] over the target tokens and xk, xv [h -> A] over the encoder
// tokens, whose input (the encoder output) the stage keeps once. No biases;
// the relative bias table's gradient is B's, as the norms'. Widths off
// every shortcut (A != h, f != 4h, f != 2.5h).
TEST(ZeroBubbleSplit, FollowsTheLinearLayersOfAT5V11Layer) {
  const ModelDims t5v11{.kind = ModelKind::kT5,
                        .encoder_layers = 6,
                        .decoder_layers = 6,
                        .hidden = 512,
                        .heads = 12,
                        .kv_channels = 96,
                        .ffn = 1400,
                        .vocab = 32128,
                        .dtype_bytes = 2,
                        .architecture = Architecture::kT5V11,
                        .relative_attention_buckets = 32};
  const double h = 512, A = 12 * 96, f = 1400;
  const BackwardSplitRule rule(t5v11);
  for (const bool decoder : {false, true}) {
    SCOPED_TRACE(decoder ? "decoder stage" : "encoder stage");
    const StageLayers stage{.samples = 3,
                            .input_len = 700,
                            .target_len = 90,
                            .encoder_layers = decoder ? 0u : 2u,
                            .decoder_layers = decoder ? 2u : 0u,
                            .head = decoder};
    const double own = decoder ? stage.target_len : stage.input_len;
    const double enc = stage.input_len;
    std::vector<Linear> linears = {{h, A}, {h, A}, {h, A}, {A, h}, {h, f}, {h, f}, {f, h}};
    if (decoder) {
      linears.push_back({h, A});        // xq
      linears.push_back({h, A, true});  // xk
      linears.push_back({h, A, true});  // xv
      linears.push_back({A, h});        // xo
    }
    double weight = 0, kept = 0, head = 0;
    for (const Linear& l : linears) {
      const double tokens = l.over_encoder_tokens ? enc : own;
      weight += 2 * l.in * l.out * tokens;
      // xk and xv keep their output gradients; their input is the stage's.
      kept += l.over_encoder_tokens ? l.out * tokens : (l.in + l.out) * tokens;
    }
    kept -= 3 * h * own;  // one input for q, k and v (counted three times), one for gate and up
    weight *= 2;          // two layers
    kept *= 2;
    if (decoder) {
      kept += h * enc;                     // the encoder output, once
      head = 2.0 * h * t5v11.vocab * own;  // the LM head's forward: B's
    }
    const double attention = 2 * own * 4 * A * (decoder ? stage.target_len + enc : enc);
    EXPECT_NEAR(rule.WeightGemmShare(stage), weight / (weight + attention + head), 1e-12);
    EXPECT_NEAR(rule.KeptBytes(stage), kept * stage.samples * 2, 1e-9 * kept);
  }
  // The MLP's third matrix: against a MEGATRON layer of the same widths, W
  // gains 2hf FLOPs and B keeps f more values per token.
  ModelDims megatron = t5v11;
  megatron.architecture = Architecture::kMegatron;
  const StageLayers layer{.samples = 1, .input_len = 512, .encoder_layers = 1};
  EXPECT_GT(rule.WeightGemmShare(layer), BackwardSplitRule(megatron).WeightGemmShare(layer));
  EXPECT_DOUBLE_EQ(rule.KeptBytes(layer) - BackwardSplitRule(megatron).KeptBytes(layer),
                   f * 512 * 2);
}

// One device, one stage: F0 F1 B0 W0 B1 W1 with hand-computed times and
// memory (stored 100, transient 50, W keeps 40).
TEST(ZeroBubbleSimulator, TimesAndFreesSplitBackwards) {
  const PipelineShape shape{1, 1, 2};
  StageCostTable costs(1, std::vector<StageOpCost>(2));
  for (StageOpCost& c : costs[0]) {
    c = {.forward_ms = 1,
         .backward_ms = 3,
         .stored_bytes = 100,
         .peak_bytes = 150,
         .weight_ms = 1.25,
         .weight_stored_bytes = 40};
  }
  const DeviceOrder split = {{{OpKind::kForward, 0, 0},
                              {OpKind::kForward, 0, 1},
                              {OpKind::kBackward, 0, 0},
                              {OpKind::kForward, 0, 0}}};
  EXPECT_THAT(CheckScheduleCoverage(shape, split), HasSubstr("0F0 runs more than once"));
  const DeviceOrder order = {{{OpKind::kForward, 0, 0},
                              {OpKind::kForward, 0, 1},
                              {OpKind::kBackward, 0, 0},
                              {OpKind::kWeight, 0, 0},
                              {OpKind::kBackward, 0, 1}}};
  EXPECT_EQ(CheckScheduleCoverage(shape, order), "");
  const SimulationResult r = Simulate(shape, order, costs, ClusterNetwork{});
  ASSERT_TRUE(r.completed) << r.deadlock;
  // F 1 + F 1 + B 1.75 + W 1.25 + whole B 3.
  EXPECT_DOUBLE_EQ(r.makespan_ms, 8);
  // Peak: during B0, 200 stored + 50 transient.
  EXPECT_DOUBLE_EQ(r.peak_bytes[0], 250);
  EXPECT_EQ(r.ops[3].op.kind, OpKind::kWeight);
  EXPECT_DOUBLE_EQ(r.ops[3].end_ms - r.ops[3].start_ms, 1.25);

  // W deferred past a forward: F0 B0 F1 B1 W0 W1 holds 40 + 100 during F1.
  const DeviceOrder deferred = {{{OpKind::kForward, 0, 0},
                                 {OpKind::kBackward, 0, 0},
                                 {OpKind::kForward, 0, 1},
                                 {OpKind::kBackward, 0, 1},
                                 {OpKind::kWeight, 0, 0},
                                 {OpKind::kWeight, 0, 1}}};
  const SimulationResult d = Simulate(shape, deferred, costs, ClusterNetwork{});
  ASSERT_TRUE(d.completed);
  EXPECT_DOUBLE_EQ(d.peak_bytes[0], 40 + 150);
  EXPECT_EQ(d.peak_in_flight[0], 2u);  // micro-batch 0 is held until its W
  // A W before its B deadlocks, named.
  const DeviceOrder early = {{{OpKind::kForward, 0, 0},
                              {OpKind::kWeight, 0, 0},
                              {OpKind::kBackward, 0, 0},
                              {OpKind::kForward, 0, 1},
                              {OpKind::kBackward, 0, 1}}};
  const SimulationResult e = Simulate(shape, early, costs, ClusterNetwork{});
  EXPECT_FALSE(e.completed);
  EXPECT_THAT(e.deadlock, HasSubstr("waits at 0W0"));
  EXPECT_THAT(ChromeTraceJson(d, "zb", 0), HasSubstr("\"W mb0 s0\""));
}

StageCostTable UniformSplit(const PipelineShape& shape, double f, double b, double w) {
  StageCostTable costs(shape.stages(), std::vector<StageOpCost>(shape.micro_batches));
  for (auto& stage : costs) {
    for (StageOpCost& c : stage) {
      c = {.forward_ms = f,
           .backward_ms = b + w,
           .stored_bytes = 100,
           .peak_bytes = 120,
           .weight_ms = w,
           .weight_stored_bytes = 94};
    }
  }
  return costs;
}

// ZB-H1 on equal micro-batches without communication: the closed form
// m (F + B + W) + (p - 1)(F + B - W), 1F1B's peak memory, and coverage.
TEST(ZeroBubbleH1, MatchesTheClosedFormOverAGrid) {
  for (uint32_t p = 1; p <= 8; ++p) {
    for (uint32_t m = 1; m <= 3 * p + 2; ++m) {
      const PipelineShape shape{p, 1, m};
      absl::StatusOr<DeviceOrder> zb = ZeroBubbleH1Schedule(shape);
      ASSERT_THAT(zb, IsOk());
      ASSERT_EQ(CheckScheduleCoverage(shape, *zb), "") << "p " << p << " m " << m;
      for (const auto& [f, b, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 1.2, 0.9}}) {
        const StageCostTable costs = UniformSplit(shape, f, b, w);
        const SimulationResult r = Simulate(shape, *zb, costs, ClusterNetwork{});
        ASSERT_TRUE(r.completed) << r.deadlock << "\n" << FormatDeviceOrder(*zb);
        const SimulationResult ofob =
            Simulate(shape, *OneFOneBSchedule(shape), costs, ClusterNetwork{});
        EXPECT_LE(r.MaxPeakBytes(), ofob.MaxPeakBytes() + 1e-9) << "p " << p << " m " << m;
        if (m >= p) {
          EXPECT_NEAR(r.makespan_ms, m * (f + b + w) + (p - 1) * (f + b - w), 1e-9)
              << "p " << p << " m " << m << "\n"
              << FormatDeviceOrder(*zb);
        }
      }
    }
  }
}

// Megatron's bubble fraction (Narayanan et al. 2021): idle time over
// compute time, mean over devices; (p - 1) / m for 1F1B on equal stages.
double IdleOverBusy(const SimulationResult& r) {
  double sum = 0;
  for (double busy : r.busy_ms) sum += (r.makespan_ms - busy) / busy;
  return sum / r.busy_ms.size();
}

// Uniform micro-batches and stages on the analytic A100-40GB model
// (GPT-6.7B-like transformer layers, 2 x 1024 tokens per micro-batch, the
// layers-only stage's costs on every stage as the closed form assumes,
// NVLink-like link): ZB-H1's bubble fraction at most 0.4x 1F1B's at the
// same peak memory, m = 2p, p = 4 and 8. The closed form's ratio is
// (F + B - W) / (F + B + W).
TEST(ZeroBubbleH1, BubbleFractionAgainstOneFOneBOnTheA100Model) {
  const ModelDims dims = Gpt67bDims();
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(dims, *hw, {.max_micro_batch_size = 4, .max_seq_len = 1024});
  ASSERT_THAT(model, IsOk());
  for (uint32_t p : {4u, 8u}) {
    absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, p, 1);
    ASSERT_THAT(layout, IsOk());
    absl::StatusOr<MicroBatchCostModel> cost =
        MicroBatchCostModel::Create(*model, *layout, Recompute::kNone, 1);
    ASSERT_THAT(cost, IsOk());
    std::vector<StageOpCost> stages;
    ASSERT_TRUE(cost->EvaluateStages(2, 1024, 0, 1, dims.hidden, dims.dtype_bytes, &stages));
    const StageOpCost& layers = stages[1];  // no embedding, no LM head
    StageOpCost c{layers.forward_ms, layers.backward_ms,      layers.stored_bytes,
                  layers.peak_bytes, layers.activation_bytes, layers.gradient_bytes};
    BackwardSplitRule(dims).Split(
        {.samples = 2, .input_len = 1024, .encoder_layers = dims.encoder_layers / p}, &c);
    const PipelineShape shape{p, 1, 2 * p};
    const StageCostTable costs(p, std::vector<StageOpCost>(shape.micro_batches, c));
    const ClusterNetwork nvlink{.intra_node = {.latency_ms = 0.005, .bytes_per_ms = 150e6},
                                .inter_node = {}};
    const SimulationResult ofob = Simulate(shape, *OneFOneBSchedule(shape), costs, nvlink);
    const SimulationResult zb = Simulate(shape, *ZeroBubbleH1Schedule(shape), costs, nvlink);
    ASSERT_TRUE(ofob.completed && zb.completed);
    const double ratio = IdleOverBusy(zb) / IdleOverBusy(ofob);
    const double closed =
        (c.forward_ms + c.input_grad_ms() - c.weight_ms) / (c.forward_ms + c.backward_ms);
    std::printf(
        "p %u m %u: F %.2f B %.2f W %.2f ms; bubble (idle/busy) 1F1B %.4f, ZB-H1 %.4f: %.3fx "
        "(closed form %.3fx); 1 - busy/makespan %.4f / %.4f; makespan %.1f / %.1f ms; peak "
        "%.0f / %.0f MiB\n",
        p, shape.micro_batches, c.forward_ms, c.input_grad_ms(), c.weight_ms, IdleOverBusy(ofob),
        IdleOverBusy(zb), ratio, closed, ofob.MeanBubbleFraction(), zb.MeanBubbleFraction(),
        ofob.makespan_ms, zb.makespan_ms, ofob.MaxPeakBytes() / (1 << 20),
        zb.MaxPeakBytes() / (1 << 20));
    EXPECT_NEAR(ratio, closed, 0.02) << "p " << p;
    EXPECT_LE(ratio, 0.4) << "p " << p;
    EXPECT_LE(zb.MaxPeakBytes(), ofob.MaxPeakBytes() * (1 + 1e-12)) << "p " << p;
  }
}

// Per micro-batch time factors (same on every stage), stored bytes
// proportional to time; W a third of the backward.
StageCostTable Uneven(uint32_t stages, const std::vector<double>& factor) {
  StageCostTable costs(stages, std::vector<StageOpCost>(factor.size()));
  for (auto& stage : costs) {
    for (size_t m = 0; m < factor.size(); ++m) {
      stage[m] = {.forward_ms = 1.0 * factor[m],
                  .backward_ms = 2.0 * factor[m],
                  .stored_bytes = 100 * factor[m],
                  .peak_bytes = 130 * factor[m],
                  .activation_bytes = 0,
                  .gradient_bytes = 0,
                  .weight_ms = 0.9 * factor[m],
                  .weight_stored_bytes = 100 * 32.0 / 34 * factor[m]};
    }
  }
  return costs;
}

// The adaptive zero-bubble schedule over random uneven micro-batches and
// memory limits: every op once, each W after its B, within every limit the
// adaptive schedule meets; on average shorter than the adaptive schedule.
TEST(AdaptiveZeroBubble, KeepsMemoryAndShortensTheIteration) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("AdaptiveZeroBubble.KeepsMemoryAndShortensTheIteration"));
  std::uniform_real_distribution<double> f(0.2, 3.0);
  double adaptive_sum = 0;
  double zb_sum = 0;
  int trials = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const uint32_t c = 2 + rng() % 7;
    const uint32_t m = c + rng() % 24;
    std::vector<double> factor(m);
    for (double& x : factor) x = f(rng);
    const StageCostTable costs = Uneven(c, factor);
    const double limit = 130 * 3.0 * (1 + rng() % 6);
    const PipelineShape shape{c, 1, m};
    const ClusterNetwork net{.intra_node = {.latency_ms = 0.01, .bytes_per_ms = 0},
                             .inter_node = {}};
    absl::StatusOr<AdaptiveSearchResult> adaptive =
        SearchAdaptiveOrder(shape, costs, factor, limit, net);
    absl::StatusOr<AdaptiveSearchResult> zb =
        SearchAdaptiveOrder(shape, costs, factor, limit, net, /*zero_bubble=*/true);
    ASSERT_THAT(adaptive, IsOk());
    ASSERT_THAT(zb, IsOk());
    ASSERT_EQ(CheckScheduleCoverage(shape, zb->order), "");
    size_t weights = 0;
    for (const auto& ops : zb->order) {
      weights += std::count_if(ops.begin(), ops.end(),
                               [](const Op& op) { return op.kind == OpKind::kWeight; });
    }
    EXPECT_EQ(weights, static_cast<size_t>(c) * m);
    if (adaptive->fits_memory) {
      EXPECT_TRUE(zb->fits_memory) << "trial " << trial;
      EXPECT_LE(zb->simulation.MaxPeakBytes(), limit) << "trial " << trial;
    }
    adaptive_sum += adaptive->simulation.makespan_ms;
    zb_sum += zb->simulation.makespan_ms;
    ++trials;
  }
  std::printf("%d trials: mean makespan adaptive %.2f, adaptive zero-bubble %.2f (%.3fx)\n", trials,
              adaptive_sum / trials, zb_sum / trials, zb_sum / adaptive_sum);
  EXPECT_LT(zb_sum, 0.95 * adaptive_sum);
}

// The order search's give-up rule (simulator.h, weight_fill.h) over random
// uneven micro-batches with transfer times: the fill's own timeline is the
// simulator's timeline of its order, so a limit at the simulated makespan
// gives the same order, and one just below it gives up; the simulation
// completes at its makespan and gives up just below it.
TEST(AdaptiveZeroBubble, GivesUpExactlyAboveTheMakespan) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("AdaptiveZeroBubble.GivesUpExactlyAboveTheMakespan"));
  std::uniform_real_distribution<double> f(0.2, 3.0);
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t c = 2 + rng() % 7;
    const uint32_t m = c + rng() % 24;
    std::vector<double> factor(m);
    for (double& x : factor) x = f(rng);
    StageCostTable costs = Uneven(c, factor);
    for (auto& stage : costs) {
      for (StageOpCost& op : stage) op.activation_bytes = op.gradient_bytes = 50 * op.forward_ms;
    }
    const std::vector<double> limits(c, 130 * 3.0 * (1 + rng() % 6));
    const PipelineShape shape{c, 1, m};
    const ClusterNetwork net{.intra_node = {.latency_ms = 0.01, .bytes_per_ms = 100},
                             .inter_node = {}};
    std::vector<uint32_t> injection(m);
    std::iota(injection.begin(), injection.end(), 0u);
    absl::StatusOr<DeviceOrder> adaptive = AdaptiveSchedule(shape, costs, injection, limits);
    ASSERT_THAT(adaptive, IsOk());
    absl::StatusOr<DeviceOrder> filled = FillWeightGradients(shape, *adaptive, costs, net, limits);
    ASSERT_THAT(filled, IsOk());
    const SimulationResult sim = Simulate(shape, *filled, costs, net);
    ASSERT_TRUE(sim.completed);
    const double makespan = sim.makespan_ms;
    absl::StatusOr<std::optional<DeviceOrder>> within =
        FillWeightGradientsWithin(shape, *adaptive, costs, net, limits, makespan);
    ASSERT_THAT(within, IsOk());
    ASSERT_TRUE(within->has_value()) << "trial " << trial;
    EXPECT_EQ(**within, *filled) << "trial " << trial;
    absl::StatusOr<std::optional<DeviceOrder>> below =
        FillWeightGradientsWithin(shape, *adaptive, costs, net, limits, makespan * 0.999);
    ASSERT_THAT(below, IsOk());
    EXPECT_FALSE(below->has_value()) << "trial " << trial;
    const SimulationResult at = Simulate(shape, *filled, costs, net, makespan);
    EXPECT_TRUE(at.completed && !at.exceeded) << "trial " << trial;
    EXPECT_EQ(at.makespan_ms, makespan);
    EXPECT_TRUE(Simulate(shape, *filled, costs, net, makespan * 0.999).exceeded)
        << "trial " << trial;
  }
}

TEST(AdaptiveZeroBubble, RefusesAnOrderWithWeights) {
  const PipelineShape shape{2, 1, 2};
  const StageCostTable costs = Uneven(2, {1, 1});
  absl::StatusOr<DeviceOrder> zb = ZeroBubbleH1Schedule(shape);
  ASSERT_THAT(zb, IsOk());
  const std::vector<double> limits(2, 1e9);
  EXPECT_FALSE(FillWeightGradients(shape, *zb, costs, ClusterNetwork{}, limits).ok());
}

}  // namespace
}  // namespace varipipe::planner
