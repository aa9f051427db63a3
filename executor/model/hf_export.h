// LLAMA and T5V11 stages out as a Hugging Face checkpoint directory that
// `transformers` loads (LlamaForCausalLM, T5ForConditionalGeneration):
// config.json, model.safetensors.index.json and one shard per transformer
// layer (model-<k>-of-<n>.safetensors, the embedding with the first layer,
// the final norm and head with the last; T5V11: encoder layers first, the
// encoder's final norm with its last layer), names as in docs/models.md.
// A shared parameter's replicas are not exported: its owner's copy is.
// A job started from a Hugging Face checkpoint (training.init_from) exports
// that checkpoint's config.json and tokenizer files with the new weights.
//
// The shards depend on the model alone, never on the pipeline split, and
// every shard's tensors live on exactly one stage, so ranks export their
// own stages in parallel and the files equal a single process's export
// byte for byte (safetensors_writer.h writes deterministically).
//
//   ExportHuggingFaceShards(dir, spec, my_stages, v1::BFLOAT16);  // each rank
//   ExportHuggingFaceIndex(dir, spec, v1::BFLOAT16, init_from);   // one rank
#ifndef VARIPIPE_EXECUTOR_MODEL_HF_EXPORT_H_
#define VARIPIPE_EXECUTOR_MODEL_HF_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "varipipe/v1/tensor.pb.h"

namespace varipipe::executor {

// The export's shard (0-based) of a Hugging Face tensor name; there is one
// shard per layer (T5V11: of both stacks).
absl::StatusOr<int> ExportShardOf(const ModelSpec& spec, const std::string& hf_name);
std::string ExportShardName(int shard, int shards);

// Writes every shard whose tensors `stages` hold, in `dtype` (FLOAT32,
// BFLOAT16 or FLOAT16). The directory must exist.
absl::Status ExportHuggingFaceShards(const std::string& dir, const ModelSpec& spec,
                                     const std::vector<ModelStage*>& stages, v1::DType dtype);

// Writes config.json and model.safetensors.index.json. `init_from` (the
// job's training.init_from, absolute) non-empty: config.json is that
// checkpoint's, carried over with the export's dtype, and its tokenizer and
// generation files are copied (common/checkpoint/hf_export_config.h), so
// the export replaces it wherever it was used. Empty: config.json from the
// spec, the model's own values (LLAMA's max_position_embeddings:
// model.max_position_embeddings, unset: data.max_sequence_length); no
// tokenizer.
absl::Status ExportHuggingFaceIndex(const std::string& dir, const ModelSpec& spec, v1::DType dtype,
                                    const std::string& init_from = "");

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_HF_EXPORT_H_
