// Hugging Face weights into a rank's model stages: the name mapping of
// docs/models.md ("Weight layout"), the check of config.json against the
// job's model, and the load itself, which reads only the tensors of the
// stages given (by byte range) and converts F32, F16 and BF16 to each
// parameter's dtype.
//
//   VP_ASSIGN_OR_RETURN(HuggingFaceCheckpoint ckpt, HuggingFaceCheckpoint::Open(dir));
//   VP_RETURN_IF_ERROR(CheckHuggingFaceConfig(ckpt, spec));
//   VP_RETURN_IF_ERROR(LoadHuggingFaceWeights(ckpt, spec, stages));
//
// Architectures: LLAMA (LlamaForCausalLM) and T5V11 (T5ForConditionalGeneration
// of T5 v1.1 / FLAN-T5). MEGATRON GPT and T5 have no Hugging Face
// counterpart here and are refused.
#ifndef VARIPIPE_EXECUTOR_MODEL_HF_WEIGHTS_H_
#define VARIPIPE_EXECUTOR_MODEL_HF_WEIGHTS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/hf_checkpoint.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"

namespace varipipe::executor {

// The Hugging Face name of a stage parameter ("encoder_layer_3.q_weight" ->
// "model.layers.3.self_attn.q_proj.weight"); InvalidArgument for a name
// the mapping does not know or an architecture without one.
absl::StatusOr<std::string> HuggingFaceName(const ModelSpec& spec, std::string_view name);

// Every Hugging Face tensor name of the whole model, sorted.
absl::StatusOr<std::vector<std::string>> HuggingFaceNames(const ModelSpec& spec);

// config.json against the job's model: architecture (model_type), sizes,
// norm epsilon, rotary base and scaling, tied embeddings,
// max_position_embeddings when the job sets it (T5V11: sizes,
// epsilon, relative position buckets and distance). The first
// difference is an InvalidArgument naming the config.json field, its value
// and the job's ("config.json: hidden_size is 4096 but the job's
// model.hidden_size is 2048").
absl::Status CheckHuggingFaceConfig(const HuggingFaceCheckpoint& checkpoint, const ModelSpec& spec);

// Copies every parameter of `stages` from the checkpoint. Errors, each
// naming the file and tensor: a tensor missing, of another shape, or of a
// dtype other than F32, F16 or BF16; a truncated file. With
// `reject_unexpected`, a checkpoint tensor the whole model has no place
// for is an error too (rotary inv_freq buffers and a tied model's
// lm_head.weight are accepted and ignored). Nothing is copied unless every
// tensor of the stages checks out. Stages of a tensor group (tensor
// parallelism) read each whole tensor and keep their rank's part of it
// (tensor_shard.h).
absl::Status LoadHuggingFaceWeights(HuggingFaceCheckpoint& checkpoint, const ModelSpec& spec,
                                    const std::vector<ModelStage*>& stages,
                                    bool reject_unexpected = true);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_HF_WEIGHTS_H_
