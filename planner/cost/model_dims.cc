#include "planner/cost/model_dims.h"

namespace varipipe::planner {

const char* RecomputeName(Recompute mode) {
  switch (mode) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "unknown";
}

const char* AttentionKernelName(AttentionKernel kernel) {
  return kernel == AttentionKernel::kFused ? "FUSED" : "EXPLICIT";
}

const char* ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama:
      return "LLAMA";
    case Architecture::kT5V11:
      return "T5V11";
    case Architecture::kMegatron:
      break;
  }
  return "MEGATRON";
}

AttentionKernel AttentionKernelFromProto(v1::AttentionKernel kernel) {
  return kernel == v1::FUSED ? AttentionKernel::kFused : AttentionKernel::kExplicit;
}

v1::AttentionKernel AttentionKernelToProto(AttentionKernel kernel) {
  return kernel == AttentionKernel::kFused ? v1::FUSED : v1::EXPLICIT;
}

ModelDims ModelDimsFromConfig(const v1::ModelConfig& model) {
  ModelDims dims;
  dims.kind = model.kind() == v1::T5 ? ModelKind::kT5 : ModelKind::kGpt;
  dims.encoder_layers = model.num_layers();
  dims.decoder_layers = dims.encoder_decoder() ? model.num_decoder_layers() : 0;
  dims.hidden = model.hidden_size();
  dims.heads = model.num_attention_heads();
  dims.kv_channels = model.kv_channels();
  dims.ffn = model.ffn_hidden_size();
  dims.vocab = model.vocab_size();
  dims.dtype_bytes = model.dtype() == v1::FLOAT32 ? 4 : 2;
  dims.attention_kernel = AttentionKernelFromProto(model.attention_kernel());
  // Unspecified is MEGATRON (config.proto); the LLAMA-only and T5V11-only
  // fields are validated away for the other architectures
  // (common/config/job_config.cc).
  switch (model.architecture()) {
    case v1::LLAMA:
      dims.architecture = Architecture::kLlama;
      break;
    case v1::T5V11:
      dims.architecture = Architecture::kT5V11;
      break;
    default:
      dims.architecture = Architecture::kMegatron;
      break;
  }
  dims.kv_heads =
      dims.llama() && model.num_key_value_heads() != 0 ? model.num_key_value_heads() : dims.heads;
  dims.tied_embeddings = dims.llama() && model.tie_word_embeddings();
  // The job config's default is 32 (ApplyJobConfigDefaults); a cost-model
  // file's model section may leave it out.
  if (dims.t5v11()) {
    dims.relative_attention_buckets =
        model.relative_attention_num_buckets() != 0 ? model.relative_attention_num_buckets() : 32;
  }
  return dims;
}

ModelDims ModelDimsFromJob(const v1::JobConfig& config) {
  ModelDims dims = ModelDimsFromConfig(config.model());
  dims.loss_chunk_tokens = config.training().loss_chunk_tokens();
  return dims;
}

Recompute RecomputeFromProto(v1::RecomputeMode mode) {
  switch (mode) {
    case v1::RECOMPUTE_SELECTIVE:
      return Recompute::kSelective;
    case v1::RECOMPUTE_FULL:
      return Recompute::kFull;
    default:
      return Recompute::kNone;
  }
}

v1::RecomputeMode RecomputeToProto(Recompute mode) {
  switch (mode) {
    case Recompute::kSelective:
      return v1::RECOMPUTE_SELECTIVE;
    case Recompute::kFull:
      return v1::RECOMPUTE_FULL;
    case Recompute::kNone:
      break;
  }
  return v1::RECOMPUTE_NONE;
}

}  // namespace varipipe::planner
