// JSON-lines datasets for small data: one object per line,
//   {"input": [token ids], "target": [token ids]}
// ("target" may be omitted: an empty target). Loaded into memory; errors
// name the file and line.
#ifndef VARIPIPE_COMMON_DATASET_JSONL_DATASET_H_
#define VARIPIPE_COMMON_DATASET_JSONL_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/sample_dataset.h"

namespace varipipe {

class JsonlSampleDataset final : public SampleDataset {
 public:
  // vocab_size 0 disables the token id check (done while loading).
  static absl::StatusOr<std::unique_ptr<JsonlSampleDataset>> Open(const std::string& path,
                                                                  int64_t vocab_size);

  uint64_t size() const override { return inputs_.size(); }
  SampleLengths Lengths(uint64_t index) const override;
  absl::Status ReadSample(uint64_t index, std::vector<int64_t>* input,
                          std::vector<int64_t>* target) const override;
  std::string Describe() const override;

  const std::vector<std::vector<int64_t>>& inputs() const { return inputs_; }
  const std::vector<std::vector<int64_t>>& targets() const { return targets_; }

 private:
  std::string path_;
  std::vector<std::vector<int64_t>> inputs_;
  std::vector<std::vector<int64_t>> targets_;
};

// Tokens of the synthetic dataset (FLAN-like or documents-like lengths): lengths from SyntheticMixture,
// token ids a deterministic function of (seed, sample, position) in
// [1, vocab_size): each sample is one learnable pattern (an arithmetic
// progression or a repeated motif) that its target continues.
class SyntheticSampleDataset final : public SampleDataset {
 public:
  // `mixture`: "flan" or "documents" (SyntheticMixture::Named).
  SyntheticSampleDataset(uint64_t seed, uint64_t samples, int64_t vocab_size,
                         const std::string& mixture = "flan")
      : mixture_(SyntheticMixture::Named(mixture, seed)),
        mixture_name_(mixture == "documents" ? "documents-like" : "FLAN-like"),
        seed_(seed),
        samples_(samples),
        vocab_size_(vocab_size) {}

  uint64_t size() const override { return samples_; }
  SampleLengths Lengths(uint64_t index) const override { return mixture_.Sample(index); }
  absl::Status ReadSample(uint64_t index, std::vector<int64_t>* input,
                          std::vector<int64_t>* target) const override;
  std::string Describe() const override;

 private:
  SyntheticMixture mixture_;
  std::string mixture_name_;
  uint64_t seed_;
  uint64_t samples_;
  int64_t vocab_size_;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_JSONL_DATASET_H_
