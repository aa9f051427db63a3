// What an attention core is told about which keys each query may see, as
// one value: causal (no mask), a dense boolean mask, or the variable-length
// layout of packed rows; plus an optional additive score bias (T5 v1.1's
// relative positions). Each core reads the kind it gets instead of guessing
// from a tensor's dtype and shape.
//
//   kCausal          query i sees keys 0..i of its row (sq == sk). With
//                    padding at the end of each sample this is the padded
//                    sample's mask at every real query.
//   kDenseMask       mask() [b or 1, 1, sq, sk], true = may attend.
//   kVariableLength  layout() (variable_length_layout.h): each sample's
//                    queries see only its own keys, causally or not; outputs
//                    at padding queries are zero.
//   kContextParallel context() (context_parallel_attention.h): one lane's
//                    part of a micro-batch split across its context group
//                    context_group(): its local queries attend causally to
//                    their samples' keys gathered from every lane; outputs
//                    at padding queries are zero.
// bias(): undefined, or [B, heads, sq, sk] added to the scores (B 1 or b).
#ifndef VARIPIPE_EXECUTOR_MODEL_ATTENTION_INPUT_H_
#define VARIPIPE_EXECUTOR_MODEL_ATTENTION_INPUT_H_

#include <torch/torch.h>

#include <string>

#include "executor/model/context_parallel_attention.h"
#include "executor/model/tensor_group.h"
#include "executor/model/variable_length_layout.h"

namespace varipipe::executor {

class AttentionInput {
 public:
  enum class Kind { kCausal, kDenseMask, kVariableLength, kContextParallel };

  // Causal.
  AttentionInput() = default;
  static AttentionInput Causal() { return AttentionInput(); }
  // REQUIRES: `mask` is a defined boolean tensor of four dimensions.
  static AttentionInput DenseMask(torch::Tensor mask);
  static AttentionInput VariableLength(c10::intrusive_ptr<VariableLengthLayout> layout);
  // `group` (not owned) outlives every use of the input, backward included.
  static AttentionInput ContextParallel(c10::intrusive_ptr<ContextParallelInput> input,
                                        const TensorGroup* group);

  // This input with score bias `bias` (undefined: none).
  AttentionInput WithBias(torch::Tensor bias) const;

  Kind kind() const { return kind_; }
  bool is_causal() const { return kind_ == Kind::kCausal; }
  const torch::Tensor& mask() const;                // REQUIRES: kDenseMask
  const VariableLengthLayout& layout() const;       // REQUIRES: kVariableLength
  const c10::intrusive_ptr<VariableLengthLayout>& layout_ptr() const;  // likewise
  const torch::Tensor& bias() const { return bias_; }
  // REQUIRES: kContextParallel.
  const c10::intrusive_ptr<ContextParallelInput>& context() const;
  const TensorGroup* context_group() const;

  // Keeps this input (without its bias, which autograd functions take as an
  // input of their own) in an autograd context's saved_data under `key`,
  // and reads it back.
  void SaveTo(torch::autograd::AutogradContext* ctx, const std::string& key) const;
  static AttentionInput LoadFrom(torch::autograd::AutogradContext* ctx, const std::string& key);

 private:
  Kind kind_ = Kind::kCausal;
  torch::Tensor mask_;
  c10::intrusive_ptr<VariableLengthLayout> layout_;
  c10::intrusive_ptr<ContextParallelInput> context_;
  const TensorGroup* context_group_ = nullptr;
  torch::Tensor bias_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_ATTENTION_INPUT_H_
