// Variable-length attention over packed rows (variable_length_attention.h):
// the layout built from segment ids (offsets, gathers, refusals), the
// autograd path around the kernel against PerSampleAttention in values and
// gradients (causal, full and cross-attention, padding, rows whose two sides
// order their samples differently), and whole packed stages of every
// architecture in every recompute mode with the variable-length path against
// the per-sample one. On CPUs the kernel is the reference one; on a GPU the
// flash kernel is also checked against it (skipped without one).
#include "executor/model/variable_length_attention.h"

#include <array>
#include <atomic>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/model/attention_mask.h"
#include "executor/model/model_stage.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::executor {
namespace {

constexpr int64_t kHeads = 2;
constexpr int64_t kHeadDim = 8;
constexpr int64_t kWidth = kHeads * kHeadDim;

// Rows of back-to-back samples of the given lengths, padded to `padded`:
// each position's sample (-1 for padding), as StageBatch's segments. Sample
// ids are `ids` when given (a row's samples in another order), else 0, 1, ...
torch::Tensor Segments(const std::vector<std::vector<int64_t>>& rows, int64_t padded,
                       const std::vector<std::vector<int64_t>>& ids = {}) {
  torch::Tensor segments = torch::full({static_cast<int64_t>(rows.size()), padded}, -1,
                                       torch::TensorOptions().dtype(torch::kInt64));
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t position = 0;
    for (size_t s = 0; s < rows[r].size(); ++s) {
      segments.index_put_(
          {static_cast<int64_t>(r), torch::indexing::Slice(position, position + rows[r][s])},
          ids.empty() ? static_cast<int64_t>(s) : ids[r][s]);
      position += rows[r][s];
    }
  }
  return segments;
}

// Each position's place in its sample.
torch::Tensor Positions(const std::vector<std::vector<int64_t>>& rows, int64_t padded) {
  torch::Tensor positions = torch::zeros({static_cast<int64_t>(rows.size()), padded}, torch::kInt64);
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t at = 0;
    for (int64_t length : rows[r]) {
      for (int64_t i = 0; i < length; ++i) positions[static_cast<int64_t>(r)][at++] = i;
    }
  }
  return positions;
}

TEST(VariableLengthLayout, OffsetsSamplesAndGathersFollowTheSegments) {
  // Row 0: samples of 3 and 2 then 1 padding; row 1: one of 6.
  const torch::Tensor segments = Segments({{3, 2}, {6}}, 6);
  const auto layout = VariableLengthLayout::FromSegments(segments, segments, /*causal=*/true);
  EXPECT_EQ(layout->query_offsets(), (std::vector<int64_t>{0, 3, 5, 11}));
  EXPECT_EQ(layout->key_offsets(), (std::vector<int64_t>{0, 3, 5, 11}));
  EXPECT_EQ(layout->max_query_length(), 6);
  ASSERT_EQ(layout->samples().size(), 3u);
  EXPECT_EQ(layout->samples()[2].row, 1);
  const VariableLengthLayout::DeviceTensors& device = layout->OnDevice(torch::kCPU);
  EXPECT_EQ(device.query_offsets.scalar_type(), torch::kInt32);
  ASSERT_TRUE(device.query_index.defined());
  EXPECT_TRUE(torch::equal(device.query_index,
                           torch::tensor({0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11}, torch::kInt64)));
  // Without padding every position is a token, in order: no gather.
  const torch::Tensor full = Segments({{2, 4}, {6}}, 6);
  const auto dense = VariableLengthLayout::FromSegments(full, full, /*causal=*/false);
  EXPECT_FALSE(dense->OnDevice(torch::kCPU).query_index.defined());
  EXPECT_FALSE(dense->OnDevice(torch::kCPU).key_index.defined());
}

TEST(VariableLengthLayout, KeysFollowTheQueriesSampleOrder) {
  // T5 cross-attention whose key rows hold the samples in the other order.
  const torch::Tensor queries = Segments({{2, 1}}, 4);
  const torch::Tensor keys = Segments({{3, 2}}, 5, {{1, 0}});
  const auto layout = VariableLengthLayout::FromSegments(queries, keys, /*causal=*/false);
  ASSERT_EQ(layout->samples().size(), 2u);
  EXPECT_EQ(layout->samples()[0].key_begin, 3);  // sample 0's keys come second
  EXPECT_EQ(layout->samples()[0].key_length, 2);
  EXPECT_TRUE(torch::equal(layout->OnDevice(torch::kCPU).key_index,
                           torch::tensor({3, 4, 0, 1, 2}, torch::kInt64)));
}

TEST(VariableLengthLayout, RefusesWhatTheKernelsCannotRun) {
  const torch::Tensor split = torch::tensor({0, 0, 1, 0, -1}, torch::kInt64).unsqueeze(0);
  EXPECT_THROW(VariableLengthLayout::FromSegments(split, split, true), c10::Error);
  const torch::Tensor gap = torch::tensor({0, 0, -1, 1, -1}, torch::kInt64).unsqueeze(0);
  EXPECT_THROW(VariableLengthLayout::FromSegments(gap, gap, true), c10::Error);
  // Causal attention needs as many keys as queries per sample.
  EXPECT_THROW(
      VariableLengthLayout::FromSegments(Segments({{2}}, 3), Segments({{3}}, 3), /*causal=*/true),
      c10::Error);
  // A sample with queries but no keys.
  EXPECT_THROW(VariableLengthLayout::FromSegments(Segments({{2, 1}}, 3), Segments({{3}}, 3),
                                                  /*causal=*/false),
               c10::Error);
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

// Outputs at real queries and the gradients of a loss over them, through
// the variable-length path (`kernel`) or PerSampleAttention.
Result Attend(const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0,
              const c10::intrusive_ptr<VariableLengthLayout>& layout,
              const torch::Tensor& real_queries, const VariableLengthKernel* kernel) {
  torch::Tensor q = q0.clone().requires_grad_(true);
  torch::Tensor k = k0.clone().requires_grad_(true);
  torch::Tensor v = v0.clone().requires_grad_(true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  const torch::Tensor out =
      kernel != nullptr
          ? VariableLengthAttention(q, k, v, layout, kHeads, scale, *kernel)
          : PerSampleAttention(q, k, v, *layout, {},
                               [](const torch::Tensor& cq, const torch::Tensor& ck,
                                  const torch::Tensor& cv, const AttentionInput& input) {
                                 return MaskedAttention(
                                     cq, ck, cv, input.is_causal() ? torch::Tensor() : input.mask(),
                                     kHeads);
                               });
  const torch::Tensor real = out * real_queries.unsqueeze(-1).to(out.dtype());
  const torch::Tensor weights =
      torch::sin(torch::arange(real.numel(), torch::kFloat32).reshape(real.sizes()))
          .to(real.device());
  (real.to(torch::kFloat32) * weights).sum().backward();
  return {real.detach(), q.grad(), k.grad(), v.grad()};
}

void ExpectClose(const Result& a, const Result& b, double tolerance, const std::string& what) {
  const auto diff = [](const torch::Tensor& x, const torch::Tensor& y) {
    return (x.to(torch::kFloat32).cpu() - y.to(torch::kFloat32).cpu()).abs().max().item<double>();
  };
  EXPECT_LE(diff(a.out, b.out), tolerance) << what << " outputs";
  EXPECT_LE(diff(a.dq, b.dq), tolerance) << what << " dq";
  EXPECT_LE(diff(a.dk, b.dk), tolerance) << what << " dk";
  EXPECT_LE(diff(a.dv, b.dv), tolerance) << what << " dv";
}

// Random rows of 1-4 samples each (lengths 1-6), some padded.
std::vector<std::vector<int64_t>> RandomRows(std::mt19937& rng, int rows, int64_t max_total) {
  std::vector<std::vector<int64_t>> out(rows);
  for (auto& row : out) {
    int64_t used = 0;
    const int samples = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < samples; ++s) {
      const int64_t length = 1 + static_cast<int64_t>(rng() % 6);
      if (used + length > max_total) break;
      row.push_back(length);
      used += length;
    }
    if (row.empty()) row.push_back(1);
  }
  return out;
}

TEST(VariableLengthAttention, ReferenceKernelMatchesPerSampleAttention) {
  const uint32_t seed =
      varipipe::testing::TestSeed("VariableLengthAttention.ReferenceKernelMatchesPerSample");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  const VariableLengthKernel& reference = ReferenceVariableLengthKernel();
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const std::vector<std::vector<int64_t>> inputs = RandomRows(rng, 3, 24);
    const torch::Tensor in_segments = Segments(inputs, 24);
    const torch::Tensor real = (in_segments >= 0).to(torch::kFloat32);
    const torch::Tensor q = torch::randn({3, 24, kWidth});
    const torch::Tensor k = torch::randn({3, 24, kWidth});
    const torch::Tensor v = torch::randn({3, 24, kWidth});
    for (bool causal : {true, false}) {
      const auto layout = VariableLengthLayout::FromSegments(in_segments, in_segments, causal);
      ExpectClose(Attend(q, k, v, layout, real, &reference),
                  Attend(q, k, v, layout, real, nullptr), 1e-5,
                  causal ? "causal self-attention" : "self-attention");
    }
    // Cross-attention: each sample's 1-2 targets over its own inputs.
    std::vector<std::vector<int64_t>> targets;
    for (const auto& row : inputs) {
      targets.emplace_back();
      for (size_t s = 0; s < row.size(); ++s) targets.back().push_back(1 + (rng() % 2));
    }
    const torch::Tensor out_segments = Segments(targets, 10);
    const auto cross = VariableLengthLayout::FromSegments(out_segments, in_segments, false);
    const torch::Tensor dq = torch::randn({3, 10, kWidth});
    ExpectClose(Attend(dq, k, v, cross, (out_segments >= 0).to(torch::kFloat32), &reference),
                Attend(dq, k, v, cross, (out_segments >= 0).to(torch::kFloat32), nullptr), 1e-5,
                "cross-attention");
  }
}

// A packed stage's loss and gradients through the variable-length path
// (reference kernel) and through PerSampleAttention, and how many kernel
// calls (forward and backward) the variable-length path made.
struct StageRun {
  double loss = 0;
  std::vector<torch::Tensor> grads;
  int calls = 0;
};

// The reference kernel, counting its calls.
class CountingKernel : public VariableLengthKernel {
 public:
  std::string_view name() const override { return "counting reference"; }
  Result Forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                 const VariableLengthLayout& layout, double scale) const override {
    ++calls;
    return ReferenceVariableLengthKernel().Forward(q, k, v, layout, scale);
  }
  std::array<torch::Tensor, 3> Backward(const torch::Tensor& grad_out, const torch::Tensor& q,
                                        const torch::Tensor& k, const torch::Tensor& v,
                                        const Result& forward, const VariableLengthLayout& layout,
                                        double scale) const override {
    ++calls;
    return ReferenceVariableLengthKernel().Backward(grad_out, q, k, v, forward, layout, scale);
  }
  mutable std::atomic<int> calls{0};
};

ModelSpec SmallSpec(int model) {
  ModelSpec spec;
  spec.encoder_decoder = model == 1 || model == 3;
  spec.llama = model == 2;
  spec.t5v11 = model == 3;
  spec.num_layers = 2;
  spec.num_decoder_layers = spec.encoder_decoder ? 2 : 0;
  spec.hidden_size = 16;
  spec.num_attention_heads = kHeads;
  spec.num_key_value_heads = spec.llama ? 1 : 0;
  spec.kv_channels = kHeadDim;
  spec.ffn_hidden_size = 32;
  spec.vocab_size = 40;
  spec.max_sequence_length = 32;
  spec.relative_buckets = spec.t5v11 ? 8 : 0;
  spec.relative_max_distance = spec.t5v11 ? 16 : 0;
  spec.seed = 5;
  return spec;
}

StageRun RunPackedStage(const ModelSpec& spec, const StageBatch& batch,
                        v1::RecomputeMode recompute, bool variable_length) {
  absl::StatusOr<std::vector<StageRole>> roles = PipelineStageRoles(spec, 1);
  EXPECT_TRUE(roles.ok()) << roles.status();
  ModelStage stage(spec, roles->front());
  stage.SetSelectiveRecompute(recompute == v1::RECOMPUTE_SELECTIVE);
  stage.SetFullRecompute(recompute == v1::RECOMPUTE_FULL);
  StageRun run;
  CountingKernel counting;
  {
    std::optional<ScopedVariableLengthKernel> kernel;
    if (variable_length) kernel.emplace(counting);
    StageActivations out = stage.Forward({}, batch);
    out.loss.backward();
    run.loss = out.loss.item<double>();
  }
  run.calls = counting.calls.load();
  for (const torch::Tensor& p : stage.parameters()) {
    run.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return run;
}

TEST(VariableLengthAttention, PackedStagesMatchThePerSamplePathInEveryRecomputeMode) {
  const uint32_t seed =
      varipipe::testing::TestSeed("VariableLengthAttention.PackedStagesMatchThePerSamplePath");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  const char* const names[] = {"GPT", "T5", "Llama", "T5v11"};
  for (int model = 0; model < 4; ++model) {
    const ModelSpec spec = SmallSpec(model);
    const std::vector<std::vector<int64_t>> inputs = RandomRows(rng, 2, 20);
    StageBatch batch;
    batch.input_tokens = torch::randint(0, spec.vocab_size, {2, 20}, torch::kInt64);
    batch.input_segments = Segments(inputs, 20);
    batch.input_positions = Positions(inputs, 20);
    batch.input_lengths = (batch.input_segments >= 0).sum(1);
    batch.per_sample_attention = true;
    if (spec.encoder_decoder) {
      std::vector<std::vector<int64_t>> targets;
      for (const auto& row : inputs) {
        targets.emplace_back();
        for (size_t s = 0; s < row.size(); ++s) targets.back().push_back(1 + (rng() % 3));
      }
      batch.decoder_tokens = torch::randint(0, spec.vocab_size, {2, 12}, torch::kInt64);
      batch.target_segments = Segments(targets, 12);
      batch.target_positions = Positions(targets, 12);
      batch.target_lengths = (batch.target_segments >= 0).sum(1);
      batch.labels = torch::where(batch.target_segments >= 0,
                                  torch::randint(0, spec.vocab_size, {2, 12}, torch::kInt64),
                                  torch::full({2, 12}, -1, torch::kInt64));
    } else {
      batch.labels = torch::where(batch.input_segments >= 0,
                                  torch::randint(0, spec.vocab_size, {2, 20}, torch::kInt64),
                                  torch::full({2, 20}, -1, torch::kInt64));
    }
    for (v1::RecomputeMode recompute :
         {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
      SCOPED_TRACE(absl::StrCat(names[model], " ", v1::RecomputeMode_Name(recompute)));
      const StageRun varlen = RunPackedStage(spec, batch, recompute, true);
      const StageRun per_sample = RunPackedStage(spec, batch, recompute, false);
      // Every attention of every layer goes through the kernel, forward and
      // backward (full recomputation: the forward twice), but T5V11's
      // self-attention, whose position bias keeps the per-sample path (its
      // cross-attention has no bias).
      const int attentions = spec.t5v11 ? 2 : spec.encoder_decoder ? 2 + 2 * 2 : 2;
      const int expected = (recompute == v1::RECOMPUTE_FULL ? 3 : 2) * attentions;
      EXPECT_EQ(varlen.calls, expected);
      EXPECT_NEAR(varlen.loss, per_sample.loss, 1e-5);
      ASSERT_EQ(varlen.grads.size(), per_sample.grads.size());
      for (size_t i = 0; i < varlen.grads.size(); ++i) {
        EXPECT_LE((varlen.grads[i] - per_sample.grads[i]).abs().max().item<double>(), 1e-5) << i;
      }
    }
  }
}

// On a GPU: the flash kernel (bf16) against the reference kernel in fp32,
// within bf16's rounding.
TEST(VariableLengthAttention, FlashKernelMatchesTheReferenceOnAGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible to LibTorch";
  const torch::Tensor probe = torch::zeros({1, 1, kWidth}, torch::TensorOptions()
                                                                .dtype(torch::kBFloat16)
                                                                .device(torch::kCUDA));
  const VariableLengthKernel* flash = VariableLengthKernelFor(probe, kHeadDim, false, true);
  if (flash == nullptr) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no flash kernel";
  const uint32_t seed = varipipe::testing::TestSeed("VariableLengthAttention.FlashKernel");
  std::mt19937 rng(seed);
  torch::manual_seed(seed);
  const std::vector<std::vector<int64_t>> inputs = RandomRows(rng, 3, 24);
  const torch::Tensor in_segments = Segments(inputs, 24);
  const torch::Tensor real = (in_segments >= 0).to(torch::kFloat32);
  const auto on = [](const torch::Tensor& t) {
    return t.to(torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA));
  };
  const torch::Tensor q = torch::randn({3, 24, kWidth});
  const torch::Tensor k = torch::randn({3, 24, kWidth});
  const torch::Tensor v = torch::randn({3, 24, kWidth});
  for (bool causal : {true, false}) {
    // One layout per device: its offsets live on one.
    const auto gpu = VariableLengthLayout::FromSegments(in_segments, in_segments, causal);
    const auto cpu = VariableLengthLayout::FromSegments(in_segments, in_segments, causal);
    ExpectClose(Attend(on(q), on(k), on(v), gpu, real.cuda(), flash),
                Attend(q, k, v, cpu, real, &ReferenceVariableLengthKernel()), 5e-2,
                causal ? "causal flash" : "flash");
  }
}

}  // namespace
}  // namespace varipipe::executor
