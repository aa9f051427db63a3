#include "executor/model/attention_input.h"

namespace varipipe::executor {

AttentionInput AttentionInput::DenseMask(torch::Tensor mask) {
  TORCH_CHECK(mask.defined() && mask.scalar_type() == torch::kBool && mask.dim() == 4,
              "a dense attention mask is a boolean [b, 1, queries, keys] tensor");
  AttentionInput input;
  input.kind_ = Kind::kDenseMask;
  input.mask_ = std::move(mask);
  return input;
}

AttentionInput AttentionInput::VariableLength(c10::intrusive_ptr<VariableLengthLayout> layout) {
  TORCH_CHECK(layout, "a variable-length attention input needs its layout");
  AttentionInput input;
  input.kind_ = Kind::kVariableLength;
  input.layout_ = std::move(layout);
  return input;
}

AttentionInput AttentionInput::ContextParallel(c10::intrusive_ptr<ContextParallelInput> input,
                                               const TensorGroup* group) {
  TORCH_CHECK(input && group != nullptr && group->size() == input->split().group_size() &&
                  group->index() == input->split().index(),
              "a context-parallel attention input needs its split and its group");
  AttentionInput out;
  out.kind_ = Kind::kContextParallel;
  out.context_ = std::move(input);
  out.context_group_ = group;
  return out;
}

const c10::intrusive_ptr<ContextParallelInput>& AttentionInput::context() const {
  TORCH_CHECK(kind_ == Kind::kContextParallel, "attention input is not context-parallel");
  return context_;
}

const TensorGroup* AttentionInput::context_group() const {
  TORCH_CHECK(kind_ == Kind::kContextParallel, "attention input is not context-parallel");
  return context_group_;
}

AttentionInput AttentionInput::WithBias(torch::Tensor bias) const {
  AttentionInput input = *this;
  input.bias_ = std::move(bias);
  return input;
}

const torch::Tensor& AttentionInput::mask() const {
  TORCH_CHECK(kind_ == Kind::kDenseMask, "attention input has no dense mask");
  return mask_;
}

const VariableLengthLayout& AttentionInput::layout() const {
  TORCH_CHECK(kind_ == Kind::kVariableLength, "attention input has no variable-length layout");
  return *layout_;
}

const c10::intrusive_ptr<VariableLengthLayout>& AttentionInput::layout_ptr() const {
  TORCH_CHECK(kind_ == Kind::kVariableLength, "attention input has no variable-length layout");
  return layout_;
}

void AttentionInput::SaveTo(torch::autograd::AutogradContext* ctx, const std::string& key) const {
  ctx->saved_data[key + ".kind"] = static_cast<int64_t>(kind_);
  if (kind_ == Kind::kDenseMask) ctx->saved_data[key + ".mask"] = mask_;
  if (kind_ == Kind::kVariableLength) {
    ctx->saved_data[key + ".layout"] = c10::IValue::make_capsule(
        c10::intrusive_ptr<torch::CustomClassHolder>(layout_));
  }
  if (kind_ == Kind::kContextParallel) {
    ctx->saved_data[key + ".context"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(context_));
    ctx->saved_data[key + ".context_group"] = reinterpret_cast<int64_t>(context_group_);
  }
}

AttentionInput AttentionInput::LoadFrom(torch::autograd::AutogradContext* ctx,
                                        const std::string& key) {
  switch (static_cast<Kind>(ctx->saved_data.at(key + ".kind").toInt())) {
    case Kind::kCausal:
      return Causal();
    case Kind::kDenseMask:
      return DenseMask(ctx->saved_data.at(key + ".mask").toTensor());
    case Kind::kVariableLength:
      return VariableLength(c10::static_intrusive_pointer_cast<VariableLengthLayout>(
          ctx->saved_data.at(key + ".layout").toCapsule()));
    case Kind::kContextParallel:
      return ContextParallel(
          c10::static_intrusive_pointer_cast<ContextParallelInput>(
              ctx->saved_data.at(key + ".context").toCapsule()),
          reinterpret_cast<const TensorGroup*>(ctx->saved_data.at(key + ".context_group").toInt()));
  }
  TORCH_CHECK(false, "unknown attention input kind saved under ", key);
}

}  // namespace varipipe::executor
