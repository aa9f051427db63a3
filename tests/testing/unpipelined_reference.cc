#include "tests/testing/unpipelined_reference.h"

#include <algorithm>
#include <cmath>

#include "common/dataset/minibatch_sampler.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/training_optimizer.h"

namespace varipipe::testing {

using executor::MicroBatchLoader;
using executor::ModelStage;

executor::StageBatch WholeModelBatch(const MicroBatchLoader& loader, const v1::MicroBatch& mb,
                                     bool t5, double loss_scale) {
  const int64_t rows = mb.row_starts_size() > 0 ? mb.row_starts_size() : mb.sample_ids_size();
  const auto tokens = [&](int64_t len) {
    v1::TensorSpec s;
    s.add_dims(rows);
    s.add_dims(len);
    s.set_dtype(v1::INT64);
    return s;
  };
  const executor::RowLengths lengths = *loader.Lengths(mb);
  executor::StageBatch batch;
  batch.input_lengths = lengths.input;
  batch.target_lengths = lengths.target;
  batch.input_segments = lengths.input_segments;
  batch.input_positions = lengths.input_positions;
  batch.target_segments = lengths.target_segments;
  batch.target_positions = lengths.target_positions;
  batch.input_tokens = *loader.Load(mb, v1::LoadInput::INPUT_TOKENS, tokens(mb.input_len()));
  if (t5) {
    batch.decoder_tokens =
        *loader.Load(mb, v1::LoadInput::DECODER_INPUT_TOKENS, tokens(mb.target_len()));
  }
  batch.labels =
      *loader.Load(mb, v1::LoadInput::LABELS, tokens(t5 ? mb.target_len() : mb.input_len()));
  batch.loss_scale = loss_scale;
  return batch;
}

ReferenceStep UnpipelinedStep(const v1::JobConfig& config,
                              const std::vector<v1::ExecutionPlan>& plans,
                              const SampleDataset& dataset) {
  const executor::ModelSpec spec = *executor::ModelSpecFromConfig(config);
  ModelStage stage(spec, (*executor::PipelineStageRoles(spec, 1))[0]);
  ReferenceStep step;
  for (const auto& item : stage.named_parameters()) {
    step.initial[item.key()] = item.value().detach().clone();
  }
  v1::MicroBatch all;
  for (const v1::ExecutionPlan& plan : plans) {
    if (plan.pp_rank() != 0) continue;
    for (const v1::MicroBatch& mb : plan.micro_batches()) {
      for (uint64_t id : mb.sample_ids()) all.add_sample_ids(id);
      all.set_input_len(std::max(all.input_len(), mb.input_len()));
      all.set_target_len(std::max(all.target_len(), mb.target_len()));
    }
  }
  MicroBatchLoader loader(&dataset, SamplerOptionsFromConfig(config));
  const executor::StageBatch batch =
      WholeModelBatch(loader, all, spec.encoder_decoder,
                      1.0 / static_cast<double>(plans[0].global_target_tokens()));
  executor::StageActivations out = stage.Forward({}, batch);
  step.loss = out.loss.item<double>();
  out.loss.backward();
  executor::TrainingOptimizer optimizer(stage.parameters(), config.training());
  optimizer.Step(plans[0].iteration(), std::sqrt(optimizer.LocalSquaredGradNorm()));
  for (const auto& item : stage.named_parameters()) {
    step.trained[item.key()] = item.value().detach().clone();
  }
  return step;
}

Differences Compare(const std::map<std::string, torch::Tensor>& actual,
                    const ReferenceStep& reference) {
  Differences d;
  for (const auto& [name, value] : actual) {
    const auto expected = reference.trained.find(name);
    if (expected == reference.trained.end()) {
      d.parameters = d.updates = INFINITY;  // a parameter the model does not have
      continue;
    }
    const double gap = (value - expected->second).norm().item<double>();
    d.parameters =
        std::max(d.parameters, gap / std::max(expected->second.norm().item<double>(), 1e-30));
    const torch::Tensor update = expected->second - reference.initial.at(name);
    d.updates = std::max(d.updates, gap / std::max(update.norm().item<double>(), 1e-30));
    ++d.compared;
  }
  return d;
}

}  // namespace varipipe::testing
