// What a Hugging Face export (`--export_hf`, varipipe-export-hf) writes
// beside its weights when the job started from a Hugging Face checkpoint
// (training.init_from), so that the export replaces that checkpoint
// wherever it was used: the checkpoint's own config.json, changed only where
// training changed the model (the weights' dtype), and the files that
// describe the model apart from its weights (generation defaults, the
// tokenizer), copied as they are. Everything a serving stack reads from
// config.json (max_position_embeddings, bos_token_id, eos_token_id,
// rope_scaling, n_positions, ...) is then the checkpoint's, never derived
// from the job's data limits.
//
// A job without training.init_from has no such source: the exporter writes
// config.json from the model section (executor/model/hf_export.h).
//
// Thread safety: pure functions; CarryHuggingFaceModelFiles writes files.
#ifndef VARIPIPE_COMMON_CHECKPOINT_HF_EXPORT_CONFIG_H_
#define VARIPIPE_COMMON_CHECKPOINT_HF_EXPORT_CONFIG_H_

#include <array>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varipipe {

// The files of a Hugging Face model directory that describe the model apart
// from config.json and the weights; an export copies those the checkpoint
// it started from holds, byte for byte.
inline constexpr std::array<absl::string_view, 5> kHuggingFaceModelFiles = {
    "generation_config.json", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json"};

// The config.json text of an export whose weights are `torch_dtype`
// ("float32", "bfloat16" or "float16"), from the text of the config.json of
// the checkpoint it started from. Every field as `source` has it, in its
// order, except the weights' dtype: `torch_dtype` (transformers before 5)
// and `dtype` (transformers 5), whichever `source` has, name `torch_dtype`;
// with neither, `torch_dtype` is added. InvalidArgument naming
// `source_name` when `source` is not a JSON object.
absl::StatusOr<std::string> CarriedHuggingFaceConfig(absl::string_view source,
                                                     absl::string_view source_name,
                                                     absl::string_view torch_dtype);

// Writes `out`/config.json from `init_from`/config.json
// (CarriedHuggingFaceConfig) and copies kHuggingFaceModelFiles that
// `init_from` holds into `out`. Errors reading `init_from` start with
// "training.init_from: " and name the absolute path they concern
// ("training.init_from: /models/base: not a directory"). REQUIRES: `out`
// exists.
absl::Status CarryHuggingFaceModelFiles(const std::string& init_from, const std::string& out,
                                        absl::string_view torch_dtype);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CHECKPOINT_HF_EXPORT_CONFIG_H_
