// A micro-batch split across a context group, run by whole model stages: c
// lanes as threads, each with its own ModelStage (GPT or LLAMA) and a Gloo
// context group over loopback TCP, each running the forward and backward of
// its part of the split (its local tokens and labels, positions from each
// token's place in its sample, keys and values gathered from every lane).
// Summed over the lanes, the losses and every parameter's gradient must
// equal one stage running the same samples whole (one per row), under every
// recompute mode, with the CUDA path's variable-length seam (the reference
// kernel, on the split's offsets, bottom-right causal), and with split
// backwards (B, then W from what B kept). Lengths and tokens are random
// (the seed is printed).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/plan_contract/context_parallel_split.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "executor/model/context_parallel_attention.h"
#include "executor/model/model_stage.h"
#include "executor/model/tensor_group.h"
#include "executor/model/variable_length_attention.h"
#include "executor/model/weight_grad_store.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::varipipe::testing::IsOk;

ModelSpec SmallModel(bool llama, int c) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.hidden_size = 32;
  spec.num_attention_heads = 4;
  spec.kv_channels = 8;
  spec.ffn_hidden_size = 64;
  spec.vocab_size = 50;
  spec.max_sequence_length = 48;
  spec.seed = 11;
  spec.llama = llama;
  if (llama) {
    // Grouped-query attention and Llama 3.1 rotary scaling.
    spec.num_key_value_heads = 2;
    spec.rope_factor = 8;
    spec.rope_original_max_positions = 64;
  }
  spec.context_parallel = c;
  return spec;
}

enum class Recompute { kNone, kSelective, kFull };

struct Case {
  bool llama = false;
  int c = 2;
  Recompute recompute = Recompute::kNone;
  bool kernel = false;          // the variable-length seam (reference kernel)
  bool split_backward = false;  // B then W
  std::string Name() const {
    const char* recompute_name[] = {"None", "Selective", "Full"};
    return absl::StrCat(llama ? "Llama" : "Gpt", "_cp", c, "_",
                        recompute_name[static_cast<int>(recompute)], kernel ? "_Varlen" : "",
                        split_backward ? "_SplitBackward" : "");
  }
};

using Named = std::map<std::string, torch::Tensor>;

struct LaneRun {
  double loss = 0;
  Named gradients;
  std::string error;
};

// One forward and backward of `batch` on a fresh stage of the whole model.
void RunStage(const ModelSpec& spec, const Case& test, const StageBatch& batch,
              std::shared_ptr<TensorGroup> context, LaneRun& out) {
  try {
    const StageRole role = PipelineStageRoles(spec, 1)->front();
    ModelStage stage(spec, role, nullptr, std::move(context));
    stage.SetSelectiveRecompute(test.recompute == Recompute::kSelective);
    stage.SetFullRecompute(test.recompute == Recompute::kFull);
    std::optional<WeightGradStore> store;
    if (test.split_backward) store.emplace();
    StageActivations result;
    {
      const WeightGradScope scope(store.has_value() ? &*store : nullptr);
      result = stage.Forward({}, batch);
    }
    result.loss.backward();
    if (store.has_value()) store->Apply();
    out.loss = result.loss.item<double>();
    for (const auto& item : stage.named_parameters()) {
      const torch::Tensor& g = item.value().grad();
      out.gradients[item.key()] = g.defined() ? g.clone() : torch::zeros_like(item.value());
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

class ContextParallelStageTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  std::unique_ptr<RedisServer> redis_;
};

TEST_P(ContextParallelStageTest, LanesSumToTheWholeMicroBatch) {
  const Case test = GetParam();
  const int c = test.c;
  const std::string name = test.Name();
  std::mt19937 rng(::varipipe::testing::TestSeed(name.c_str()));
  const ModelSpec spec = SmallModel(test.llama, c);
  // 2 to 4 samples: the first of 1 to 3 tokens (shorter than 2c: empty
  // chunks), the others of 24 to 48.
  std::vector<int64_t> lengths(2 + rng() % 3);
  for (int64_t& l : lengths) l = 24 + static_cast<int64_t>(rng() % 25);
  lengths[0] = 1 + static_cast<int64_t>(rng() % 3);
  std::vector<std::vector<int64_t>> tokens;
  for (const int64_t l : lengths) {
    std::vector<int64_t>& t = tokens.emplace_back();
    for (int64_t p = 0; p < l; ++p) t.push_back(1 + static_cast<int64_t>(rng() % 49));
  }
  // Language-model labels: position p predicts token p + 1 of its sample.
  const auto label = [&](size_t s, int64_t p) {
    return p + 1 < lengths[s] ? tokens[s][p + 1] : int64_t{-1};
  };
  int64_t labelled = 0;
  for (const int64_t l : lengths) labelled += l - 1;
  if (labelled == 0) {
    tokens[1].push_back(7);
    ++lengths[1];
    labelled = 1;
  }
  const double loss_scale = 1.0 / static_cast<double>(labelled);

  // The whole micro-batch: one sample per row, padded.
  const int64_t n = static_cast<int64_t>(lengths.size());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  StageBatch whole;
  whole.input_tokens = torch::zeros({n, longest}, torch::kInt64);
  whole.labels = torch::full({n, longest}, -1, torch::kInt64);
  whole.input_lengths = torch::tensor(lengths, torch::kInt64);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t p = 0; p < lengths[s]; ++p) {
      whole.input_tokens[s][p] = tokens[s][p];
      whole.labels[s][p] = label(static_cast<size_t>(s), p);
    }
  }
  whole.loss_scale = loss_scale;

  std::optional<ScopedVariableLengthKernel> kernel;
  if (test.kernel) kernel.emplace(ReferenceVariableLengthKernel());
  LaneRun expected;
  RunStage(SmallModel(test.llama, 1), test, whole, nullptr, expected);
  ASSERT_EQ(expected.error, "");

  std::vector<LaneRun> lanes(c);
  std::vector<std::thread> threads;
  for (int r = 0; r < c; ++r) {
    threads.emplace_back([&, r] {
      GlooTransport::Options o;
      o.redis.host = redis_->host();
      o.redis.port = redis_->port();
      o.redis.password = redis_->password();
      o.prefix = name;
      o.rank = r;
      o.size = c;
      o.connect_timeout = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<GlooTransport>> transport = GlooTransport::Create(o);
      if (!transport.ok()) {
        lanes[r].error = transport.status().ToString();
        return;
      }
      std::vector<int> ranks;
      for (int k = 0; k < c; ++k) ranks.push_back(k);
      auto group = std::make_shared<TensorGroup>(ranks, r, "context-parallel");
      group->set_transport(transport->get());
      // This lane's part: its local tokens and their labels, padded to A.
      const ContextParallelSplit split = *ContextParallelSplit::Of(lengths, c, r);
      const int64_t a = split.all_gather_count();
      StageBatch batch;
      batch.input_tokens = torch::zeros({1, a}, torch::kInt64);
      batch.labels = torch::full({1, a}, -1, torch::kInt64);
      batch.input_lengths = torch::full({1}, split.local_count(), torch::kInt64);
      int64_t u = 0;
      for (const ContextParallelSplit::Chunk& chunk : split.chunks()) {
        for (int64_t p = chunk.begin; p < chunk.end; ++p, ++u) {
          batch.input_tokens[0][u] = tokens[chunk.sample][p];
          batch.labels[0][u] = label(static_cast<size_t>(chunk.sample), p);
        }
      }
      batch.loss_scale = loss_scale;
      batch.context = c10::make_intrusive<ContextParallelInput>(split, torch::kCPU);
      RunStage(spec, test, batch, group, lanes[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  double loss = 0;
  Named summed;
  for (int r = 0; r < c; ++r) {
    ASSERT_EQ(lanes[r].error, "") << "lane " << r;
    loss += lanes[r].loss;
    for (const auto& [key, g] : lanes[r].gradients) {
      summed[key] = summed.count(key) ? summed[key] + g : g;
    }
  }
  EXPECT_NEAR(loss, expected.loss, 1e-5 * std::abs(expected.loss)) << name;
  ASSERT_EQ(summed.size(), expected.gradients.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [key, g] : expected.gradients) {
    const double scale = std::max(g.abs().max().item<double>(), 1e-12);
    const double difference = (summed.at(key) - g).abs().max().item<double>() / scale;
    if (difference > worst) {
      worst = difference;
      worst_name = key;
    }
  }
  std::printf("%s: %zu samples (lengths", name.c_str(), lengths.size());
  for (const int64_t l : lengths) std::printf(" %ld", static_cast<long>(l));
  std::printf("), loss %.6f vs %.6f, worst gradient difference %.2e (%s)\n", loss, expected.loss,
              worst, worst_name.c_str());
  EXPECT_LT(worst, 1e-5) << worst_name;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (bool llama : {false, true}) {
    for (int c : {2, 4}) {
      for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        cases.push_back({.llama = llama, .c = c, .recompute = r});
      }
    }
    cases.push_back({.llama = llama, .c = 2, .recompute = Recompute::kNone, .kernel = true});
    cases.push_back({.llama = llama, .c = 2, .recompute = Recompute::kFull, .kernel = true});
    cases.push_back(
        {.llama = llama, .c = 2, .recompute = Recompute::kNone, .split_backward = true});
    cases.push_back(
        {.llama = llama, .c = 4, .recompute = Recompute::kFull, .split_backward = true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Lanes, ContextParallelStageTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.Name();
                         });

TEST(ContextParallelStageRefusal, T5IsRefusedNamingTheField) {
  ModelSpec spec = SmallModel(false, 2);
  spec.encoder_decoder = true;
  spec.num_layers = 1;
  spec.num_decoder_layers = 1;
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, 2);
  try {
    ModelStage stage(spec, roles[0]);
    FAIL() << "a T5 stage with context parallelism 2 was built";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallelism.context"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace varipipe::executor
