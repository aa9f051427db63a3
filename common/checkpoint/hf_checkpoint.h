// A Hugging Face checkpoint directory: `config.json` and either one
// `model.safetensors` or shards named by `model.safetensors.index.json`
// (its "weight_map": tensor name -> shard file). Opening checks that
// config.json is there (hf_model_config.h reads it) and reads the index and
// (lazily, on the first lookup in each) the shards' headers; tensors are
// read by byte range (safetensors_file.h).
//
// Errors name the directory (absolute) and file: not a directory, no
// config.json, no weights file, an index that is not JSON or names a shard
// that is missing, a tensor the index places in a shard that lacks it.
#ifndef VARIPIPE_COMMON_CHECKPOINT_HF_CHECKPOINT_H_
#define VARIPIPE_COMMON_CHECKPOINT_HF_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/safetensors_file.h"

namespace varipipe {

class HuggingFaceCheckpoint {
 public:
  // `dir` relative: under the working directory; dir() is absolute.
  static absl::StatusOr<HuggingFaceCheckpoint> Open(const std::string& dir);

  HuggingFaceCheckpoint(HuggingFaceCheckpoint&&) noexcept;
  HuggingFaceCheckpoint& operator=(HuggingFaceCheckpoint&&) noexcept;
  ~HuggingFaceCheckpoint();

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }

  // Every tensor name in the checkpoint (the index's keys when sharded,
  // else the file's header), sorted.
  std::vector<std::string> TensorNames() const;

  struct Located {
    const SafetensorsFile* file;
    const SafetensorsTensor* tensor;
  };
  // The tensor and its file (opening the shard's header on first use);
  // NotFound naming the directory when the checkpoint has no such tensor.
  absl::StatusOr<Located> Find(std::string_view name);

  // Tensor bytes read through Find's files so far, and the shard files
  // opened (for the test that a rank reads only its own stages).
  uint64_t bytes_read() const;
  std::vector<std::string> opened_files() const;

 private:
  HuggingFaceCheckpoint();

  struct State;
  std::string dir_;
  bool sharded_ = false;
  std::unique_ptr<State> state_;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CHECKPOINT_HF_CHECKPOINT_H_
