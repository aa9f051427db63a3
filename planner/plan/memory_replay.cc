#include "planner/plan/memory_replay.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace varipipe::planner {

double TensorSpecBytes(const v1::TensorSpec& spec) {
  double element = 0;
  switch (spec.dtype()) {
    case v1::FLOAT32:
      element = 4;
      break;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      element = 2;
      break;
    case v1::INT64:
      element = 8;
      break;
    default:
      break;
  }
  double bytes = element;
  for (int64_t d : spec.dims()) bytes *= static_cast<double>(d);
  return bytes;
}

namespace {

class Replay {
 public:
  Replay(const v1::ExecutionPlan& plan, const StageCostTable& costs) : plan_(plan), costs_(costs) {}

  absl::StatusOr<ReplayedPeak> Run() {
    for (index_ = 0; index_ < plan_.instructions_size(); ++index_) {
      if (absl::Status s = Step(plan_.instructions(index_)); !s.ok()) return s;
    }
    return peak_;
  }

 private:
  absl::Status Step(const v1::Instruction& in) {
    switch (in.op_case()) {
      case v1::Instruction::kLoadInput:
        return Allocate(in.load_input().buffer_ids(), in.load_input().tensors());
      case v1::Instruction::kRecvStart:
        return Allocate(in.recv_start().buffer_ids(), in.recv_start().tensors());
      case v1::Instruction::kFreeBuffer:
        for (uint32_t id : in.free_buffer().buffer_ids()) live_.erase(id);  // taken ones are gone
        Recount();
        return absl::OkStatus();
      case v1::Instruction::kForward: {
        absl::StatusOr<const StageOpCost*> c = CostOf(in);
        if (!c.ok()) return c.status();
        Take(in.forward().input_buffer_ids());
        const double transient = (*c)->peak_bytes - (*c)->stored_bytes;
        Add((*c)->stored_bytes + transient);
        Add(-transient);
        return Allocate(in.forward().output_buffer_ids(), in.forward().output_tensors());
      }
      case v1::Instruction::kBackward: {
        absl::StatusOr<const StageOpCost*> c = CostOf(in);
        if (!c.ok()) return c.status();
        const bool deferred = in.backward().weight_grad_deferred();
        Take(in.backward().output_grad_buffer_ids());
        const double running = (*c)->peak_bytes - (*c)->stored_bytes +
                               (deferred ? (*c)->split_backward_extra_bytes() : 0.0);
        Add(running);
        Add(-running -
            (deferred ? (*c)->stored_bytes - (*c)->weight_stored_bytes : (*c)->stored_bytes));
        return Allocate(in.backward().input_grad_buffer_ids(), in.backward().input_grad_tensors());
      }
      case v1::Instruction::kWeightGrad: {
        absl::StatusOr<const StageOpCost*> c = CostOf(in);
        if (!c.ok()) return c.status();
        Add(-(*c)->weight_stored_bytes);
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  }

  absl::StatusOr<const StageOpCost*> CostOf(const v1::Instruction& in) const {
    if (in.stage() >= costs_.size() || in.micro_batch() >= costs_[in.stage()].size()) {
      return absl::InvalidArgumentError(absl::StrCat("instruction ", index_, " computes stage ",
                                                     in.stage(), " micro-batch ", in.micro_batch(),
                                                     ", which the planner's costs do not cover"));
    }
    return &costs_[in.stage()][in.micro_batch()];
  }

  template <typename Ids, typename Specs>
  absl::Status Allocate(const Ids& ids, const Specs& specs) {
    if (ids.size() != specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("instruction ", index_, " has ", ids.size(),
                                                     " buffers and ", specs.size(),
                                                     " tensor specs"));
    }
    for (int k = 0; k < ids.size(); ++k) live_[ids[k]] = TensorSpecBytes(specs[k]);
    Recount();
    return absl::OkStatus();
  }

  // The buffers become part of the op's own bytes.
  template <typename Ids>
  void Take(const Ids& ids) {
    for (uint32_t id : ids) live_.erase(id);
    Recount();
  }

  void Add(double bytes) {
    own_ += bytes;
    Check();
  }

  void Recount() {
    buffers_ = 0;
    for (const auto& [id, bytes] : live_) buffers_ += bytes;
    Check();
  }

  void Check() {
    if (own_ + buffers_ > peak_.bytes) peak_ = {own_ + buffers_, index_};
  }

  const v1::ExecutionPlan& plan_;
  const StageCostTable& costs_;
  int index_ = 0;
  double own_ = 0;      // what the ops keep
  double buffers_ = 0;  // sum of live_
  absl::flat_hash_map<uint32_t, double> live_;
  ReplayedPeak peak_;
};

}  // namespace

absl::StatusOr<ReplayedPeak> ReplayActivationMemory(const v1::ExecutionPlan& plan,
                                                    const StageCostTable& costs) {
  return Replay(plan, costs).Run();
}

}  // namespace varipipe::planner
