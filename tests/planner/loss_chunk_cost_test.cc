// The LM head's token chunk as a job setting (training.loss_chunk_tokens,
// common/loss_head_chunk.h): the head holds one chunk's logits at a time,
// so its transient is HeadChunkTransientBytes of min(n, chunk) tokens. The
// analytic model prices the chunk of its dims; the micro-batch cost model
// prices a job's chunk on a grid measured with the default one (a profile)
// exactly as on a grid built for the job's chunk; a smaller chunk predicts
// a smaller head transient and nothing else changes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>

#include "common/loss_head_chunk.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/cost/model_dims.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::varipipe::testing::IsOk;

Hardware A100() {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  EXPECT_THAT(hw, IsOk());
  return *hw;
}

double Transient(const CostValues& v) { return v.peak_bytes - v.stored_bytes; }

TEST(LossChunkCost, ModelDimsFromJobReadsTheTrainingSetting) {
  v1::JobConfig config;
  *config.mutable_model() = varipipe::testing::Gpt67bConfig();
  EXPECT_EQ(ModelDimsFromJob(config).loss_chunk_tokens, 0u);
  config.mutable_training()->set_loss_chunk_tokens(512);
  const ModelDims dims = ModelDimsFromJob(config);
  EXPECT_EQ(dims.loss_chunk_tokens, 512u);
  EXPECT_EQ(dims.hidden, ModelDimsFromConfig(config.model()).hidden);
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, 2, 1);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->loss_chunk_tokens, 512u);
}

TEST(LossChunkCost, TheAnalyticHeadHoldsOneChunkOfLogits) {
  ModelDims d = varipipe::testing::Gpt67bDims();
  const TensorLink link{.gbps = 300};
  for (uint32_t tp : {1u, 2u}) {
    d.loss_chunk_tokens = 0;
    const double default_chunk = HeadLossChunkTokens(d, tp);
    // 256 MiB of fp32 logits over the rank's ceil(V / t) rows.
    EXPECT_EQ(default_chunk, DefaultLossChunkTokens((d.vocab + tp - 1) / tp));
    EXPECT_GT(default_chunk, 1024);
    const CostValues by_default = AnalyticHeadCost(d, A100(), tp, 4, 1024, 4096, link);
    d.loss_chunk_tokens = 256;
    EXPECT_EQ(HeadLossChunkTokens(d, tp), 256);
    const CostValues small = AnalyticHeadCost(d, A100(), tp, 4, 1024, 4096, link);
    EXPECT_DOUBLE_EQ(Transient(by_default), HeadChunkTransientBytes(d, tp, default_chunk));
    EXPECT_DOUBLE_EQ(Transient(small), HeadChunkTransientBytes(d, tp, 256));
    EXPECT_LT(Transient(small), Transient(by_default) / 4);
    EXPECT_DOUBLE_EQ(small.stored_bytes, by_default.stored_bytes);
    EXPECT_DOUBLE_EQ(small.forward_ms, by_default.forward_ms);
    // Fewer labelled tokens than the chunk: one chunk of all of them.
    const CostValues few = AnalyticHeadCost(d, A100(), tp, 4, 1024, 100, link);
    EXPECT_DOUBLE_EQ(Transient(few), HeadChunkTransientBytes(d, tp, 100));
  }
}

// A grid made with the default chunk (as varipipe-profile measures it)
// under a layout carrying the job's chunk prices what a grid made for that
// chunk prices, at every labelled count; kLeastHead stays below both.
TEST(LossChunkCost, AJobsChunkOnADefaultGridPricesAsTheJobsGrid) {
  std::mt19937_64 rng(
      varipipe::testing::TestSeed("LossChunkCost.AJobsChunkOnADefaultGridPricesAsTheJobsGrid"));
  for (const uint32_t chunk : {64u, 700u, 5000u}) {
    ModelDims grid_dims = varipipe::testing::Gpt67bDims();
    grid_dims.encoder_layers = 4;
    ModelDims job_dims = grid_dims;
    job_dims.loss_chunk_tokens = chunk;
    AnalyticGridOptions options;
    options.max_micro_batch_size = 16;
    absl::StatusOr<CostModel> profile_like = BuildAnalyticCostModel(grid_dims, A100(), options);
    absl::StatusOr<CostModel> for_job = BuildAnalyticCostModel(job_dims, A100(), options);
    ASSERT_THAT(profile_like, IsOk());
    ASSERT_THAT(for_job, IsOk());
    for (const uint32_t devices : {1u, 2u}) {
      absl::StatusOr<StageLayout> layout = MakeStageLayout(job_dims, devices, 1);
      absl::StatusOr<StageLayout> default_layout = MakeStageLayout(grid_dims, devices, 1);
      ASSERT_THAT(layout, IsOk());
      ASSERT_THAT(default_layout, IsOk());
      absl::StatusOr<MicroBatchCostModel> adjusted =
          MicroBatchCostModel::Create(*profile_like, *layout, Recompute::kNone, 1);
      absl::StatusOr<MicroBatchCostModel> direct =
          MicroBatchCostModel::Create(*for_job, *layout, Recompute::kNone, 1);
      absl::StatusOr<MicroBatchCostModel> by_default =
          MicroBatchCostModel::Create(*profile_like, *default_layout, Recompute::kNone, 1);
      ASSERT_THAT(adjusted, IsOk());
      ASSERT_THAT(direct, IsOk());
      ASSERT_THAT(by_default, IsOk());
      for (int round = 0; round < 40; ++round) {
        // Grid points (b and n / b on the grid's axes), where both grids
        // are exact: between them each interpolates linearly, and the
        // job's grid across its kink at n = chunk.
        const uint32_t b = 1u << std::uniform_int_distribution<uint32_t>(0, 4)(rng);
        const uint32_t log_s = std::uniform_int_distribution<uint32_t>(6, 11)(rng);
        const uint32_t s = 1u << log_s;
        const double n =
            round % 4 == 0
                ? MicroBatchCostModel::kEveryPosition
                : static_cast<double>(b) *
                      (1u << std::uniform_int_distribution<uint32_t>(3, log_s)(rng));
        MicroBatchCost a, want, dflt, least;
        ASSERT_TRUE(adjusted->Evaluate(b, s, 0, nullptr, n, &a));
        ASSERT_TRUE(direct->Evaluate(b, s, 0, nullptr, n, &want));
        ASSERT_TRUE(by_default->Evaluate(b, s, 0, nullptr, n, &dflt));
        ASSERT_TRUE(adjusted->Evaluate(b, s, 0, nullptr, MicroBatchCostModel::kLeastHead, &least));
        EXPECT_NEAR(a.peak_bytes, want.peak_bytes, 1e-6 * want.peak_bytes)
            << "chunk " << chunk << " devices " << devices << " b " << b << " s " << s << " n "
            << n;
        EXPECT_DOUBLE_EQ(a.stored_bytes, want.stored_bytes);
        EXPECT_DOUBLE_EQ(a.time_ms, want.time_ms);
        EXPECT_LE(least.peak_bytes, a.peak_bytes * (1 + 1e-12));
        // A chunk below the default never predicts more; above, never less.
        if (chunk < HeadLossChunkTokens(grid_dims, 1)) {
          EXPECT_LE(a.peak_bytes, dflt.peak_bytes * (1 + 1e-12));
        } else {
          EXPECT_GE(a.peak_bytes, dflt.peak_bytes * (1 - 1e-12));
        }
      }
    }
  }
}

// On a device whose peak is the head's (one device, the head's logits
// larger than a layer's transient), a small chunk shrinks the predicted
// peak by exactly the logits it no longer holds.
TEST(LossChunkCost, ASmallChunkShrinksTheHeadsPeak) {
  // A narrow model with GPT-2's vocabulary and the fused kernel: the
  // layer's transient is far below the head's logits.
  ModelDims dims = varipipe::testing::Gpt67bDims();
  dims.encoder_layers = 1;
  dims.hidden = 128;
  dims.heads = 2;
  dims.kv_heads = 2;
  dims.kv_channels = 64;
  dims.ffn = 512;
  dims.attention_kernel = AttentionKernel::kFused;
  AnalyticGridOptions options;
  options.max_micro_batch_size = 16;
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(dims, A100(), options);
  ASSERT_THAT(model, IsOk());
  ModelDims job = dims;
  job.loss_chunk_tokens = 128;
  absl::StatusOr<StageLayout> small_layout = MakeStageLayout(job, 1, 1);
  absl::StatusOr<StageLayout> default_layout = MakeStageLayout(dims, 1, 1);
  ASSERT_THAT(small_layout, IsOk());
  ASSERT_THAT(default_layout, IsOk());
  absl::StatusOr<MicroBatchCostModel> small =
      MicroBatchCostModel::Create(*model, *small_layout, Recompute::kFull, 1);
  absl::StatusOr<MicroBatchCostModel> by_default =
      MicroBatchCostModel::Create(*model, *default_layout, Recompute::kFull, 1);
  ASSERT_THAT(small, IsOk());
  ASSERT_THAT(by_default, IsOk());
  MicroBatchCost a, b;
  ASSERT_TRUE(small->Evaluate(8, 512, 0, nullptr, 4000, &a));
  ASSERT_TRUE(by_default->Evaluate(8, 512, 0, nullptr, 4000, &b));
  std::printf("head transient at 4,000 labelled tokens: chunk 128 %.1f MiB, default (%g) %.1f MiB\n",
              a.transient_bytes / (1 << 20), HeadLossChunkTokens(dims, 1),
              b.transient_bytes / (1 << 20));
  EXPECT_LT(a.peak_bytes, b.peak_bytes);
  EXPECT_DOUBLE_EQ(a.stored_bytes, b.stored_bytes);
  EXPECT_NEAR(b.peak_bytes - a.peak_bytes,
              HeadChunkTransientBytes(dims, 1, HeadLossChunkTokens(dims, 1) - 128),
              1e-6 * b.peak_bytes);
}

}  // namespace
}  // namespace varipipe::planner
