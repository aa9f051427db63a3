#include "executor/runtime/training_optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace varipipe::executor {

double LearningRateAt(const v1::TrainingConfig& training, uint64_t iteration) {
  const double peak = training.learning_rate();
  const double floor = training.min_learning_rate();
  const uint64_t warmup = training.warmup_iterations();
  if (iteration < warmup) {
    return peak * static_cast<double>(iteration + 1) / static_cast<double>(warmup);
  }
  const uint64_t decay = training.iterations() > warmup ? training.iterations() - warmup : 1;
  const double progress =
      std::min(1.0, static_cast<double>(iteration - warmup) / static_cast<double>(decay));
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

TrainingOptimizer::TrainingOptimizer(std::vector<torch::Tensor> parameters,
                                     const v1::TrainingConfig& training)
    : parameters_(std::move(parameters)), training_(training) {
  if (training.optimizer() == v1::SGD) {
    torch::optim::SGDOptions options(training.learning_rate());
    options.momentum(0).weight_decay(training.weight_decay());
    optimizer_ = std::make_unique<torch::optim::SGD>(parameters_, options);
    return;
  }
  torch::optim::AdamWOptions options(training.learning_rate());
  options.betas({training.adam_beta1(), training.adam_beta2()});
  options.eps(training.adam_epsilon());
  options.weight_decay(training.weight_decay());
  optimizer_ = std::make_unique<torch::optim::AdamW>(parameters_, options);
}

double TrainingOptimizer::LocalSquaredGradNorm() const {
  double sum = 0;
  for (const torch::Tensor& p : parameters_) {
    if (p.grad().defined()) sum += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return sum;
}

double TrainingOptimizer::Step(uint64_t iteration, double global_grad_norm) {
  const double clip = training_.gradient_clip_norm();
  if (clip > 0 && global_grad_norm > clip) {
    const double scale = clip / (global_grad_norm + 1e-6);
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : parameters_) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  const double lr = LearningRateAt(training_, iteration);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  optimizer_->step();
  optimizer_->zero_grad();
  return lr;
}

void TrainingOptimizer::Save(torch::serialize::OutputArchive& archive) const {
  optimizer_->save(archive);
}

void TrainingOptimizer::Load(torch::serialize::InputArchive& archive) { optimizer_->load(archive); }

}  // namespace varipipe::executor
