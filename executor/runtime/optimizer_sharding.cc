#include "executor/runtime/optimizer_sharding.h"

#include <torch/cuda.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace varipipe::executor {
namespace {

std::span<float> Span(torch::Tensor& flat) {
  return std::span<float>(flat.data_ptr<float>(), static_cast<size_t>(flat.numel()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerSharding>> OptimizerSharding::Create(
    const std::map<uint32_t, ModelStage*>& stages, std::vector<int> group, int index,
    torch::Device device) {
  if (group.empty() || index < 0 || index >= static_cast<int>(group.size())) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer sharding: position ", index,
                                                   " in a data-parallel group of ", group.size()));
  }
  std::unique_ptr<OptimizerSharding> s(new OptimizerSharding(std::move(group), index, device));
  const int64_t dp = static_cast<int64_t>(s->group_.size());
  torch::NoGradGuard no_grad;
  for (const auto& [id, stage] : stages) {
    Stage& st = s->stages_[id];
    st.parameters = stage->parameters();
    {
      int64_t at = 0;
      for (const auto& item : stage->named_parameters()) {
        if (stage->IsReplica(item.key())) st.replicas.emplace_back(at, at + item.value().numel());
        at += item.value().numel();
      }
    }
    int64_t numel = 0;
    for (const torch::Tensor& p : st.parameters) {
      if (p.scalar_type() != torch::kFloat32 || p.device() != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer sharding: stage ", id, " has a parameter of type ",
                         std::string(p.toString()), " on ", p.device().str(),
                         "; the master weights are fp32 on ", device.str()));
      }
      numel += p.numel();
    }
    st.shard_size = (numel + dp - 1) / dp;
    st.flat =
        torch::zeros({st.shard_size * dp}, torch::TensorOptions(device).dtype(torch::kFloat32));
    int64_t offset = 0;
    for (torch::Tensor& p : st.parameters) {
      torch::Tensor slot = st.flat.narrow(0, offset, p.numel());
      slot.copy_(p.detach().reshape(-1));
      // The parameter keeps its identity (module registration, autograd
      // leaf) and now lives in the buffer.
      p.set_data(slot.view(p.sizes()));
      offset += p.numel();
    }
    st.shard = st.flat.narrow(0, index * st.shard_size, st.shard_size);
  }
  return s;
}

std::vector<torch::Tensor> OptimizerSharding::shard_parameters() const {
  std::vector<torch::Tensor> shards;
  for (const auto& [id, st] : stages_) shards.push_back(st.shard);
  return shards;
}

void OptimizerSharding::Synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

absl::Status OptimizerSharding::ReduceScatterGradients(uint32_t stage,
                                                       const std::vector<int>& group,
                                                       Transport& transport) {
  if (group != group_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan reduces the gradients of stage ", stage, " over ranks ",
                     absl::StrJoin(group, ","), " but the optimizer state is sharded over ranks ",
                     absl::StrJoin(group_, ","), " (training.zero_stage 1)"));
  }
  const auto it = stages_.find(stage);
  if (it == stages_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("reduce-scatter of stage ", stage, ", which this rank does not hold"));
  }
  Stage& st = it->second;
  torch::NoGradGuard no_grad;
  // The gradients in the buffer's layout; padding and parameters without a
  // gradient contribute zeros.
  torch::Tensor flat = torch::zeros_like(st.flat);
  int64_t offset = 0;
  for (torch::Tensor& p : st.parameters) {
    if (p.grad().defined()) {
      flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
      p.mutable_grad().zero_();  // consumed: the next iteration accumulates from zero
    }
    offset += p.numel();
  }
  Synchronize();
  VP_RETURN_IF_ERROR(transport.ReduceScatterSum(Span(flat), group_));
  // Only the shard is kept (a copy, so the full buffer is freed).
  st.shard.mutable_grad() = flat.narrow(0, index_ * st.shard_size, st.shard_size).clone();
  st.reduced = true;
  return absl::OkStatus();
}

absl::Status OptimizerSharding::CheckGradientsReduced() const {
  for (const auto& [id, st] : stages_) {
    if (!st.reduced) {
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer step before the gradients of stage ", id,
          " were reduce-scattered (training.zero_stage 1 needs the plan's AllReduceGradients "
          "of every stage first)"));
    }
  }
  return absl::OkStatus();
}

absl::Status OptimizerSharding::AllGatherParameters(Transport& transport) {
  Synchronize();  // the optimizer's update of the shards is complete
  for (auto& [id, st] : stages_) {
    st.shard.mutable_grad() = torch::Tensor();
    st.reduced = false;
    VP_RETURN_IF_ERROR(transport.AllGather(Span(st.flat), group_));
  }
  return absl::OkStatus();
}

std::vector<NormExclusion> OptimizerSharding::ShardNormExclusions() const {
  std::vector<NormExclusion> out;
  size_t k = 0;
  for (const auto& [id, st] : stages_) {
    const int64_t shard_begin = index_ * st.shard_size;
    for (const auto& [begin, end] : st.replicas) {
      const int64_t b = std::max(begin, shard_begin) - shard_begin;
      const int64_t e = std::min(end, shard_begin + st.shard_size) - shard_begin;
      if (e > b) out.push_back({k, b, e});
    }
    ++k;
  }
  return out;
}

absl::StatusOr<RankOptimizer> MakeRankOptimizer(const std::map<uint32_t, ModelStage*>& stages,
                                                const v1::TrainingConfig& training,
                                                const std::vector<int>& data_parallel_group,
                                                int data_parallel_index, torch::Device device) {
  RankOptimizer out;
  if (training.zero_stage() >= 1 && data_parallel_group.size() > 1) {
    VP_ASSIGN_OR_RETURN(out.sharding, OptimizerSharding::Create(stages, data_parallel_group,
                                                                data_parallel_index, device));
    out.optimizer = std::make_unique<TrainingOptimizer>(out.sharding->shard_parameters(), training,
                                                        out.sharding->shard());
    out.optimizer->set_norm_exclusions(out.sharding->ShardNormExclusions());
    return out;
  }
  std::vector<torch::Tensor> parameters;
  std::vector<NormExclusion> exclusions;
  for (const auto& [id, stage] : stages) {
    for (const auto& item : stage->named_parameters()) {
      if (stage->IsReplica(item.key())) {
        exclusions.push_back({parameters.size(), 0, item.value().numel()});
      }
      parameters.push_back(item.value());
    }
  }
  out.optimizer = std::make_unique<TrainingOptimizer>(
      std::move(parameters), training,
      OptimizerShard{.zero_stage = training.zero_stage(),
                     .data_parallel = static_cast<uint32_t>(data_parallel_group.size()),
                     .index = static_cast<uint32_t>(data_parallel_index)});
  out.optimizer->set_norm_exclusions(std::move(exclusions));
  return out;
}

}  // namespace varipipe::executor
