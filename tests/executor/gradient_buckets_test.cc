// GradientBuckets (executor/runtime/gradient_buckets.h) on a chain of linear
// layers with a recording transport: gradients become views into buckets of
// at most the set size, in reverse parameter order, shared parameters left
// out; in the last backward pass buckets start from the accumulators' hooks
// while the backward still runs, always in bucket order, the rest with
// StartAll; Finish scales by the group size; a pass that accumulates a
// gradient more often than the one before fails instead of reducing a
// bucket that was still being written. ZeRO stage 1's buckets
// (ReduceScatter) cut one flat buffer, splitting parameters, start as
// reduce-scatters in the same order, keep a bucket holding a shared
// parameter for Finish, and leave only this rank's chunk of each bucket.
#include "executor/runtime/gradient_buckets.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "executor/comm/transport.h"
#include "gtest/gtest.h"

namespace varipipe::executor {
namespace {

// Records each started all-reduce (its buffer and whether the test's
// backward was running) and leaves the data as it is (a mean over equal
// replicas).
class RecordingTransport final : public Transport {
 public:
  struct Started {
    float* data = nullptr;
    size_t size = 0;
    bool during_backward = false;
  };
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int, void*, size_t) override {
    return absl::UnimplementedError("send");
  }
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int, void*, size_t) override {
    return absl::UnimplementedError("recv");
  }
  absl::Status AllReduceMean(std::span<float>, const std::vector<int>&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Transfer>> StartAllReduceMean(
      std::span<float> data, const std::vector<int>& group) override {
    started.push_back({data.data(), data.size(), in_backward});
    return Transport::StartAllReduceMean(data, group);
  }
  absl::Status AllReduceSum(std::span<float>, const std::vector<int>&) override {
    return absl::OkStatus();
  }
  absl::Status ReduceScatterSum(std::span<float>, const std::vector<int>&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Transfer>> StartReduceScatterSum(
      std::span<float> data, const std::vector<int>& group) override {
    started.push_back({data.data(), data.size(), in_backward});
    return Transport::StartReduceScatterSum(data, group);
  }
  absl::Status AllGather(std::span<float>, const std::vector<int>&) override {
    return absl::OkStatus();
  }
  std::string Describe() const override { return "recording"; }
  void Abort(const std::string&) override {}

  std::vector<Started> started;
  bool in_backward = false;
};

// Four 16x16 layers (1 KiB weights, 64-byte biases) and a "shared" vector.
struct Chain : torch::nn::Module {
  Chain() {
    for (int i = 0; i < 4; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(16, 16)));
    }
    shared = register_parameter("shared", torch::ones({16}));
  }
  torch::Tensor Forward(const torch::Tensor& x) {
    torch::Tensor h = x * shared;
    for (auto& layer : layers) h = torch::tanh(layer->forward(h));
    return h.sum();
  }
  std::vector<torch::nn::Linear> layers;
  torch::Tensor shared;
};

TEST(GradientBucketsTest, BucketsAreViewsInReverseOrderWithoutSharedParameters) {
  Chain chain;
  GradientBuckets buckets(chain.named_parameters(), {"shared"}, /*bucket_bytes=*/1100);
  // Weights of 1,024 bytes and biases of 64: weight + bias per bucket, from
  // the last layer back.
  ASSERT_EQ(buckets.num_buckets(), 4u);
  EXPECT_EQ(buckets.BucketParameters(0),
            (std::vector<std::string>{"layer3.bias", "layer3.weight"}));
  EXPECT_EQ(buckets.BucketParameters(3),
            (std::vector<std::string>{"layer0.bias", "layer0.weight"}));
  for (const auto& item : chain.named_parameters()) {
    if (item.key() == "shared") {
      EXPECT_FALSE(item.value().grad().defined());
    } else {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_FALSE(item.value().grad().storage().is_alias_of(item.value().storage()));
    }
  }
  // Layer 3's weight and bias share one storage (their bucket).
  const auto named = chain.named_parameters();
  EXPECT_TRUE(
      named["layer3.weight"].grad().storage().is_alias_of(named["layer3.bias"].grad().storage()));
  EXPECT_FALSE(
      named["layer3.weight"].grad().storage().is_alias_of(named["layer2.weight"].grad().storage()));
}

TEST(GradientBucketsTest, TheLastPassStartsBucketsInOrderWhileTheBackwardRuns) {
  torch::manual_seed(5);
  Chain chain;
  RecordingTransport transport;
  GradientBuckets buckets(chain.named_parameters(), {"shared"}, /*bucket_bytes=*/1100);
  const torch::Tensor x = torch::randn({3, 16});
  // The reference: two micro-batches' gradients, unbucketed.
  Chain reference;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < 4; ++i) {
      reference.layers[i]->weight.copy_(chain.layers[i]->weight);
      reference.layers[i]->bias.copy_(chain.layers[i]->bias);
    }
  }
  reference.Forward(x).backward();
  reference.Forward(x * 2).backward();

  buckets.BeginIteration(&transport, {0, 1});
  buckets.BeginPass(/*start_when_final=*/false);
  chain.Forward(x).backward();
  buckets.EndPass();
  EXPECT_TRUE(transport.started.empty()) << "no bucket starts before the last pass";
  buckets.BeginPass(/*start_when_final=*/true);
  transport.in_backward = true;
  chain.Forward(x * 2).backward();
  transport.in_backward = false;
  buckets.EndPass();
  ASSERT_TRUE(buckets.StartAll().ok());
  ASSERT_EQ(transport.started.size(), 4u);
  // Every bucket whose gradients were final started inside the backward, in
  // bucket order (last layer first).
  const auto named = chain.named_parameters();
  for (size_t b = 0; b < 4; ++b) {
    const std::string layer = "layer" + std::to_string(3 - b);
    EXPECT_EQ(transport.started[b].data, named[layer + ".bias"].grad().data_ptr<float>())
        << "bucket " << b;
    EXPECT_TRUE(transport.started[b].during_backward) << "bucket " << b;
  }
  ASSERT_TRUE(buckets.Finish(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(buckets.started_in_backward(), 4);
  // Mean over two equal replicas, times two: twice this replica's sum.
  const auto expected = reference.named_parameters();
  for (size_t i = 0; i < 4; ++i) {
    const std::string w = "layer" + std::to_string(i) + ".weight";
    EXPECT_TRUE(torch::allclose(named[w].grad(), 2 * expected[w].grad())) << w;
  }
}

TEST(GradientBucketsTest, AnExtraAccumulationAfterItsBucketStartedFails) {
  Chain chain;
  RecordingTransport transport;
  GradientBuckets buckets(chain.named_parameters(), {"shared"}, /*bucket_bytes=*/1100);
  const torch::Tensor x = torch::randn({3, 16});
  buckets.BeginIteration(&transport, {0, 1});
  buckets.BeginPass(false);
  chain.Forward(x).backward();
  buckets.EndPass();
  buckets.BeginPass(true);
  chain.Forward(x).backward();
  chain.Forward(x).backward();  // every gradient accumulates a second time
  buckets.EndPass();
  const absl::Status finished = buckets.Finish(absl::Now() + absl::Seconds(10));
  EXPECT_EQ(finished.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(finished.message(), "its bucket had started")) << finished;
}

TEST(GradientBucketsTest, ReduceScatterBucketsSplitParametersAndHoldSharedOnes) {
  torch::manual_seed(7);
  Chain chain;
  RecordingTransport transport;
  // The chain's parameters in order: "shared" (16 elements; a module's own
  // parameters come before its children's), then 4 x (256 + 16): 1,104
  // elements. Buckets of 300 elements from the end split layers' weights;
  // the last takes the rest. Layer 3's bias (standing in for a shared
  // parameter) holds bucket 0 back.
  int64_t numel = 0;
  for (const auto& item : chain.named_parameters()) numel += item.value().numel();
  ASSERT_EQ(numel, 1104);
  const torch::Tensor flat = torch::zeros({numel});
  const std::vector<std::pair<int64_t, int64_t>> ranges{
      {804, 1104}, {504, 804}, {204, 504}, {0, 204}};
  std::unique_ptr<GradientBuckets> buckets = GradientBuckets::ReduceScatter(
      chain.named_parameters(), flat, ranges, {"layer3.bias"}, /*chunk=*/1);
  ASSERT_EQ(buckets->num_buckets(), 4u);
  // Layer 2's weight (offsets 560..816) spans buckets 0 and 1.
  const auto names = [&](size_t b) { return buckets->BucketParameters(b); };
  EXPECT_EQ(names(0), (std::vector<std::string>{"layer2.weight", "layer2.bias", "layer3.weight",
                                                "layer3.bias"}));
  EXPECT_EQ(names(1), (std::vector<std::string>{"layer1.weight", "layer1.bias", "layer2.weight"}));
  EXPECT_EQ(names(3), (std::vector<std::string>{"shared", "layer0.weight"}));
  const auto named = chain.named_parameters();
  for (const auto& item : named) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(item.value().grad().storage().is_alias_of(flat.storage())) << item.key();
  }
  const torch::Tensor x = torch::randn({3, 16});
  buckets->BeginIteration(&transport, {0, 1});
  buckets->BeginPass(false);
  chain.Forward(x).backward();
  buckets->EndPass();
  EXPECT_TRUE(transport.started.empty());
  buckets->BeginPass(true);
  transport.in_backward = true;
  chain.Forward(x).backward();
  transport.in_backward = false;
  buckets->EndPass();
  const torch::Tensor accumulated = flat.clone();
  // Buckets 1, 2 and 3 started inside the backward, in order, passing over
  // the held bucket 0; StartAll starts nothing more.
  ASSERT_TRUE(buckets->StartAll().ok());
  ASSERT_EQ(transport.started.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(transport.started[k].data, flat.data_ptr<float>() + ranges[k + 1].first) << k;
    EXPECT_EQ(transport.started[k].size, static_cast<size_t>(300 - (k == 2 ? 96 : 0))) << k;
    EXPECT_TRUE(transport.started[k].during_backward) << k;
  }
  // Finish starts the held bucket last, then keeps chunk 1 of every bucket
  // (unscaled: a sum) and zeroes chunk 0.
  ASSERT_TRUE(buckets->Finish(absl::Now() + absl::Seconds(10)).ok());
  ASSERT_EQ(transport.started.size(), 4u);
  EXPECT_EQ(transport.started[3].data, flat.data_ptr<float>() + ranges[0].first);
  EXPECT_FALSE(transport.started[3].during_backward);
  EXPECT_EQ(buckets->started_in_backward(), 3);
  for (const auto& [begin, end] : ranges) {
    const int64_t half = (end - begin) / 2;
    EXPECT_TRUE(torch::equal(flat.slice(0, begin, begin + half), torch::zeros({half})));
    EXPECT_TRUE(torch::equal(flat.slice(0, begin + half, end),
                             accumulated.slice(0, begin + half, end)));
  }
  EXPECT_GT(accumulated.abs().sum().item<float>(), 0.0f);
}

}  // namespace
}  // namespace varipipe::executor
