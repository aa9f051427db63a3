#include "executor/runtime/plan_interpreter.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/plan_contract/instruction_text.h"
#include "common/plan_contract/micro_batch_rows.h"
#include "common/status.h"
#include "executor/data/input_prefetcher.h"
#include "executor/model/cuda_autocast.h"
#include "executor/runtime/device_timeline.h"
#include "executor/runtime/fault_injection.h"
#include "executor/runtime/host_reads.h"
#include "executor/runtime/plan_check.h"

namespace varipipe::executor {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

torch::ScalarType TorchDtype(v1::DType dtype) {
  switch (dtype) {
    case v1::BFLOAT16:
      return torch::kBFloat16;
    case v1::FLOAT16:
      return torch::kFloat16;
    case v1::INT64:
      return torch::kInt64;
    default:
      return torch::kFloat32;
  }
}

std::vector<int64_t> Dims(const v1::TensorSpec& spec) {
  return std::vector<int64_t>(spec.dims().begin(), spec.dims().end());
}

std::string Describe(const v1::Instruction& in) {
  return absl::StrCat(plan_contract::OpName(in), " (micro-batch ", in.micro_batch(), ", stage ",
                      in.stage(), ")");
}

// Enables LibTorch's CUDA autocast for its lifetime (and clears the
// autocast cache after), or does nothing.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<torch::ScalarType> dtype) : active_(dtype.has_value()) {
    if (!active_) return;
    previous_ = CudaAutocastEnabled();
    SetCudaAutocastDtype(*dtype);
    SetCudaAutocastEnabled(true);
  }
  ~AutocastScope() {
    if (!active_) return;
    SetCudaAutocastEnabled(previous_);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
  bool previous_ = false;
};

}  // namespace

// The state of one iteration.
class IterationRun {
 public:
  IterationRun(PlanInterpreter& interpreter, const v1::ExecutionPlan& plan)
      : it_(interpreter),
        plan_(plan),
        buffers_(plan.num_buffers()),
        inputs_(interpreter.loader_, plan, interpreter.options_.device,
                interpreter.options_.prefetch_inputs, interpreter.options_.memory),
        timeline_(interpreter.options_.device, interpreter.options_.device_timing) {}

  absl::StatusOr<IterationStats> Execute() {
    const Clock::time_point start = Clock::now();
    stats_.iteration = plan_.iteration();
    // The format version, global_target_tokens and the weight-gradient
    // order were checked (CheckedPlan): a wrong order never leaves a
    // gradient half accumulated.
    for (int i = 0; i < plan_.instructions_size(); ++i) {
      const v1::Instruction& in = plan_.instructions(i);
      if (in.has_backward()) {
        last_backward_[in.stage()] = i;
        last_gradient_pass_[in.stage()] = i;
        if (in.backward().weight_grad_deferred()) {
          deferred_.insert({in.stage(), in.micro_batch()});
          split_stages_.insert(in.stage());
        }
      } else if (in.has_weight_grad()) {
        last_gradient_pass_[in.stage()] = i;
      }
    }
    for (uint32_t stage : plan_.stages()) {
      if (!it_.stages_.count(stage)) {
        return absl::FailedPreconditionError(absl::StrCat("plan of rank ", plan_.rank(),
                                                          " runs stage ", stage,
                                                          " which this executor does not hold"));
      }
    }
    const ContextLane lane = ContextLane::Of(plan_);
    for (const v1::MicroBatch& mb : plan_.micro_batches()) {
      if (lane.group_size > 1 && mb.context().split()) {
        // This lane's local tokens, in one row padded to input_len.
        std::vector<int64_t> lengths;
        for (int i = 0; i < mb.sample_input_lens_size() && i < mb.sample_target_lens_size(); ++i) {
          lengths.push_back(static_cast<int64_t>(mb.sample_input_lens(i)) +
                            mb.sample_target_lens(i));
        }
        const absl::StatusOr<ContextParallelSplit> split =
            ContextParallelSplit::Of(lengths, lane.group_size, lane.index);
        if (split.ok()) stats_.real_tokens += static_cast<uint64_t>(split->local_count());
        stats_.padded_tokens += mb.input_len();
        continue;
      }
      // Another lane's whole micro-batch.
      if (lane.group_size > 1 && mb.context().lane() != static_cast<uint32_t>(lane.index)) {
        continue;
      }
      stats_.real_tokens += mb.real_input_tokens() + mb.real_target_tokens();
      // Rows, not samples: a packed row holds several samples.
      stats_.padded_tokens += plan_contract::PaddedTokens(mb);
    }
    try {
      PrepareBuckets();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("rank ", plan_.rank(), ", iteration ",
                                              plan_.iteration(), ", gradient buckets: ", e.what()));
    }
    InstructionProgress* progress = it_.options_.progress;
    MemoryAccount* memory = it_.options_.memory;
    if (memory != nullptr) {
      stats_.memory_start_bytes = memory->current_bytes();
      stats_.memory_peak_bytes = stats_.memory_start_bytes;
      stats_.instruction_memory.reserve(static_cast<size_t>(plan_.instructions_size()));
    }
    for (index_ = 0; index_ < plan_.instructions_size(); ++index_) {
      const v1::Instruction& in = plan_.instructions(index_);
      if (progress != nullptr) {
        progress->started_ns.store(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                .count(),
            std::memory_order_relaxed);
        progress->index.store(index_, std::memory_order_release);
      }
      absl::Status status;
      if (memory != nullptr) memory->ResetPeak();
      try {
        status = Dispatch(in);
      } catch (const c10::Error& e) {
        // A collective inside the model (tensor or context group) that
        // failed: its message, without LibTorch's backtrace.
        status = absl::InternalError(e.what_without_backtrace());
      } catch (const std::exception& e) {
        status = absl::InternalError(e.what());
      }
      if (memory != nullptr) {
        const InstructionMemory m{memory->current_bytes(), memory->peak_bytes()};
        stats_.instruction_memory.push_back(m);
        stats_.memory_peak_bytes = std::max(stats_.memory_peak_bytes, m.peak_bytes);
      }
      if (!status.ok()) {
        return absl::Status(
            status.code(),
            absl::StrCat("rank ", plan_.rank(), ", iteration ", plan_.iteration(),
                         ", instruction #", index_, " ", Describe(in), ": ", status.message()));
      }
    }
    if (progress != nullptr) progress->index.store(-1, std::memory_order_release);
    if (!weight_grads_.empty()) {  // CheckWeightGradOrder makes this impossible
      return absl::InternalError("the plan ended with deferred weight gradients not applied");
    }
    if (absl::Status drained = DrainTensorGroup(); !drained.ok()) {
      return absl::Status(drained.code(), absl::StrCat("rank ", plan_.rank(), ", iteration ",
                                                       plan_.iteration(), ", end: ",
                                                       drained.message()));
    }
    try {
      // A plan without an optimizer step reads its loss here.
      if (loss_sum_.defined()) stats_.loss = reads_.Read(loss_sum_).item<double>();
      ResolvePassTimes();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("rank ", plan_.rank(), ", iteration ",
                                              plan_.iteration(), ", end: ", e.what()));
    }
    stats_.data_seconds += inputs_.waited_seconds();
    stats_.host_reads = reads_.count();
    stats_.instructions = plan_.instructions_size();
    stats_.total_seconds = Seconds(Clock::now() - start);
    stats_.overhead_seconds = stats_.total_seconds - stats_.compute_seconds -
                              stats_.communication_seconds - stats_.data_seconds;
    return stats_;
  }

 private:
  // What a forward pass keeps for its backward pass.
  struct Saved {
    StageActivations in;
    StageActivations out;
    StageBatch batch;
    // Split backward: what it keeps for the weight_grad; the forward's
    // linear layers record into it (created by the forward).
    std::unique_ptr<WeightGradStore> weight_grads;
    // The recompute mode the forward ran under (RecomputeOf).
    std::string recompute;
  };
  struct Pending {
    std::vector<std::unique_ptr<Transfer>> transfers;
  };

  // The shared parameters (SharedParameterGroup) among `stage`'s: summed
  // across stages before their data-parallel reduction, so they stay out of
  // the buckets.
  std::set<std::string> SharedNames(ModelStage* stage) const {
    std::set<std::string> names;
    const torch::OrderedDict<std::string, torch::Tensor> named = stage->named_parameters();
    for (const SharedParameterGroup& group : it_.options_.shared_parameter_groups) {
      if (named.find(group.name) != nullptr) names.insert(group.name);
    }
    return names;
  }

  // The stages whose gradients this plan reduces over more than one
  // replica: their buckets (made at the first such plan; under ZeRO stage 1
  // the sharding's, reduce-scattered) start this iteration's reduction
  // (gradient_buckets.h).
  void PrepareBuckets() {
    OptimizerSharding* sharding = it_.options_.sharding;
    if (sharding == nullptr && it_.options_.gradient_bucket_bytes <= 0) return;
    for (const v1::Instruction& in : plan_.instructions()) {
      if (!in.has_all_reduce() || in.all_reduce().group_ranks_size() <= 1) continue;
      const std::vector<int> group(in.all_reduce().group_ranks().begin(),
                                   in.all_reduce().group_ranks().end());
      for (uint32_t id : in.all_reduce().stages()) {
        const auto stage = it_.stages_.find(id);
        if (stage == it_.stages_.end()) continue;  // AllReduce names it
        GradientBuckets* buckets = nullptr;
        if (sharding != nullptr) {
          // Another group: ReduceScatterGradients refuses it.
          if (group != sharding->group()) continue;
          buckets = sharding->Buckets(id, SharedNames(stage->second));
          if (buckets == nullptr) continue;  // unbucketed: reduced at the instruction
        } else {
          std::unique_ptr<GradientBuckets>& made = it_.buckets_[id];
          if (made == nullptr) {
            made = std::make_unique<GradientBuckets>(stage->second->named_parameters(),
                                                     SharedNames(stage->second),
                                                     it_.options_.gradient_bucket_bytes);
          }
          buckets = made.get();
        }
        buckets->BeginIteration(it_.transport_, group);
        bucketed_[id] = buckets;
      }
    }
  }

  // Waits, under the watchdog, for the tensor group's collectives that the
  // device orders and the host has not waited for (tensor_group.h): before
  // the host waits for the device anyway, so that a collective that never
  // completes ends in an error naming it, not in a device read that never
  // returns.
  absl::Status DrainTensorGroup() {
    const absl::Time deadline = absl::Now() + it_.options_.wait_timeout;
    for (TensorGroup* group : {it_.options_.tensor_group, it_.options_.context_group}) {
      if (group != nullptr) VP_RETURN_IF_ERROR(group->Drain(deadline));
    }
    return absl::OkStatus();
  }

  GradientBuckets* BucketsOf(uint32_t stage) const {
    const auto found = bucketed_.find(stage);
    return found == bucketed_.end() ? nullptr : found->second;
  }

  // After the stage's last gradient pass of the iteration, its remaining
  // buckets start.
  absl::Status MaybeStartBuckets(uint32_t stage) {
    GradientBuckets* buckets = BucketsOf(stage);
    if (buckets == nullptr || last_gradient_pass_[stage] != index_) return absl::OkStatus();
    return buckets->StartAll();
  }

  absl::Status Dispatch(const v1::Instruction& in) {
    switch (in.op_case()) {
      case v1::Instruction::kLoadInput:
        return LoadInput(in);
      case v1::Instruction::kForward:
        return Forward(in);
      case v1::Instruction::kBackward:
        return Backward(in);
      case v1::Instruction::kSendStart:
        return Start(in.send_start(), /*send=*/true);
      case v1::Instruction::kRecvStart:
        return Start(in.recv_start(), /*send=*/false);
      case v1::Instruction::kSendWait:
        return Wait(in, in.send_wait(), /*send=*/true);
      case v1::Instruction::kRecvWait:
        return Wait(in, in.recv_wait(), /*send=*/false);
      case v1::Instruction::kFreeBuffer:
        for (uint32_t id : in.free_buffer().buffer_ids()) {
          VP_RETURN_IF_ERROR(CheckId(id));
          buffers_[id] = torch::Tensor();
          contents_.erase(id);
        }
        return absl::OkStatus();
      case v1::Instruction::kAllReduce:
        VP_RETURN_IF_ERROR(NoWeightGradPending());
        return AllReduce(in.all_reduce());
      case v1::Instruction::kOptimizerStep:
        VP_RETURN_IF_ERROR(NoWeightGradPending());
        return OptimizerStep();
      case v1::Instruction::kWeightGrad:
        return WeightGrad(in);
      default:
        return absl::InvalidArgumentError("instruction without an operation");
    }
  }

  absl::Status CheckId(uint32_t id) const {
    if (id < buffers_.size()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("buffer ", id, " is beyond num_buffers ", buffers_.size()));
  }
  absl::StatusOr<torch::Tensor> Buffer(uint32_t id) const {
    VP_RETURN_IF_ERROR(CheckId(id));
    if (!buffers_[id].defined()) {
      return absl::FailedPreconditionError(absl::StrCat("buffer ", id, " is empty or freed"));
    }
    return buffers_[id];
  }
  absl::StatusOr<const v1::MicroBatch*> MicroBatch(uint32_t id) const {
    if (id >= static_cast<uint32_t>(plan_.micro_batches_size()) ||
        plan_.micro_batches(static_cast<int>(id)).id() != id) {
      return absl::InvalidArgumentError(absl::StrCat("unknown micro-batch ", id));
    }
    return &plan_.micro_batches(static_cast<int>(id));
  }
  // Stores `tensor` (converted to the plan's dtype, contiguous) in buffer
  // `id` after checking its shape against `spec`.
  absl::Status Store(uint32_t id, const torch::Tensor& tensor, const v1::TensorSpec& spec) {
    VP_RETURN_IF_ERROR(CheckId(id));
    if (tensor.sizes() != at::IntArrayRef(Dims(spec))) {
      return absl::FailedPreconditionError(
          absl::StrCat("produced a tensor of shape [", absl::StrJoin(tensor.sizes(), ", "),
                       "] but the plan says ", spec.ShortDebugString()));
    }
    buffers_[id] = tensor.detach().to(TorchDtype(spec.dtype())).contiguous();
    return absl::OkStatus();
  }

  absl::Status LoadInput(const v1::Instruction& in) {
    const v1::LoadInput& load = in.load_input();
    VP_RETURN_IF_ERROR(MicroBatch(in.micro_batch()).status());
    for (int k = 0; k < load.buffer_ids_size(); ++k) {
      VP_ASSIGN_OR_RETURN(torch::Tensor t, inputs_.TakeLoad(index_, k));
      VP_RETURN_IF_ERROR(CheckId(load.buffer_ids(k)));
      buffers_[load.buffer_ids(k)] = ToDevice(t);
      contents_[load.buffer_ids(k)] = load.contents(k);
    }
    return absl::OkStatus();
  }

  // Builds the stage's view of a micro-batch: lengths, loaded tokens, and
  // received activations (in plan order: decoder activations, then the
  // encoder output) as leaves that collect their gradients.
  absl::Status Inputs(const v1::Instruction& in, StageActivations* activations, StageBatch* batch) {
    VP_ASSIGN_OR_RETURN(const v1::MicroBatch* mb, MicroBatch(in.micro_batch()));
    VP_ASSIGN_OR_RETURN(RowLengths lengths, inputs_.TakeLengths(index_));
    batch->input_lengths = ToDevice(lengths.input);
    // A split micro-batch: this lane's index tensors, copied without a
    // host wait (context_parallel_attention.h).
    if (lengths.context_split != nullptr) {
      batch->context =
          c10::make_intrusive<ContextParallelInput>(*lengths.context_split, it_.options_.device);
    }
    batch->target_lengths = ToDevice(lengths.target);
    // Packed micro-batches: per-position samples and positions. Per-sample
    // attention builds its layout from the segments on the host
    // (VariableLengthLayout): they stay there, so that no pass reads them
    // back from the device.
    batch->per_sample_attention = mb->packed_attention() != v1::BLOCK_DIAGONAL_MASK;
    const auto segments = [&](const torch::Tensor& t) {
      return batch->per_sample_attention ? t : ToDevice(t);
    };
    batch->input_segments = segments(lengths.input_segments);
    batch->input_positions = ToDevice(lengths.input_positions);
    batch->target_segments = segments(lengths.target_segments);
    batch->target_positions = ToDevice(lengths.target_positions);
    // The head's rows, known on the host (no read of the labels back).
    if (it_.stages_.at(in.stage())->role().has_head) {
      batch->labelled_positions = ToDevice(lengths.labelled_positions);
    }
    batch->loss_scale = 1.0 / static_cast<double>(plan_.global_target_tokens());
    std::vector<torch::Tensor> received;
    for (uint32_t id : in.forward().input_buffer_ids()) {
      VP_ASSIGN_OR_RETURN(torch::Tensor t, Buffer(id));
      const auto content = contents_.find(id);
      if (content == contents_.end()) {
        received.push_back(t.to(it_.options_.compute_dtype).detach().requires_grad_(true));
        continue;
      }
      switch (content->second) {
        case v1::LoadInput::INPUT_TOKENS:
          batch->input_tokens = t;
          break;
        case v1::LoadInput::DECODER_INPUT_TOKENS:
          batch->decoder_tokens = t;
          break;
        case v1::LoadInput::LABELS:
          batch->labels = t;
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("buffer ", id, " has unknown content"));
      }
    }
    if (received.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward reads ", received.size(), " activations; at most 2 exist"));
    }
    if (!received.empty()) activations->hidden = received[0];
    if (received.size() == 2) activations->memory = received[1];
    return absl::OkStatus();
  }

  // A host tensor (pinned on a GPU) on the compute device; the copy is
  // queued, not waited for.
  torch::Tensor ToDevice(const torch::Tensor& t) const {
    if (!t.defined()) return t;
    return t.to(it_.options_.device, /*non_blocking=*/it_.options_.device.is_cuda());
  }

  // Which time a compute pass adds to: a micro-batch's forward, backward or
  // weight gradient (`time` indexes micro_batch_times), or the optimizer.
  enum class PassKind { kForward, kBackward, kWeight, kOptimizer };
  struct TimedPass {
    int start_mark = 0;
    int end_mark = 0;
    PassKind kind = PassKind::kForward;
    size_t time = 0;
  };
  // Timeline marks around each compute pass; their times are resolved once,
  // at the end of the iteration (device_timeline.h).
  void TimePass(int start_mark, PassKind kind, size_t time) {
    passes_.push_back({start_mark, timeline_.Mark(), kind, time});
  }
  void ResolvePassTimes() {
    if (passes_.empty()) return;
    timeline_.Finish();
    if (timeline_.device_events()) ++stats_.host_reads;  // the one wait for the device
    for (const TimedPass& pass : passes_) {
      const double seconds = timeline_.Seconds(pass.start_mark, pass.end_mark);
      stats_.compute_seconds += seconds;
      switch (pass.kind) {
        case PassKind::kForward:
          stats_.micro_batch_times[pass.time].forward_seconds += seconds;
          break;
        case PassKind::kBackward:
          stats_.micro_batch_times[pass.time].backward_seconds += seconds;
          break;
        case PassKind::kWeight:
          stats_.micro_batch_times[pass.time].weight_seconds += seconds;
          break;
        case PassKind::kOptimizer:
          stats_.optimizer_seconds += seconds;
          break;
      }
    }
  }

  // Runs the stage (under CUDA autocast when configured) and times it.
  StageActivations RunStage(ModelStage* stage, const Saved& saved, size_t time) {
    const int start = timeline_.Mark();
    AutocastScope autocast(it_.options_.cuda_autocast_dtype);
    const WeightGradScope weight_grads(saved.weight_grads.get());
    StageActivations out = stage->Forward(saved.in, saved.batch);
    TimePass(start, PassKind::kForward, time);
    return out;
  }

  // The index of the (stage, micro-batch)'s entry in micro_batch_times.
  size_t TimeOf(uint32_t stage, uint32_t micro_batch) {
    const auto [entry, inserted] =
        time_index_.try_emplace({stage, micro_batch}, stats_.micro_batch_times.size());
    if (inserted) {
      stats_.micro_batch_times.push_back({.micro_batch = micro_batch, .stage = stage});
    }
    return entry->second;
  }

  // The micro-batch's recompute mode: its own (MicroBatch.recompute), else
  // the plan's. CheckPlan admitted only none, selective and full.
  absl::StatusOr<std::string> RecomputeOf(uint32_t micro_batch) const {
    VP_ASSIGN_OR_RETURN(const v1::MicroBatch* mb, MicroBatch(micro_batch));
    return mb->recompute().empty() ? plan_.recompute() : mb->recompute();
  }

  // Sets the stage's recompute flags to `mode`. Selective: the graph keeps
  // everything but the attention cores. Full: every layer keeps only its
  // inputs and is re-run in the backward.
  static void SetRecompute(ModelStage* stage, const std::string& mode) {
    stage->SetSelectiveRecompute(mode == "selective");
    stage->SetFullRecompute(mode == "full");
  }

  absl::Status Forward(const v1::Instruction& in) {
    ModelStage* stage = it_.stages_.at(in.stage());
    Saved saved;
    VP_RETURN_IF_ERROR(Inputs(in, &saved.in, &saved.batch));
    // Each forward sets the flags: micro-batches of one plan may differ.
    VP_ASSIGN_OR_RETURN(saved.recompute, RecomputeOf(in.micro_batch()));
    SetRecompute(stage, saved.recompute);
    if (deferred_.count({in.stage(), in.micro_batch()})) {
      saved.weight_grads = std::make_unique<WeightGradStore>();
    }
    const size_t time = TimeOf(in.stage(), in.micro_batch());
    stats_.micro_batch_times[time].profiled_forward_ms = in.forward().profiled_ms();
    StageActivations out = RunStage(stage, saved, time);
    const v1::ForwardPass& f = in.forward();
    if (stage->role().has_head) {
      if (!out.loss.defined()) return absl::InternalError("the last stage produced no loss");
      stats_.has_loss = true;
      // Summed on the device in fp64, read once (OptimizerStep or the end).
      const torch::Tensor loss = out.loss.detach().to(torch::kFloat64);
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
    }
    std::vector<torch::Tensor> outputs{out.hidden};
    if (out.memory.defined()) outputs.push_back(out.memory);
    if (f.output_buffer_ids_size() > 0) {
      if (static_cast<size_t>(f.output_buffer_ids_size()) != outputs.size()) {
        return absl::FailedPreconditionError(absl::StrCat("the stage produces ", outputs.size(),
                                                          " tensors but the plan expects ",
                                                          f.output_buffer_ids_size()));
      }
      for (int k = 0; k < f.output_buffer_ids_size(); ++k) {
        VP_RETURN_IF_ERROR(Store(f.output_buffer_ids(k), outputs[k], f.output_tensors(k)));
      }
    }
    saved.out = std::move(out);
    saved_[{in.stage(), in.micro_batch()}] = std::move(saved);
    return absl::OkStatus();
  }

  absl::Status Backward(const v1::Instruction& in) {
    const auto node = saved_.extract({in.stage(), in.micro_batch()});
    if (node.empty()) {
      return absl::FailedPreconditionError("backward before the forward of this micro-batch");
    }
    Saved saved = std::move(node.mapped());
    ModelStage* stage = it_.stages_.at(in.stage());
    const size_t time = TimeOf(in.stage(), in.micro_batch());
    stats_.micro_batch_times[time].profiled_backward_ms = in.backward().profiled_ms();
    const v1::BackwardPass& b = in.backward();
    if (b.weight_grad_deferred() != (saved.weight_grads != nullptr)) {
      return absl::InternalError("the forward was not prepared for this split backward");
    }
    // Counted by the stage's buckets; the iteration's last backward pass
    // starts each bucket once its gradients are final (not with split
    // backwards: their weights accumulate in the W passes).
    GradientBuckets* buckets = BucketsOf(in.stage());
    if (buckets != nullptr) {
      buckets->BeginPass(/*start_when_final=*/last_backward_[in.stage()] == index_ &&
                         split_stages_.count(in.stage()) == 0);
    }
    // A full recomputation re-runs the layers in this backward and reads
    // the stage's flags then (the attention core it re-runs): they must be
    // the forward's, not those of the stage's latest forward, which may be
    // another micro-batch's mode. The other modes read no flag here.
    SetRecompute(stage, saved.recompute);
    const int start = timeline_.Mark();
    if (stage->role().has_head) {
      saved.out.loss.backward();
    } else {
      std::vector<torch::Tensor> outputs{saved.out.hidden};
      if (saved.out.memory.defined()) outputs.push_back(saved.out.memory);
      if (static_cast<size_t>(b.output_grad_buffer_ids_size()) != outputs.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the stage has ", outputs.size(), " outputs but the plan gives ",
                         b.output_grad_buffer_ids_size(), " gradients"));
      }
      std::vector<torch::Tensor> grads;
      for (uint32_t id : b.output_grad_buffer_ids()) {
        VP_ASSIGN_OR_RETURN(torch::Tensor g, Buffer(id));
        grads.push_back(g.to(it_.options_.compute_dtype));
      }
      torch::autograd::backward(outputs, grads);
    }
    TimePass(start, PassKind::kBackward, time);
    if (buckets != nullptr) buckets->EndPass();
    VP_RETURN_IF_ERROR(MaybeStartBuckets(in.stage()));
    if (saved.weight_grads != nullptr) {
      weight_grad_bytes_ += saved.weight_grads->stored_bytes();
      stats_.weight_grad_peak_bytes = std::max(stats_.weight_grad_peak_bytes, weight_grad_bytes_);
      weight_grads_[{in.stage(), in.micro_batch()}] = std::move(saved.weight_grads);
    }
    // Gradients of the stage's inputs, in the order the activations came.
    std::vector<torch::Tensor> inputs;
    if (saved.in.hidden.defined()) inputs.push_back(saved.in.hidden);
    if (saved.in.memory.defined()) inputs.push_back(saved.in.memory);
    if (static_cast<size_t>(b.input_grad_buffer_ids_size()) != inputs.size() &&
        b.input_grad_buffer_ids_size() > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the stage has ", inputs.size(), " activation inputs but the plan expects ",
                       b.input_grad_buffer_ids_size(), " gradients"));
    }
    for (int k = 0; k < b.input_grad_buffer_ids_size(); ++k) {
      torch::Tensor g = inputs[k].grad();
      if (!g.defined()) g = torch::zeros_like(inputs[k]);
      VP_RETURN_IF_ERROR(Store(b.input_grad_buffer_ids(k), g, b.input_grad_tensors(k)));
    }
    return absl::OkStatus();
  }

  // Applies what the split backward of the same (stage, micro-batch) kept.
  absl::Status WeightGrad(const v1::Instruction& in) {
    const auto node = weight_grads_.extract({in.stage(), in.micro_batch()});
    if (node.empty()) {
      return absl::FailedPreconditionError(
          "weight_grad without a pending backward (weight_grad_deferred) of this micro-batch");
    }
    const size_t time = TimeOf(in.stage(), in.micro_batch());
    stats_.micro_batch_times[time].profiled_weight_ms = in.weight_grad().profiled_ms();
    weight_grad_bytes_ -= node.mapped()->stored_bytes();
    const int start = timeline_.Mark();
    node.mapped()->Apply();
    TimePass(start, PassKind::kWeight, time);
    VP_RETURN_IF_ERROR(MaybeStartBuckets(in.stage()));
    return absl::OkStatus();
  }

  // All-reduce and the optimizer read the gradients: no split backward may
  // still owe its weight gradients (CheckWeightGradOrder guarantees it).
  absl::Status NoWeightGradPending() const {
    if (weight_grads_.empty()) return absl::OkStatus();
    const auto& [stage, micro_batch] = weight_grads_.begin()->first;
    return absl::FailedPreconditionError(absl::StrCat(
        "gradients read before the weight_grad of micro-batch ", micro_batch, " on stage ", stage));
  }

  static std::string Key(const v1::Transfer& t, bool send) {
    return absl::StrCat(send ? "send " : "recv ", t.peer(), " ",
                        absl::StrJoin(t.buffer_ids(), ","));
  }

  absl::Status Start(const v1::Transfer& t, bool send) {
    if (t.buffer_ids_size() != t.tensors_size()) {
      return absl::InvalidArgumentError("transfer with buffer ids and tensors of different counts");
    }
    // Transports order transfers after the compute stream's queued work
    // (transport.h): nothing to wait for here.
    Pending pending;
    for (int k = 0; k < t.buffer_ids_size(); ++k) {
      const uint32_t id = t.buffer_ids(k);
      VP_RETURN_IF_ERROR(CheckId(id));
      torch::Tensor tensor;
      if (send) {
        VP_ASSIGN_OR_RETURN(tensor, Buffer(id));
        if (tensor.sizes() != at::IntArrayRef(Dims(t.tensors(k))) ||
            tensor.scalar_type() != TorchDtype(t.tensors(k).dtype())) {
          return absl::FailedPreconditionError(absl::StrCat(
              "buffer ", id, " does not match the planned ", t.tensors(k).ShortDebugString()));
        }
      } else {
        tensor = torch::empty(Dims(t.tensors(k)), torch::TensorOptions()
                                                      .dtype(TorchDtype(t.tensors(k).dtype()))
                                                      .device(it_.options_.device));
        buffers_[id] = tensor;
      }
      const size_t bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
      absl::StatusOr<std::unique_ptr<Transfer>> transfer =
          send ? it_.transport_->StartSend(t.peer(), tensor.data_ptr(), bytes)
               : it_.transport_->StartRecv(t.peer(), tensor.data_ptr(), bytes);
      if (!transfer.ok()) return transfer.status();
      pending.transfers.push_back(*std::move(transfer));
    }
    pending_[Key(t, send)] = std::move(pending);
    return absl::OkStatus();
  }

  absl::Status Wait(const v1::Instruction& in, const v1::Transfer& t, bool send) {
    const auto node = pending_.extract(Key(t, send));
    if (node.empty()) return absl::FailedPreconditionError("wait without a matching start");
    VP_RETURN_IF_ERROR(MaybeInjectFault(send ? FaultPoint::kInSend : FaultPoint::kInReceive));
    const Clock::time_point start = Clock::now();
    const absl::Time deadline = absl::Now() + it_.options_.wait_timeout;
    for (const std::unique_ptr<Transfer>& transfer : node.mapped().transfers) {
      absl::Status status = transfer->Wait(deadline);
      if (absl::IsCancelled(status)) {  // the transport was aborted (shutdown)
        return absl::CancelledError(absl::StrCat(
            send ? "sending " : "receiving ", v1::CommKind_Name(t.kind()), send ? " to" : " from",
            " rank ", t.peer(), " for micro-batch ", in.micro_batch(), ": ", status.message()));
      }
      if (!status.ok()) {
        // The watchdog's diagnostic.
        return absl::Status(
            status.code(),
            absl::StrCat(send ? "sending " : "receiving ", v1::CommKind_Name(t.kind()),
                         send ? " to" : " from", " rank ", t.peer(), " for micro-batch ",
                         in.micro_batch(), " did not complete (watchdog timeout ",
                         absl::FormatDuration(it_.options_.wait_timeout), "): ", status.message()));
      }
    }
    stats_.communication_seconds += Seconds(Clock::now() - start);
    return absl::OkStatus();
  }

  // Sums each shared parameter's gradient over the stages holding it
  // (docs/models.md, "Shared parameters"), once per iteration, after this
  // rank's last backward and before the data-parallel reduction (which may
  // shard it): every replica then holds the full gradient, gets the same
  // update and stays equal bit for bit. Groups go in one order on every rank.
  absl::Status SumSharedGradients() {
    if (shared_summed_ || it_.options_.shared_parameter_groups.empty()) return absl::OkStatus();
    shared_summed_ = true;
    const Clock::time_point start = Clock::now();
    for (const SharedParameterGroup& group : it_.options_.shared_parameter_groups) {
      torch::Tensor p;
      for (auto& [id, stage] : it_.stages_) {
        const torch::OrderedDict<std::string, torch::Tensor> named = stage->named_parameters();
        if (const torch::Tensor* found = named.find(group.name); found != nullptr) p = *found;
      }
      if (!p.defined()) {
        return absl::InternalError(
            absl::StrCat("shared parameter ", group.name, " is on no stage of this rank"));
      }
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      torch::Tensor flat = p.grad().reshape(-1).to(torch::kFloat32).contiguous();
      VP_RETURN_IF_ERROR(it_.transport_->AllReduceMean(
          std::span<float>(flat.data_ptr<float>(), static_cast<size_t>(flat.numel())),
          group.ranks));
      flat.mul_(static_cast<float>(group.ranks.size()));
      torch::NoGradGuard no_grad;
      p.mutable_grad().copy_(flat.view_as(p));
    }
    const double elapsed = Seconds(Clock::now() - start);
    stats_.communication_seconds += elapsed;
    stats_.all_reduce_seconds += elapsed;
    return absl::OkStatus();
  }

  absl::Status AllReduce(const v1::AllReduceGradients& reduce) {
    VP_RETURN_IF_ERROR(SumSharedGradients());
    std::vector<int> group(reduce.group_ranks().begin(), reduce.group_ranks().end());
    if (group.size() <= 1) return absl::OkStatus();
    VP_RETURN_IF_ERROR(MaybeInjectFault(FaultPoint::kBeforeAllReduce));
    const Clock::time_point start = Clock::now();
    for (uint32_t id : reduce.stages()) {
      const auto stage = it_.stages_.find(id);
      if (stage == it_.stages_.end()) {
        return absl::FailedPreconditionError(absl::StrCat("all-reduce of unknown stage ", id));
      }
      if (OptimizerSharding* sharding = it_.options_.sharding; sharding != nullptr) {
        VP_RETURN_IF_ERROR(sharding->ReduceScatterGradients(
            id, group, *it_.transport_, absl::Now() + it_.options_.wait_timeout, &stats_.buckets,
            &stats_.buckets_started_in_backward));
        continue;
      }
      // Bucketed gradients: their all-reduces started during the backward
      // passes; what is left here is the shared parameters'.
      GradientBuckets* buckets = BucketsOf(id);
      std::set<std::string> rest;
      if (buckets != nullptr) {
        VP_RETURN_IF_ERROR(buckets->Finish(absl::Now() + it_.options_.wait_timeout));
        stats_.buckets += static_cast<int>(buckets->num_buckets());
        stats_.buckets_started_in_backward += buckets->started_in_backward();
        rest = SharedNames(stage->second);
      }
      std::vector<torch::Tensor> grads;
      for (auto& item : stage->second->named_parameters()) {
        if (buckets != nullptr && rest.count(item.key()) == 0) continue;
        torch::Tensor& p = item.value();
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        grads.push_back(p.grad());
      }
      if (grads.empty()) continue;
      // One flat fp32 buffer per stage, on the device (NCCL) or the CPU (Gloo),
      // complete before the transport's stream reads it.
      torch::Tensor flat = torch::cat([&] {
                             std::vector<torch::Tensor> views;
                             for (const torch::Tensor& g : grads) views.push_back(g.reshape(-1));
                             return views;
                           }())
                               .to(torch::kFloat32)
                               .contiguous();
      VP_RETURN_IF_ERROR(it_.transport_->AllReduceMean(
          std::span<float>(flat.data_ptr<float>(), static_cast<size_t>(flat.numel())), group));
      // Each replica's loss is already divided by the global token count, so
      // its gradients are partial sums of the global mean's gradient: the
      // replicas' gradients add up (mean x replicas).
      flat.mul_(static_cast<float>(group.size()));
      int64_t offset = 0;
      torch::NoGradGuard no_grad;
      for (torch::Tensor& g : grads) {
        g.copy_(flat.slice(0, offset, offset + g.numel()).view_as(g));
        offset += g.numel();
      }
    }
    const double elapsed = Seconds(Clock::now() - start);
    stats_.communication_seconds += elapsed;
    stats_.all_reduce_seconds += elapsed;
    stats_.reduce_gradients_seconds += elapsed;
    return absl::OkStatus();
  }

  absl::Status OptimizerStep() {
    if (it_.optimizer_ == nullptr) return absl::FailedPreconditionError("no optimizer configured");
    VP_RETURN_IF_ERROR(SumSharedGradients());
    // Global gradient norm: squared norms summed over the tensor group (on
    // the device), then over the pipeline replica (and the ZeRO group) on
    // the host, after the iteration's one read, which brings the loss sum
    // along. The optimizer's time is its local work: the norm, then the
    // step (the norm's all-reduce waits for the replica's slowest stage).
    const Clock::time_point norm_start = Clock::now();
    OptimizerSharding* sharding = it_.options_.sharding;
    if (sharding != nullptr) VP_RETURN_IF_ERROR(sharding->CheckGradientsReduced());
    torch::Tensor local = it_.optimizer_->LocalSquaredGradNormTensor();
    // Tensor ranks hold disjoint parts of the sharded parameters (and count
    // the replicated ones on their first rank only).
    if (const TensorGroup* tensor = it_.options_.tensor_group;
        tensor != nullptr && tensor->size() > 1) {
      try {
        local = tensor->AllReduceSum(local.to(torch::kFloat32).reshape({1})).reshape({});
      } catch (const c10::Error& e) {
        return absl::UnavailableError(
            absl::StrCat("gradient norm over the tensor group: ", e.what_without_backtrace()));
      }
    }
    const torch::Tensor loss =
        loss_sum_.defined() ? loss_sum_ : torch::zeros({}, local.options().dtype(torch::kFloat64));
    VP_RETURN_IF_ERROR(DrainTensorGroup());
    const torch::Tensor host =
        reads_.Read(torch::stack({local.to(loss.device(), torch::kFloat64), loss}));
    float squared = static_cast<float>(host[0].item<double>());
    if (loss_sum_.defined()) {
      stats_.loss = host[1].item<double>();
      loss_sum_ = torch::Tensor();  // read
    }
    stats_.optimizer_seconds += Seconds(Clock::now() - norm_start);
    Transport* host_transport =
        it_.options_.host_transport != nullptr ? it_.options_.host_transport : it_.transport_;
    if (sharding != nullptr) {  // ZeRO stage 1: the shards' squares add up over the group
      VP_RETURN_IF_ERROR(
          host_transport->AllReduceMean(std::span<float>(&squared, 1), sharding->group()));
      squared *= static_cast<float>(sharding->group().size());
    }
    const std::vector<int>& group = it_.options_.pipeline_group;
    if (group.size() > 1) {
      VP_RETURN_IF_ERROR(host_transport->AllReduceMean(std::span<float>(&squared, 1), group));
      squared *= static_cast<float>(group.size());
    }
    stats_.grad_norm = std::sqrt(static_cast<double>(squared));
    if (it_.options_.before_optimizer_step) it_.options_.before_optimizer_step(stats_);
    const int start = timeline_.Mark();
    stats_.learning_rate = it_.optimizer_->Step(plan_.iteration(), stats_.grad_norm);
    TimePass(start, PassKind::kOptimizer, 0);
    if (sharding != nullptr) {  // every replica's parameters whole again
      const Clock::time_point gather_start = Clock::now();
      VP_RETURN_IF_ERROR(sharding->AllGatherParameters(
          *it_.transport_, absl::Now() + it_.options_.wait_timeout));
      const double gathered = Seconds(Clock::now() - gather_start);
      stats_.communication_seconds += gathered;
      stats_.all_reduce_seconds += gathered;
    }
    return absl::OkStatus();
  }

  PlanInterpreter& it_;
  const v1::ExecutionPlan& plan_;
  std::vector<torch::Tensor> buffers_;
  std::map<uint32_t, v1::LoadInput::Content> contents_;
  std::map<std::pair<uint32_t, uint32_t>, Saved> saved_;  // (stage, micro-batch)
  // Split backwards: the (stage, micro-batch) pairs whose backward defers
  // its weight gradients, and the stores of those that ran, until their
  // weight_grad (with the bytes they hold together).
  std::set<std::pair<uint32_t, uint32_t>> deferred_;
  std::set<uint32_t> split_stages_;  // stages with a split backward
  // Per stage: the instruction index of its last backward, and of its last
  // gradient pass (backward or weight_grad).
  std::map<uint32_t, int> last_backward_;
  std::map<uint32_t, int> last_gradient_pass_;
  // This iteration's bucketed stages (PrepareBuckets).
  std::map<uint32_t, GradientBuckets*> bucketed_;
  std::map<std::pair<uint32_t, uint32_t>, std::unique_ptr<WeightGradStore>> weight_grads_;
  int64_t weight_grad_bytes_ = 0;
  bool shared_summed_ = false;  // SumSharedGradients ran this iteration
  std::map<std::pair<uint32_t, uint32_t>, size_t> time_index_;  // into micro_batch_times
  std::map<std::string, Pending> pending_;
  InputPrefetcher inputs_;
  DeviceTimeline timeline_;
  std::vector<TimedPass> passes_;
  HostReads reads_;
  // The last stage's losses of this iteration, summed on the device (fp64)
  // until read.
  torch::Tensor loss_sum_;
  IterationStats stats_;
  int index_ = 0;
};

PlanInterpreter::PlanInterpreter(std::map<uint32_t, ModelStage*> stages, Transport* transport,
                                 const MicroBatchLoader* loader, TrainingOptimizer* optimizer,
                                 InterpreterOptions options)
    : stages_(std::move(stages)),
      transport_(transport),
      loader_(loader),
      optimizer_(optimizer),
      options_(std::move(options)) {}

absl::StatusOr<IterationStats> PlanInterpreter::Run(const CheckedPlan& plan) {
  IterationRun run(*this, plan.plan());
  return run.Execute();
}

}  // namespace varipipe::executor
