// Megatron-LM indexed datasets: the .idx/.bin pairs its preprocess_data.py
// writes (docs/datasets.md describes the layout). Files are memory-mapped;
// opening reads and checks the index only, so planners pay for lengths
// alone.
#ifndef VARIPIPE_COMMON_DATASET_INDEXED_DATASET_H_
#define VARIPIPE_COMMON_DATASET_INDEXED_DATASET_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/sample_dataset.h"

namespace varipipe {

// One memory-mapped .idx/.bin pair (`prefix`.idx, `prefix`.bin).
class IndexedFile {
 public:
  // Checks the header, the sizes/pointers against the .bin size and the
  // document index; errors name the file and, where it applies, the
  // sequence.
  static absl::StatusOr<std::unique_ptr<IndexedFile>> Open(const std::string& prefix);
  ~IndexedFile();
  IndexedFile(const IndexedFile&) = delete;
  IndexedFile& operator=(const IndexedFile&) = delete;

  uint64_t sequences() const { return sizes_.size(); }
  uint64_t documents() const { return document_index_.empty() ? 0 : document_index_.size() - 1; }
  uint32_t Length(uint64_t sequence) const { return static_cast<uint32_t>(sizes_[sequence]); }
  // Appends sequence `sequence`'s tokens to `out`.
  void Read(uint64_t sequence, std::vector<int64_t>* out) const;
  // Sequence `sequence`'s Length() * element_size() bytes in the mapped
  // .bin file (checked to lie inside it when opening).
  const uint8_t* SequenceBytes(uint64_t sequence) const { return data_ + pointers_[sequence]; }
  // Bytes per token in the .bin file, and Megatron's dtype code.
  int element_size() const { return element_size_; }
  int dtype_code() const { return dtype_code_; }
  const std::string& prefix() const { return prefix_; }

 private:
  IndexedFile() = default;

  std::string prefix_;
  int dtype_code_ = 0;
  int element_size_ = 0;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_index_;
  const uint8_t* data_ = nullptr;  // mapped .bin
  size_t data_size_ = 0;
};

// Writes a .idx/.bin pair sequence by sequence (memory: 12 bytes per
// sequence, not the tokens): PREFIX.{bin,idx}.tmp while it runs, renamed
// into place by Commit; a writer destroyed without Commit removes its
// temporary files, so a failed conversion leaves nothing half-written.
class IndexedFileWriter {
 public:
  // uint16_tokens: 2-byte tokens (ids below 65536; Megatron's choice for
  // vocabularies below 65500), else int32.
  static absl::StatusOr<std::unique_ptr<IndexedFileWriter>> Create(const std::string& prefix,
                                                                   bool uint16_tokens);
  ~IndexedFileWriter();
  IndexedFileWriter(const IndexedFileWriter&) = delete;
  IndexedFileWriter& operator=(const IndexedFileWriter&) = delete;

  // Errors name the prefix and the id that does not fit.
  absl::Status Append(std::span<const int64_t> tokens);
  absl::Status Commit();

  uint64_t sequences() const { return sizes_.size(); }
  uint64_t tokens() const { return tokens_; }

 private:
  IndexedFileWriter() = default;

  std::string prefix_;
  bool uint16_ = false;
  bool committed_ = false;
  std::ofstream bin_;
  std::string buffer_;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  int64_t offset_ = 0;
  uint64_t tokens_ = 0;
};

// Writes a .idx/.bin pair atomically (temporary files, then rename). Token
// type: uint16 when every id fits (Megatron's choice below 65500), else int32.
absl::Status WriteIndexedFile(const std::string& prefix,
                              const std::vector<std::vector<int64_t>>& sequences,
                              int64_t vocab_size);

// Samples from one indexed file (inputs only; targets empty) or a pair of
// files with equal counts (inputs and targets).
class IndexedSampleDataset final : public SampleDataset {
 public:
  // `target_prefix` may be empty. vocab_size 0 disables the id check.
  static absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> Open(
      const std::string& input_prefix, const std::string& target_prefix, int64_t vocab_size);
  // The same over files already open; `targets` may be null. Fails when the
  // files' sample counts differ.
  static absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> FromFiles(
      std::unique_ptr<IndexedFile> inputs, std::unique_ptr<IndexedFile> targets,
      int64_t vocab_size);

  uint64_t size() const override { return inputs_->sequences(); }
  SampleLengths Lengths(uint64_t index) const override;
  absl::Status ReadSample(uint64_t index, std::vector<int64_t>* input,
                          std::vector<int64_t>* target) const override;
  std::string Describe() const override;
  // Both files' token-id ranges (token_range.h; cached beside each index).
  absl::Status CheckTokenIds(const TokenScanOptions& options) const override;

 private:
  std::unique_ptr<IndexedFile> inputs_;
  std::unique_ptr<IndexedFile> targets_;  // may be null
  int64_t vocab_size_ = 0;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_INDEXED_DATASET_H_
