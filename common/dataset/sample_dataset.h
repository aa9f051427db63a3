// SampleDataset: the interface every dataset reader implements. A sample is
// a pair of token sequences: the input (GPT: the prompt, or the whole
// sequence) and the target (the response; empty for plain language-model
// data). Planners read only lengths; executors read tokens.
//
// Implementations: IndexedSampleDataset (Megatron-LM .idx/.bin),
// JsonlSampleDataset, SyntheticSampleDataset. OpenSampleDataset picks one
// from a job config.
//
// Thread safety: implementations are immutable after opening; all methods
// may be called concurrently.
#ifndef VARIPIPE_COMMON_DATASET_SAMPLE_DATASET_H_
#define VARIPIPE_COMMON_DATASET_SAMPLE_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/synthetic_mixture.h"
#include "common/dataset/token_range.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;

  virtual uint64_t size() const = 0;
  // Lengths of sample `index` (REQUIRES: index < size()).
  virtual SampleLengths Lengths(uint64_t index) const = 0;
  // The tokens of sample `index`. Errors name the file and the sample: out of
  // range, unreadable data, or a token id >= vocab_size (when vocab_size > 0).
  virtual absl::Status ReadSample(uint64_t index, std::vector<int64_t>* input,
                                  std::vector<int64_t>* target) const = 0;
  // Where the data comes from, for messages.
  virtual std::string Describe() const = 0;
  // Fails (INVALID_ARGUMENT, naming the file, the id, a sample holding it
  // and model.vocab_size) when any token id lies outside [0, vocab_size),
  // so bad data is refused at start-up instead of when a sample is read.
  // OK by default: JSONL is checked when loaded, synthetic ids are in range.
  virtual absl::Status CheckTokenIds(const TokenScanOptions& options) const;

  // All lengths (convenience for samplers and planners).
  std::vector<SampleLengths> AllLengths() const;
};

// The dataset of a validated job config (data.format, data.path,
// data.target_path, data.seed, model.vocab_size). Errors opening a file
// start with its field ("data.path: open /jobs/a/data/in.idx: ...").
absl::StatusOr<std::unique_ptr<SampleDataset>> OpenSampleDataset(const v1::JobConfig& config);

// SyntheticMixture::Named's name of a data.synthetic_mixture value.
std::string SyntheticMixtureName(v1::SyntheticMixtureKind kind);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_SAMPLE_DATASET_H_
