#include "planner/plan/plan_builder.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/rank_layout.h"
#include "common/deterministic_bytes.h"
#include "common/plan_contract/format_version.h"
#include "common/plan_contract/micro_batch_rows.h"
#include "planner/parallel.h"

namespace varipipe::planner {
namespace {

using StageKey = std::pair<uint32_t, uint32_t>;  // (stage, micro-batch)

v1::TensorSpec Spec(std::initializer_list<int64_t> dims, v1::DType dtype) {
  v1::TensorSpec spec;
  for (int64_t d : dims) spec.add_dims(d);
  spec.set_dtype(dtype);
  return spec;
}

// Builds the plan of one rank (device `d` of replica `r`).
class RankPlanBuilder {
 public:
  RankPlanBuilder(const PlanBuildOptions& o, const ReplicaPlan& replica, uint32_t dp_rank,
                  uint32_t device, uint32_t lane)
      : o_(o), replica_(replica), dp_rank_(dp_rank), device_(device), lane_(lane) {}

  absl::StatusOr<v1::ExecutionPlan> Build() {
    SetHeader();
    SetMicroBatches();
    SetPredictions();
    if (absl::Status s = AddInstructions(); !s.ok()) return s;
    v1::Instruction* reduce = plan_.add_instructions();
    for (uint32_t s : plan_.stages()) reduce->mutable_all_reduce()->add_stages(s);
    for (int r : Ranks().DataParallelGroup(device_)) {
      reduce->mutable_all_reduce()->add_group_ranks(r);
    }
    v1::Instruction* step = plan_.add_instructions();
    for (uint32_t s : plan_.stages()) step->mutable_optimizer_step()->add_stages(s);
    plan_.set_num_buffers(next_buffer_);
    return std::move(plan_);
  }

 private:
  // Who the plan is for and how it was made.
  void SetHeader() {
    plan_.set_format_version(plan_contract::kPlanFormatVersion);
    plan_.set_job_id(o_.job_id);
    plan_.set_iteration(o_.iteration);
    plan_.set_rank(RankOf(device_));
    plan_.set_dp_rank(static_cast<int32_t>(dp_rank_));
    plan_.set_pp_rank(static_cast<int32_t>(device_));
    if (o_.context > 1) {
      plan_.set_context_parallel(o_.context);
      plan_.set_context_rank(lane_);
    }
    for (uint32_t c = 0; c < replica_.shape.chunks; ++c) {
      plan_.add_stages(replica_.shape.Stage(device_, c));
    }
    plan_.set_recompute(o_.recompute);
    plan_.set_global_target_tokens(o_.global_target_tokens);
    plan_.set_schedule(o_.schedule);
    plan_.set_partition_method(o_.partition_method);
    if (o_.layers.stages() > 0) {
      const v1::StageLayoutConfig layout = LayerLayoutToConfig(o_.layers);
      plan_.mutable_stage_layers()->Add(layout.layers().begin(), layout.layers().end());
      plan_.set_encoder_stages(layout.encoder_stages());
    }
  }

  void SetMicroBatches() {
    for (size_t i = 0; i < replica_.micro_batches.size(); ++i) {
      const PlannedMicroBatch& mb = replica_.micro_batches[i];
      v1::MicroBatch* out = plan_.add_micro_batches();
      out->set_id(static_cast<uint32_t>(i));
      for (uint64_t id : mb.sample_ids) out->add_sample_ids(id);
      out->set_input_len(mb.input_len);
      out->set_target_len(mb.target_len);
      out->set_real_input_tokens(mb.real_input_tokens);
      out->set_real_target_tokens(mb.real_target_tokens);
      for (uint32_t r : mb.row_starts) out->add_row_starts(r);
      if (!mb.row_starts.empty()) out->set_packed_attention(mb.packed_attention);
      for (uint32_t n : mb.input_lens) out->add_sample_input_lens(n);
      for (uint32_t n : mb.target_lens) out->add_sample_target_lens(n);
      for (uint32_t n : mb.input_offsets) out->add_sample_input_offsets(n);
      for (uint32_t n : mb.target_offsets) out->add_sample_target_offsets(n);
      if (o_.context > 1) {
        out->mutable_context()->set_split(mb.context_split);
        out->mutable_context()->set_lane(mb.context_split ? 0 : mb.context_lane);
      }
      if (!mb.recompute.empty() && mb.recompute != o_.recompute) {
        out->set_recompute(mb.recompute);
      }
    }
  }

  // What the planner predicted, for calibration and the executor's reports.
  void SetPredictions() {
    plan_.set_predicted_iteration_ms(o_.predicted_iteration_ms);
    plan_.set_predicted_makespan_ms(o_.predicted_makespan_ms);
    plan_.set_predicted_overhead_ms(o_.predicted_overhead_ms);
    plan_.set_calibration_version(o_.calibration_version);
    const auto at = [&](const std::vector<double>& v) {
      return device_ < v.size() ? v[device_] : 0.0;
    };
    plan_.set_predicted_all_reduce_ms(at(o_.predicted_all_reduce_ms));
    plan_.set_predicted_optimizer_ms(at(o_.predicted_optimizer_ms));
    plan_.set_profiled_all_reduce_ms(at(o_.profiled_all_reduce_ms));
    plan_.set_profiled_optimizer_ms(at(o_.profiled_optimizer_ms));
    const size_t rank = static_cast<size_t>(RankOf(device_));
    if (rank < o_.predicted_activation_peak_bytes.size()) {
      plan_.set_predicted_activation_peak_bytes(o_.predicted_activation_peak_bytes[rank]);
    }
  }

  // The device's program (compute and transfers) as instructions.
  absl::Status AddInstructions() {
    for (const ProgramEntry& e : replica_.comm.programs[device_]) {
      if (e.step == ProgramStep::kCompute && e.op.kind == OpKind::kWeight) {
        split_.insert({e.op.stage, e.op.micro_batch});
      }
    }
    for (const ProgramEntry& e : replica_.comm.programs[device_]) {
      absl::Status status;
      switch (e.step) {
        case ProgramStep::kCompute:
          status = e.op.kind == OpKind::kForward    ? Forward(e.op)
                   : e.op.kind == OpKind::kBackward ? Backward(e.op)
                                                    : Weight(e.op);
          break;
        case ProgramStep::kRecvStart:
          status = RecvStart(e.transfer);
          break;
        case ProgramStep::kRecvWait:
          status = Wait(e.transfer, /*send=*/false);
          break;
        case ProgramStep::kSendStart:
          status = SendStart(e.transfer);
          break;
        case ProgramStep::kSendWait:
          status = Wait(e.transfer, /*send=*/true);
          break;
      }
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  RankLayout Ranks() const {
    return {.pipeline = o_.pipeline, .data = o_.data_parallel, .context = std::max(1u, o_.context)};
  }
  // The plan rank of `device` of this lane.
  int32_t RankOf(uint32_t device) const { return Ranks().Rank(dp_rank_, device, lane_); }
  uint32_t Stages() const { return replica_.shape.stages(); }
  bool IsDecoder(uint32_t stage) const { return o_.encoder_decoder && stage >= o_.encoder_stages; }

  // What stage `stage` sends forward.
  std::vector<v1::TensorSpec> ActivationSpecs(uint32_t stage, uint32_t mb) const {
    const PlannedMicroBatch& m = replica_.micro_batches[mb];
    const int64_t b = Rows(mb);
    const int64_t h = o_.hidden;
    if (IsDecoder(stage)) {
      return {Spec({b, m.target_len, h}, o_.dtype), Spec({b, m.input_len, h}, o_.dtype)};
    }
    return {Spec({b, m.input_len, h}, o_.dtype)};
  }

  // Rows of micro-batch `mb`'s tensors, from the plan's own micro-batch
  // (SetMicroBatches ran first).
  int64_t Rows(uint32_t mb) const {
    return static_cast<int64_t>(plan_contract::MicroBatchRows(plan_.micro_batches(mb)));
  }

  uint32_t Allocate() { return next_buffer_++; }
  std::vector<uint32_t> Allocate(size_t n) {
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < n; ++i) ids.push_back(Allocate());
    return ids;
  }
  void Free(const std::vector<uint32_t>& ids, const Op& op) {
    if (ids.empty()) return;
    v1::Instruction* i = Add(op.micro_batch, op.stage);
    for (uint32_t id : ids) i->mutable_free_buffer()->add_buffer_ids(id);
  }
  v1::Instruction* Add(uint32_t mb, uint32_t stage) {
    v1::Instruction* i = plan_.add_instructions();
    i->set_micro_batch(mb);
    i->set_stage(stage);
    return i;
  }
  static std::vector<uint32_t> Take(std::map<StageKey, std::vector<uint32_t>>& map, StageKey key) {
    auto it = map.find(key);
    if (it == map.end()) return {};
    std::vector<uint32_t> ids = std::move(it->second);
    map.erase(it);
    return ids;
  }

  absl::Status Forward(const Op& op) {
    const uint32_t st = op.stage;
    const uint32_t mb = op.micro_batch;
    const PlannedMicroBatch& m = replica_.micro_batches[mb];
    std::vector<uint32_t> inputs;
    if (st > 0) {
      inputs = replica_.shape.DeviceOf(st - 1) == device_ ? Take(forward_outputs_, {st - 1, mb})
                                                          : Take(received_activations_, {st, mb});
      if (inputs.empty()) {
        return absl::InternalError(
            absl::StrCat("plan builder: no input for ", op.ToString(), " on device ", device_));
      }
    }
    // Tokens and labels this stage loads.
    std::vector<std::pair<v1::LoadInput::Content, v1::TensorSpec>> loads;
    const int64_t b = Rows(mb);
    const bool single = Stages() == 1;
    if (st == 0) loads.push_back({v1::LoadInput::INPUT_TOKENS, Spec({b, m.input_len}, v1::INT64)});
    if (o_.encoder_decoder && (st == o_.encoder_stages || single)) {
      loads.push_back({v1::LoadInput::DECODER_INPUT_TOKENS, Spec({b, m.target_len}, v1::INT64)});
    }
    if (st + 1 == Stages()) {
      loads.push_back({v1::LoadInput::LABELS,
                       Spec({b, o_.encoder_decoder ? m.target_len : m.input_len}, v1::INT64)});
    }
    std::vector<uint32_t> loaded;
    if (!loads.empty()) {
      v1::Instruction* load = Add(mb, st);
      for (const auto& [content, spec] : loads) {
        const uint32_t id = Allocate();
        loaded.push_back(id);
        load->mutable_load_input()->add_buffer_ids(id);
        *load->mutable_load_input()->add_tensors() = spec;
        load->mutable_load_input()->add_contents(content);
      }
    }
    v1::ForwardPass* f = Add(mb, st)->mutable_forward();
    f->set_profiled_ms(Profiled(replica_.micro_batches[mb].profiled_forward_ms, st));
    for (uint32_t id : inputs) f->add_input_buffer_ids(id);
    for (uint32_t id : loaded) f->add_input_buffer_ids(id);
    if (st + 1 < Stages()) {
      const std::vector<v1::TensorSpec> specs = ActivationSpecs(st, mb);
      std::vector<uint32_t> outputs = Allocate(specs.size());
      for (size_t k = 0; k < specs.size(); ++k) {
        f->add_output_buffer_ids(outputs[k]);
        *f->add_output_tensors() = specs[k];
      }
      forward_outputs_[{st, mb}] = outputs;
      if (replica_.shape.DeviceOf(st + 1) != device_) sent_outputs_[{st, mb}] = outputs;
    }
    // The forward keeps what its backward needs; the buffers go.
    inputs.insert(inputs.end(), loaded.begin(), loaded.end());
    Free(inputs, op);
    return absl::OkStatus();
  }

  static double Profiled(const std::vector<double>& per_stage, uint32_t stage) {
    return stage < per_stage.size() ? per_stage[stage] : 0.0;
  }

  absl::Status Backward(const Op& op) {
    const uint32_t st = op.stage;
    const uint32_t mb = op.micro_batch;
    std::vector<uint32_t> output_grads;
    if (st + 1 < Stages()) {
      output_grads = replica_.shape.DeviceOf(st + 1) == device_
                         ? Take(input_grads_, {st + 1, mb})
                         : Take(received_gradients_, {st, mb});
      if (output_grads.empty()) {
        return absl::InternalError(
            absl::StrCat("plan builder: no gradient for ", op.ToString(), " on device ", device_));
      }
    }
    v1::BackwardPass* bw = Add(mb, st)->mutable_backward();
    const PlannedMicroBatch& m = replica_.micro_batches[mb];
    const bool split = split_.count({st, mb}) > 0;
    bw->set_profiled_ms(Profiled(m.profiled_backward_ms, st) -
                        (split ? Profiled(m.profiled_weight_ms, st) : 0.0));
    bw->set_weight_grad_deferred(split);
    for (uint32_t id : output_grads) bw->add_output_grad_buffer_ids(id);
    if (st > 0) {
      const std::vector<v1::TensorSpec> specs = ActivationSpecs(st - 1, mb);
      std::vector<uint32_t> grads = Allocate(specs.size());
      for (size_t k = 0; k < specs.size(); ++k) {
        bw->add_input_grad_buffer_ids(grads[k]);
        *bw->add_input_grad_tensors() = specs[k];
      }
      input_grads_[{st, mb}] = grads;
    }
    Free(output_grads, op);
    return absl::OkStatus();
  }

  absl::Status Weight(const Op& op) {
    v1::WeightGradPass* w = Add(op.micro_batch, op.stage)->mutable_weight_grad();
    w->set_profiled_ms(
        Profiled(replica_.micro_batches[op.micro_batch].profiled_weight_ms, op.stage));
    return absl::OkStatus();
  }

  v1::Transfer TransferMessage(const PlannedTransfer& t, const std::vector<uint32_t>& ids,
                               bool send) const {
    v1::Transfer msg;
    msg.set_kind(t.activation() ? v1::ACTIVATION : v1::GRADIENT);
    msg.set_peer(RankOf(send ? t.to : t.from));
    for (uint32_t id : ids) msg.add_buffer_ids(id);
    const uint32_t spec_stage = t.activation() ? t.producer.stage : t.producer.stage - 1;
    for (const v1::TensorSpec& s : ActivationSpecs(spec_stage, t.producer.micro_batch)) {
      *msg.add_tensors() = s;
    }
    return msg;
  }

  absl::Status RecvStart(uint32_t id) {
    const PlannedTransfer& t = replica_.comm.transfers[id];
    const uint32_t spec_stage = t.activation() ? t.producer.stage : t.producer.stage - 1;
    const std::vector<uint32_t> ids =
        Allocate(ActivationSpecs(spec_stage, t.producer.micro_batch).size());
    const StageKey consumer{t.consumer_stage(), t.producer.micro_batch};
    (t.activation() ? received_activations_ : received_gradients_)[consumer] = ids;
    transfers_[id] = TransferMessage(t, ids, /*send=*/false);
    *Add(t.producer.micro_batch, t.consumer_stage())->mutable_recv_start() = transfers_[id];
    return absl::OkStatus();
  }

  absl::Status SendStart(uint32_t id) {
    const PlannedTransfer& t = replica_.comm.transfers[id];
    const StageKey key{t.producer.stage, t.producer.micro_batch};
    const auto& source = t.activation() ? sent_outputs_ : input_grads_;
    const auto it = source.find(key);
    if (it == source.end()) {
      return absl::InternalError(
          absl::StrCat("plan builder: nothing to send for ", t.producer.ToString()));
    }
    send_buffers_[id] = it->second;
    if (!t.activation()) input_grads_.erase(key);
    transfers_[id] = TransferMessage(t, send_buffers_[id], /*send=*/true);
    *Add(t.producer.micro_batch, t.producer.stage)->mutable_send_start() = transfers_[id];
    return absl::OkStatus();
  }

  absl::Status Wait(uint32_t id, bool send) {
    const PlannedTransfer& t = replica_.comm.transfers[id];
    const auto it = transfers_.find(id);
    if (it == transfers_.end()) {
      return absl::InternalError(absl::StrCat("plan builder: wait before start of transfer ", id));
    }
    const uint32_t stage = send ? t.producer.stage : t.consumer_stage();
    v1::Instruction* i = Add(t.producer.micro_batch, stage);
    *(send ? i->mutable_send_wait() : i->mutable_recv_wait()) = it->second;
    if (send) {
      // The sent buffers are released once the transfer completed.
      Free(send_buffers_[id], Op{t.producer.kind, t.producer.stage, t.producer.micro_batch});
      if (t.activation()) {
        sent_outputs_.erase({t.producer.stage, t.producer.micro_batch});
        forward_outputs_.erase({t.producer.stage, t.producer.micro_batch});
      }
    }
    return absl::OkStatus();
  }

  const PlanBuildOptions& o_;
  const ReplicaPlan& replica_;
  const uint32_t dp_rank_;
  const uint32_t device_;
  const uint32_t lane_;
  v1::ExecutionPlan plan_;
  uint32_t next_buffer_ = 0;
  std::map<StageKey, std::vector<uint32_t>> forward_outputs_;
  std::map<StageKey, std::vector<uint32_t>> sent_outputs_;
  std::map<StageKey, std::vector<uint32_t>> received_activations_;
  std::map<StageKey, std::vector<uint32_t>> received_gradients_;
  std::map<StageKey, std::vector<uint32_t>> input_grads_;
  std::map<uint32_t, v1::Transfer> transfers_;
  std::map<uint32_t, std::vector<uint32_t>> send_buffers_;
  std::set<StageKey> split_;  // (stage, micro-batch) with a W: split backward
};

}  // namespace

absl::StatusOr<std::vector<v1::ExecutionPlan>> BuildExecutionPlans(
    const PlanBuildOptions& options, const std::vector<ReplicaPlan>& replicas, int threads) {
  const uint32_t lanes = std::max(1u, options.context);
  if (replicas.size() != size_t{options.data_parallel} * lanes) {
    return absl::InvalidArgumentError(absl::StrCat("plan builder: ", replicas.size(),
                                                   " replicas for data parallel ",
                                                   options.data_parallel, " x context ", lanes));
  }
  for (uint32_t r = 0; r < replicas.size(); ++r) {
    const ReplicaPlan& replica = replicas[r];
    if (replica.shape.devices != options.pipeline ||
        replica.comm.programs.size() != options.pipeline ||
        replica.micro_batches.size() != replica.shape.micro_batches) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan builder: replica ", r, " does not match the pipeline"));
    }
  }
  // One slot per rank: the result does not depend on `threads`.
  const RankLayout layout{
      .pipeline = options.pipeline, .data = options.data_parallel, .context = lanes};
  const size_t ranks = static_cast<size_t>(layout.plan_ranks());
  std::vector<absl::StatusOr<v1::ExecutionPlan>> built(ranks, absl::UnknownError("not built"));
  ParallelFor(ranks, threads, [&](size_t rank) {
    const uint32_t r = layout.DpRank(static_cast<int>(rank));
    const uint32_t d = layout.PpRank(static_cast<int>(rank));
    const uint32_t k = layout.ContextRank(static_cast<int>(rank));
    RankPlanBuilder builder(options, replicas[size_t{r} * lanes + k], r, d, k);
    built[rank] = builder.Build();
  });
  std::vector<v1::ExecutionPlan> plans;
  plans.reserve(ranks);
  for (absl::StatusOr<v1::ExecutionPlan>& plan : built) {
    if (!plan.ok()) return plan.status();
    plans.push_back(*std::move(plan));
  }
  return plans;
}

std::string SerializePlanDeterministically(const v1::ExecutionPlan& plan) {
  return DeterministicBytes(plan);
}

}  // namespace varipipe::planner
