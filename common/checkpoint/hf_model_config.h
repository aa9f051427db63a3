// The job's model section for a Hugging Face config.json, so that nobody
// writes it by hand: `varipipe-plan --model_from_hf DIR` prints it.
// Llama-family configs (model_type "llama") as LLAMA models and T5 v1.1 /
// FLAN-T5 configs (model_type "t5") as T5V11 ones; anything the
// architecture cannot express (biases, another activation, a rotary scaling
// other than Llama 3.1's, the original T5's relu MLP or tied head) is an
// error naming the field.
#ifndef VARIPIPE_COMMON_CHECKPOINT_HF_MODEL_CONFIG_H_
#define VARIPIPE_COMMON_CHECKPOINT_HF_MODEL_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

// `path` is config.json or the directory holding it.
absl::StatusOr<v1::ModelConfig> ModelConfigFromHuggingFace(const std::string& path);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CHECKPOINT_HF_MODEL_CONFIG_H_
