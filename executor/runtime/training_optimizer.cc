#include "executor/runtime/training_optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/runtime/foreach_step.h"

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
                                     const v1::TrainingConfig& training, OptimizerShard shard)
    : parameters_(std::move(parameters)), training_(training), shard_(shard) {
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

torch::Tensor TrainingOptimizer::LocalSquaredGradNormTensor() const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const torch::Device device =
      parameters_.empty() ? torch::Device(torch::kCPU) : parameters_.front().device();
  torch::Tensor sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  if (!grads.empty()) {
    sum = torch::stack(torch::_foreach_norm(grads)).to(torch::kFloat64).pow(2).sum();
  }
  for (const NormExclusion& e : norm_exclusions_) {
    const torch::Tensor& g = parameters_.at(e.parameter).grad();
    if (!g.defined() || e.end <= e.begin) continue;
    sum = sum - g.reshape(-1).slice(0, e.begin, e.end).to(torch::kFloat64).pow(2).sum();
  }
  return sum.clamp_min(0.0);
}

double TrainingOptimizer::LocalSquaredGradNorm() const {
  return LocalSquaredGradNormTensor().item<double>();
}

double TrainingOptimizer::Step(uint64_t iteration, double global_grad_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const double clip = training_.gradient_clip_norm();
  if (clip > 0 && global_grad_norm > clip && !grads.empty()) {
    torch::_foreach_mul_(grads, clip / (global_grad_norm + 1e-6));
  }
  const double lr = LearningRateAt(training_, iteration);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(optimizer_.get())) {
    ForeachAdamWStep(*adamw);
  } else {
    ForeachSgdStep(*dynamic_cast<torch::optim::SGD*>(optimizer_.get()));
  }
  if (!grads.empty()) torch::_foreach_zero_(grads);
  return lr;
}

int64_t TrainingOptimizer::StateBytes() const {
  int64_t bytes = 0;
  const auto add = [&bytes](const torch::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const auto& [key, state] : optimizer_->state()) {
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      add(sgd->momentum_buffer());
    }
  }
  return bytes;
}

// Stage 0 archives (and those of every release before ZeRO stage 1) hold no
// zero/ keys: the whole state.
void TrainingOptimizer::Save(torch::serialize::OutputArchive& archive) const {
  if (shard_.sharded()) {
    archive.write("zero/stage", torch::tensor(static_cast<int64_t>(shard_.zero_stage)));
    archive.write("zero/data_parallel", torch::tensor(static_cast<int64_t>(shard_.data_parallel)));
    archive.write("zero/shard", torch::tensor(static_cast<int64_t>(shard_.index)));
  }
  optimizer_->save(archive);
}

absl::Status TrainingOptimizer::CheckShard(torch::serialize::InputArchive& archive) const {
  torch::Tensor value;
  OptimizerShard saved;
  if (archive.try_read("zero/data_parallel", value)) {
    saved.zero_stage = 1;
    saved.data_parallel = static_cast<uint32_t>(value.item<int64_t>());
    value = torch::Tensor();
    if (archive.try_read("zero/shard", value)) {
      saved.index = static_cast<uint32_t>(value.item<int64_t>());
    }
  }
  constexpr char kStartOver[] = ", or remove the checkpoint directory to start over";
  if (saved.sharded() && !shard_.sharded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint's optimizer state is sharded over data-parallel degree ",
        saved.data_parallel, " (training.zero_stage 1), but this run has data-parallel degree ",
        shard_.data_parallel, " and training.zero_stage ", shard_.zero_stage,
        " and keeps the whole state: resume with parallelism.data ", saved.data_parallel,
        " and training.zero_stage 1", kStartOver));
  }
  if (!saved.sharded() && shard_.sharded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint holds the whole optimizer state (training.zero_stage 0), but this run "
        "shards it over data-parallel degree ",
        shard_.data_parallel, " (training.zero_stage 1): resume with training.zero_stage 0",
        kStartOver));
  }
  if (saved.sharded() && saved.data_parallel != shard_.data_parallel) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint's optimizer state is sharded over data-parallel degree ",
        saved.data_parallel, " (training.zero_stage 1), but this run has data-parallel degree ",
        shard_.data_parallel, ": resume with parallelism.data ", saved.data_parallel, kStartOver));
  }
  if (saved.sharded() && saved.index != shard_.index) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint's optimizer state is shard ", saved.index, " of ",
                     saved.data_parallel, ", but this rank holds shard ", shard_.index));
  }
  return absl::OkStatus();
}

absl::Status TrainingOptimizer::Load(torch::serialize::InputArchive& archive) {
  VP_RETURN_IF_ERROR(CheckShard(archive));
  optimizer_->load(archive);
  return absl::OkStatus();
}

int64_t TensorBytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors)
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace varipipe::executor
