// The multi-tensor optimizer steps (executor/runtime/foreach_step.h) against
// LibTorch's own AdamW and SGD steps on the CPU, where both run the same
// per-tensor operations: bitwise equal parameters and moments over several
// steps, with a parameter whose gradient is missing in some steps (skipped,
// so step counts differ), with and without weight decay; and the state each
// keeps is the other's (a foreach step continues where LibTorch's left off
// and the reverse), so checkpoints of either load into both.
#include "executor/runtime/foreach_step.h"

#include <torch/torch.h>

#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::executor {
namespace {

std::vector<torch::Tensor> Parameters() {
  return {torch::randn({5, 7}), torch::randn({7}), torch::randn({3, 2, 4}), torch::randn({1})};
}

std::vector<torch::Tensor> Copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) out.push_back(p.clone().requires_grad_(true));
  return out;
}

// Gives every parameter the same fresh gradient in both lists, but none to
// parameter 2 on odd steps.
void SetGradients(std::vector<torch::Tensor>& a, std::vector<torch::Tensor>& b, int step) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (i == 2 && step % 2 == 1) {
      a[i].mutable_grad() = torch::Tensor();
      b[i].mutable_grad() = torch::Tensor();
      continue;
    }
    const torch::Tensor g = torch::randn_like(a[i]);
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

void ExpectBitwiseEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                        int step) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i << " after step " << step;
  }
}

class ForeachAdamWTest : public ::testing::TestWithParam<double> {};

TEST_P(ForeachAdamWTest, MatchesLibTorchsAdamWBitwise) {
  const uint32_t seed = ::varipipe::testing::TestSeed("ForeachAdamW");
  torch::manual_seed(seed);
  const std::vector<torch::Tensor> initial = Parameters();
  std::vector<torch::Tensor> reference = Copies(initial);
  std::vector<torch::Tensor> foreach = Copies(initial);
  torch::optim::AdamWOptions options(3e-2);
  options.betas({0.9, 0.95}).eps(1e-6).weight_decay(GetParam());
  torch::optim::AdamW reference_optimizer(reference, options);
  torch::optim::AdamW foreach_optimizer(foreach, options);
  for (int step = 0; step < 6; ++step) {
    SetGradients(reference, foreach, step);
    reference_optimizer.step();
    ForeachAdamWStep(foreach_optimizer);
    ExpectBitwiseEqual(reference, foreach, step);
  }
  // The state is shared: LibTorch's step continues the foreach one's moments
  // and step counts (a fresh state would give other updates).
  for (int step = 6; step < 9; ++step) {
    SetGradients(reference, foreach, step);
    reference_optimizer.step();
    foreach_optimizer.step();
    ExpectBitwiseEqual(reference, foreach, step);
  }
  EXPECT_EQ(reference_optimizer.state().size(), foreach_optimizer.state().size());
}

INSTANTIATE_TEST_SUITE_P(WeightDecay, ForeachAdamWTest, ::testing::Values(0.0, 0.1),
                         [](const ::testing::TestParamInfo<double>& info) {
                           return info.param == 0 ? std::string("None") : std::string("Some");
                         });

TEST(ForeachSgdTest, MatchesLibTorchsSgdBitwise) {
  torch::manual_seed(::varipipe::testing::TestSeed("ForeachSgd"));
  for (double weight_decay : {0.0, 0.05}) {
    const std::vector<torch::Tensor> initial = Parameters();
    std::vector<torch::Tensor> reference = Copies(initial);
    std::vector<torch::Tensor> foreach = Copies(initial);
    torch::optim::SGDOptions options(0.1);
    options.momentum(0).weight_decay(weight_decay);
    torch::optim::SGD reference_optimizer(reference, options);
    torch::optim::SGD foreach_optimizer(foreach, options);
    for (int step = 0; step < 4; ++step) {
      SetGradients(reference, foreach, step);
      reference_optimizer.step();
      ForeachSgdStep(foreach_optimizer);
      ExpectBitwiseEqual(reference, foreach, step);
    }
  }
}

TEST(ForeachSgdTest, RefusesMomentum) {
  std::vector<torch::Tensor> params = Copies(Parameters());
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_THROW(ForeachSgdStep(optimizer), c10::Error);
}

}  // namespace
}  // namespace varipipe::executor
