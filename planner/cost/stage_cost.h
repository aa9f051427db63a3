#ifndef VARIPIPE_PLANNER_COST_STAGE_COST_H_
#define VARIPIPE_PLANNER_COST_STAGE_COST_H_

namespace varipipe::planner {

// Costs of one pipeline stage (device, or model chunk with interleaving)
// for one micro-batch: what the cost model gives (MicroBatchCostModel::
// EvaluateStages) and the split backward adds, for schedules, the simulator
// and the validator's memory replay.
struct StageOpCost {
  double forward_ms = 0;
  double backward_ms = 0;
  double stored_bytes = 0;
  double peak_bytes = 0;
  // Bytes sent to the next stage after the forward (activations; T5
  // decoder stages also forward the encoder output), and to the previous
  // stage after the backward (gradients of the same tensors).
  double activation_bytes = 0;
  double gradient_bytes = 0;
  // Split backward (op.h): W's time (B then takes backward_ms - weight_ms)
  // and the bytes B keeps for W (the linear layers' inputs and output
  // gradients), held from B's end to W's end. Set by
  // BackwardSplitRule::Split (planner/schedule/backward_split.h).
  double weight_ms = 0;
  double weight_stored_bytes = 0;

  double input_grad_ms() const { return backward_ms - weight_ms; }
  // What a split B holds beyond its forward's stored bytes at its peak: the
  // kept pairs build up layer by layer while the transient of the layer
  // being differentiated is live, and only the part beyond what the forward
  // stored is new (full recomputation: almost all of it; otherwise the
  // stored activations freed as B proceeds cover it).
  double split_backward_extra_bytes() const {
    return weight_stored_bytes > stored_bytes ? weight_stored_bytes - stored_bytes : 0;
  }
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_STAGE_COST_H_
