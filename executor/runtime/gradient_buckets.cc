#include "executor/runtime/gradient_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace varipipe::executor {

// Runs after a parameter's gradient accumulator: the gradient of this
// backward pass is in its bucket.
class GradientBuckets::Hook final : public torch::autograd::FunctionPostHook {
 public:
  Hook(GradientBuckets* owner, size_t param) : owner_(owner), param_(param) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    owner_->Accumulated(param_);
    return outputs;
  }

 private:
  GradientBuckets* owner_;
  size_t param_;
};

GradientBuckets::GradientBuckets(const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                                 const std::set<std::string>& excluded, int64_t bucket_bytes) {
  // Reverse registration order: the last layers' gradients are final first.
  std::vector<std::pair<std::string, torch::Tensor>> order;
  for (const auto& item : parameters) {
    if (excluded.count(item.key()) == 0 && item.value().requires_grad()) {
      order.emplace_back(item.key(), item.value());
    }
  }
  std::reverse(order.begin(), order.end());
  // Consecutive parameters fill a bucket up to bucket_bytes (a parameter
  // larger than that has a bucket of its own).
  std::vector<std::vector<size_t>> groups;
  int64_t filled = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t bytes = order[i].second.numel() * static_cast<int64_t>(sizeof(float));
    if (groups.empty() || (filled > 0 && filled + bytes > bucket_bytes)) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(i);
    filled += bytes;
  }
  torch::NoGradGuard no_grad;
  for (const std::vector<size_t>& members : groups) {
    int64_t numel = 0;
    for (size_t i : members) numel += order[i].second.numel();
    Bucket bucket;
    bucket.flat = torch::zeros(
        {numel},
        torch::TensorOptions().dtype(torch::kFloat32).device(order[members[0]].second.device()));
    int64_t offset = 0;
    for (size_t i : members) {
      torch::Tensor& p = order[i].second;
      torch::Tensor view = bucket.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) view.copy_(p.grad());
      p.mutable_grad() = view;
      offset += p.numel();
      bucket.members.push_back(params_.size());
      params_.push_back({.name = order[i].first, .buckets = {buckets_.size()}});
      AddHook(p);
    }
    buckets_.push_back(std::move(bucket));
  }
}

std::unique_ptr<GradientBuckets> GradientBuckets::ReduceScatter(
    const torch::OrderedDict<std::string, torch::Tensor>& parameters, const torch::Tensor& flat,
    const std::vector<std::pair<int64_t, int64_t>>& ranges, const std::set<std::string>& held,
    int chunk) {
  std::unique_ptr<GradientBuckets> out(new GradientBuckets());
  out->reduction_ = Reduction::kReduceScatterSum;
  out->chunk_ = chunk;
  for (const auto& [begin, end] : ranges) {
    Bucket bucket;
    bucket.flat = flat.narrow(0, begin, end - begin);
    out->buckets_.push_back(std::move(bucket));
  }
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& item : parameters) {
    torch::Tensor p = item.value();  // shares the parameter (and its grad)
    const int64_t begin = offset;
    const int64_t end = offset + p.numel();
    offset = end;
    if (!p.requires_grad()) continue;
    torch::Tensor view = flat.narrow(0, begin, p.numel()).view(p.sizes());
    if (p.grad().defined()) view.copy_(p.grad());
    p.mutable_grad() = view;
    Param param{.name = item.key(), .buckets = {}};
    for (size_t b = 0; b < ranges.size(); ++b) {
      if (ranges[b].first >= end || ranges[b].second <= begin) continue;
      param.buckets.push_back(b);
      out->buckets_[b].members.push_back(out->params_.size());
      if (held.count(item.key()) > 0) out->buckets_[b].held = true;
    }
    out->params_.push_back(std::move(param));
    out->AddHook(p);
  }
  return out;
}

void GradientBuckets::AddHook(const torch::Tensor& p) {
  std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(p);
  hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<Hook>(this, params_.size() - 1)));
  accumulators_.push_back(std::move(accumulator));
}

GradientBuckets::~GradientBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  for (Bucket& b : buckets_) {
    if (b.transfer == nullptr || b.transfer->Wait(absl::Now() + absl::Seconds(30)).ok()) continue;
    // A reduction that did not end (a failed run) may still write the
    // bucket: its memory is kept for the rest of the process rather than
    // handed back.
    static auto* mu = new std::mutex();
    static auto* abandoned = new std::vector<torch::Tensor>();
    std::lock_guard<std::mutex> lock(*mu);
    abandoned->push_back(b.flat);
  }
}

void GradientBuckets::BeginIteration(Transport* transport, std::vector<int> group) {
  std::lock_guard<std::mutex> lock(mu_);
  transport_ = transport;
  group_ = std::move(group);
  armed_ = true;
}

void GradientBuckets::BeginPass(bool start_when_final) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Param& p : params_) p.fired = 0;
  counting_ = true;
  in_backward_ = start_when_final && armed_ && has_counts_;
}

void GradientBuckets::EndPass() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Param& p : params_) p.expected = p.fired;
  has_counts_ = true;
  counting_ = false;
  in_backward_ = false;
}

void GradientBuckets::Accumulated(size_t param) {
  if (!counting_) return;
  Param& p = params_[param];
  ++p.fired;
  if (p.ready && late_.ok()) {
    late_ = absl::InternalError(absl::StrCat("the gradient of ", p.name, " accumulated ", p.fired,
                                             " times in the last backward pass, ", p.expected,
                                             " in the one before: its bucket had started"));
  }
  if (!in_backward_ || p.ready || p.fired != p.expected) return;
  p.ready = true;
  for (size_t b : p.buckets) ++buckets_[b].ready;
  StartReady(/*force=*/false);
}

void GradientBuckets::StartReady(bool force) {
  while (next_start_ < buckets_.size()) {
    Bucket& b = buckets_[next_start_];
    if (!b.held) {
      if (!force && b.ready < b.members.size()) return;
      Start(b);
    }
    ++next_start_;
  }
}

void GradientBuckets::Start(Bucket& b) {
  const std::span<float> data(b.flat.data_ptr<float>(), static_cast<size_t>(b.flat.numel()));
  absl::StatusOr<std::unique_ptr<Transfer>> started =
      reduction_ == Reduction::kAllReduceMean ? transport_->StartAllReduceMean(data, group_)
                                              : transport_->StartReduceScatterSum(data, group_);
  if (started.ok()) {
    b.transfer = *std::move(started);
  } else {
    b.start_status = started.status();
  }
  b.started = true;
  if (in_backward_) ++started_now_;
}

absl::Status GradientBuckets::StartAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return absl::FailedPreconditionError("gradient buckets started before armed");
  StartReady(/*force=*/true);
  return absl::OkStatus();
}

absl::Status GradientBuckets::Finish(absl::Time deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!armed_) return absl::FailedPreconditionError("gradient buckets finished before armed");
    in_backward_ = false;
    StartReady(/*force=*/true);
    for (Bucket& b : buckets_) {
      if (!b.started) Start(b);  // the held ones, in order
    }
  }
  absl::Status status = late_;
  late_ = absl::OkStatus();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    absl::Status s = b.start_status;
    if (s.ok() && b.transfer != nullptr) s = b.transfer->Wait(deadline);
    if (!s.ok() && status.ok()) {
      status = absl::Status(s.code(), absl::StrCat("gradient bucket ", i, " of ", buckets_.size(),
                                                   ": ", s.message()));
    }
    b.transfer.reset();
    b.start_status = absl::OkStatus();
    b.ready = 0;
    b.started = false;
  }
  if (status.ok()) {
    torch::NoGradGuard no_grad;
    const int64_t replicas = static_cast<int64_t>(group_.size());
    for (Bucket& b : buckets_) {
      if (reduction_ == Reduction::kAllReduceMean) {
        b.flat.mul_(static_cast<float>(replicas));
        continue;
      }
      // Only this rank's chunk is reduced; the rest is consumed.
      const int64_t c = b.flat.numel() / std::max<int64_t>(1, replicas);
      if (chunk_ > 0) b.flat.narrow(0, 0, chunk_ * c).zero_();
      b.flat.narrow(0, (chunk_ + 1) * c, b.flat.numel() - (chunk_ + 1) * c).zero_();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Param& p : params_) p.ready = false;
  next_start_ = 0;
  armed_ = false;
  started_in_backward_ = started_now_;
  started_now_ = 0;
  return status;
}

std::vector<std::string> GradientBuckets::BucketParameters(size_t b) const {
  std::vector<std::string> names;
  for (size_t i : buckets_.at(b).members) names.push_back(params_[i].name);
  return names;
}

}  // namespace varipipe::executor
