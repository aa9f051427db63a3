#include "executor/runtime/optimizer_sharding.h"

#include <algorithm>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace varipipe::executor {
namespace {

std::span<float> Span(const torch::Tensor& flat) {
  return std::span<float>(flat.data_ptr<float>(), static_cast<size_t>(flat.numel()));
}

// Keeps `t`'s memory for the rest of the process: a collective that did not
// end (a failed run) may still write it.
void Abandon(const torch::Tensor& t) {
  static auto* mu = new std::mutex();
  static auto* abandoned = new std::vector<torch::Tensor>();
  std::lock_guard<std::mutex> lock(*mu);
  abandoned->push_back(t);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerSharding>> OptimizerSharding::Create(
    const std::map<uint32_t, ModelStage*>& stages, std::vector<int> group, int index,
    torch::Device device, int64_t bucket_bytes) {
  if (group.empty() || index < 0 || index >= static_cast<int>(group.size())) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer sharding: position ", index,
                                                   " in a data-parallel group of ", group.size()));
  }
  std::unique_ptr<OptimizerSharding> s(
      new OptimizerSharding(std::move(group), index, device, std::max<int64_t>(0, bucket_bytes)));
  const int64_t dp = static_cast<int64_t>(s->group_.size());
  // Elements per bucket: a multiple of dp, at least dp.
  const int64_t per_bucket =
      std::max<int64_t>(dp, s->bucket_bytes_ / static_cast<int64_t>(sizeof(float)) / dp * dp);
  torch::NoGradGuard no_grad;
  for (const auto& [id, stage] : stages) {
    Stage& st = s->stages_[id];
    {
      int64_t at = 0;
      for (const auto& item : stage->named_parameters()) {
        if (stage->IsReplica(item.key())) st.replicas.emplace_back(at, at + item.value().numel());
        at += item.value().numel();
        st.names.push_back(item.key());
        st.parameters.push_back(item.value());
      }
    }
    for (const torch::Tensor& p : st.parameters) {
      if (p.scalar_type() != torch::kFloat32 || p.device() != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer sharding: stage ", id, " has a parameter of type ",
                         std::string(p.toString()), " on ", p.device().str(),
                         "; the master weights are fp32 on ", device.str()));
      }
      st.numel += p.numel();
    }
    const int64_t padded = (st.numel + dp - 1) / dp * dp;
    const torch::TensorOptions options = torch::TensorOptions(device).dtype(torch::kFloat32);
    st.flat = torch::zeros({padded}, options);
    st.grads = torch::zeros({padded}, options);
    int64_t offset = 0;
    for (torch::Tensor& p : st.parameters) {
      torch::Tensor slot = st.flat.narrow(0, offset, p.numel());
      slot.copy_(p.detach().reshape(-1));
      // The parameter keeps its identity (module registration, autograd
      // leaf) and now lives in the buffer.
      p.set_data(slot.view(p.sizes()));
      if (p.requires_grad()) {
        torch::Tensor grad = st.grads.narrow(0, offset, p.numel()).view(p.sizes());
        if (p.grad().defined()) grad.copy_(p.grad());
        p.mutable_grad() = grad;
      }
      offset += p.numel();
    }
    // Buckets from the buffer's end (the last layers' gradients are final
    // first); without buckets the whole buffer.
    for (int64_t end = padded; end > 0 || st.buckets.empty();) {
      const int64_t begin = s->bucket_bytes_ > 0 ? std::max<int64_t>(0, end - per_bucket) : 0;
      st.buckets.emplace_back(begin, end);
      end = begin;
    }
    for (size_t b = 0; b < st.buckets.size(); ++b) {
      const auto [begin, end] = s->Chunk(st, b);
      st.shards.push_back(st.flat.narrow(0, begin, end - begin));
    }
    BindShardGradients(st);
  }
  return s;
}

OptimizerSharding::~OptimizerSharding() = default;

std::pair<int64_t, int64_t> OptimizerSharding::Chunk(const Stage& st, size_t b) const {
  const auto [begin, end] = st.buckets[b];
  const int64_t chunk = (end - begin) / static_cast<int64_t>(group_.size());
  return {begin + index_ * chunk, begin + (index_ + 1) * chunk};
}

void OptimizerSharding::BindShardGradients(Stage& st) {
  for (torch::Tensor& shard : st.shards) {
    const int64_t offset = shard.storage_offset() - st.flat.storage_offset();
    shard.mutable_grad() = st.grads.narrow(0, offset, shard.numel());
  }
}

std::vector<torch::Tensor> OptimizerSharding::shard_parameters() const {
  std::vector<torch::Tensor> shards;
  for (const auto& [id, st] : stages_) {
    shards.insert(shards.end(), st.shards.begin(), st.shards.end());
  }
  return shards;
}

torch::Tensor OptimizerSharding::LayoutTensor() const {
  std::vector<int64_t> values;
  for (const auto& [id, st] : stages_) {
    values.push_back(id);
    values.push_back(st.numel);
    values.push_back(static_cast<int64_t>(st.buckets.size()));
    for (const auto& [begin, end] : st.buckets) values.push_back(end - begin);
  }
  return torch::tensor(values, torch::kInt64);
}

bool OptimizerSharding::IsUnbucketed(const torch::Tensor& layout) {
  const torch::Tensor values = layout.to(torch::kInt64).contiguous();
  const int64_t* v = values.data_ptr<int64_t>();
  const int64_t n = values.numel();
  for (int64_t at = 0; at + 2 < n; at += 3 + v[at + 2]) {
    if (v[at + 2] != 1) return false;
  }
  return true;
}

GradientBuckets* OptimizerSharding::Buckets(uint32_t stage, const std::set<std::string>& held) {
  const auto it = stages_.find(stage);
  if (!bucketed() || it == stages_.end()) return nullptr;
  Stage& st = it->second;
  if (st.bucketed == nullptr) {
    torch::OrderedDict<std::string, torch::Tensor> named;  // in the buffer's order
    for (size_t k = 0; k < st.parameters.size(); ++k) named.insert(st.names[k], st.parameters[k]);
    st.bucketed = GradientBuckets::ReduceScatter(named, st.grads, st.buckets, held, index_);
  }
  return st.bucketed.get();
}

absl::Status OptimizerSharding::ReduceScatterGradients(uint32_t stage,
                                                       const std::vector<int>& group,
                                                       Transport& transport, absl::Time deadline,
                                                       int* buckets, int* started_in_backward) {
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
  if (st.bucketed != nullptr && st.bucketed->armed()) {
    // Started during the backward (the held ones now); Finish zeroes the
    // other ranks' chunks.
    VP_RETURN_IF_ERROR(st.bucketed->Finish(deadline));
    if (buckets != nullptr) *buckets += static_cast<int>(st.bucketed->num_buckets());
    if (started_in_backward != nullptr) *started_in_backward += st.bucketed->started_in_backward();
  } else {
    // The whole gradient buffer at once, in place (padding and parameters
    // without a gradient contribute zeros); then only the shard is kept.
    VP_RETURN_IF_ERROR(transport.ReduceScatterSum(Span(st.grads), group_));
    torch::NoGradGuard no_grad;
    for (size_t b = 0; b < st.buckets.size(); ++b) {
      const auto [begin, end] = Chunk(st, b);
      const auto [bucket_begin, bucket_end] = st.buckets[b];
      st.grads.narrow(0, bucket_begin, begin - bucket_begin).zero_();
      st.grads.narrow(0, end, bucket_end - end).zero_();
    }
    if (buckets != nullptr) *buckets += static_cast<int>(st.buckets.size());
  }
  BindShardGradients(st);
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

absl::Status OptimizerSharding::AllGatherParameters(Transport& transport, absl::Time deadline) {
  // Every bucket's gather started, in stage and bucket order (the same on
  // every rank), after the optimizer's update queued on the device.
  struct Started {
    const Stage* stage;
    absl::StatusOr<std::unique_ptr<Transfer>> transfer;
  };
  std::vector<Started> started;
  for (auto& [id, st] : stages_) {
    st.reduced = false;
    for (const auto& [begin, end] : st.buckets) {
      started.push_back(
          {&st, transport.StartAllGather(Span(st.flat.narrow(0, begin, end - begin)), group_)});
    }
  }
  // All waited for, even after a failure: a gather still running writes
  // the buffer (if one does not end, the buffer is never freed).
  absl::Status status;
  for (Started& s : started) {
    absl::Status done = s.transfer.status();
    if (done.ok()) done = (*s.transfer)->Wait(deadline);
    if (!done.ok()) {
      if (s.transfer.ok()) Abandon(s.stage->flat);
      if (status.ok()) status = done;
    }
  }
  // The gathers wrote the buffers through raw pointers, which no version
  // counter sees: bump each parameter's, so that what keys on it (the
  // compute-dtype weight copies, weight_cast_cache.h) sees the new values.
  for (auto& [id, st] : stages_) {
    for (const torch::Tensor& p : st.parameters) torch::autograd::impl::bump_version(p);
  }
  return status;
}

std::vector<NormExclusion> OptimizerSharding::ShardNormExclusions() const {
  std::vector<NormExclusion> out;
  size_t k = 0;  // index into shard_parameters()
  for (const auto& [id, st] : stages_) {
    for (size_t b = 0; b < st.buckets.size(); ++b, ++k) {
      const auto [shard_begin, shard_end] = Chunk(st, b);
      for (const auto& [begin, end] : st.replicas) {
        const int64_t lo = std::max(begin, shard_begin) - shard_begin;
        const int64_t hi = std::min(end, shard_end) - shard_begin;
        if (hi > lo) out.push_back({k, lo, hi});
      }
    }
  }
  return out;
}

int64_t GradientBucketBytes(const v1::TrainingConfig& training) {
  return static_cast<int64_t>(training.has_gradient_bucket_mib() ? training.gradient_bucket_mib()
                                                                 : 25)
         << 20;
}

absl::StatusOr<RankOptimizer> MakeRankOptimizer(const std::map<uint32_t, ModelStage*>& stages,
                                                const v1::TrainingConfig& training,
                                                const std::vector<int>& data_parallel_group,
                                                int data_parallel_index, torch::Device device,
                                                std::optional<int64_t> bucket_bytes) {
  RankOptimizer out;
  if (training.zero_stage() >= 1 && data_parallel_group.size() > 1) {
    VP_ASSIGN_OR_RETURN(
        out.sharding,
        OptimizerSharding::Create(stages, data_parallel_group, data_parallel_index, device,
                                  bucket_bytes.value_or(GradientBucketBytes(training))));
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
