#include "common/dataset/sample_dataset.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/jsonl_dataset.h"
#include "common/status.h"

namespace varipipe {

std::string SyntheticMixtureName(v1::SyntheticMixtureKind kind) {
  switch (kind) {
    case v1::DOCUMENTS:
      return "documents";
    case v1::LONG_TAIL:
      return "long_tail";
    default:
      return "flan";
  }
}

absl::Status SampleDataset::CheckTokenIds(const TokenScanOptions& /*options*/) const {
  return absl::OkStatus();
}

std::vector<SampleLengths> SampleDataset::AllLengths() const {
  std::vector<SampleLengths> lengths(size());
  for (uint64_t i = 0; i < lengths.size(); ++i) lengths[i] = Lengths(i);
  return lengths;
}

absl::StatusOr<std::unique_ptr<SampleDataset>> OpenSampleDataset(const v1::JobConfig& config) {
  const v1::DataConfig& d = config.data();
  const int64_t vocab = config.model().vocab_size();
  switch (d.format()) {
    case v1::SYNTHETIC:
      return std::unique_ptr<SampleDataset>(new SyntheticSampleDataset(
          d.seed(), d.synthetic_num_samples(), vocab, SyntheticMixtureName(d.synthetic_mixture())));
    case v1::JSONL: {
      absl::StatusOr<std::unique_ptr<JsonlSampleDataset>> jsonl =
          JsonlSampleDataset::Open(d.path(), vocab);
      if (!jsonl.ok()) return Annotate(jsonl.status(), "data.path");
      return std::unique_ptr<SampleDataset>(std::move(*jsonl));
    }
    case v1::MEGATRON_INDEXED: {
      absl::StatusOr<std::unique_ptr<IndexedFile>> inputs = IndexedFile::Open(d.path());
      if (!inputs.ok()) return Annotate(inputs.status(), "data.path");
      std::unique_ptr<IndexedFile> targets;
      if (!d.target_path().empty()) {
        absl::StatusOr<std::unique_ptr<IndexedFile>> opened = IndexedFile::Open(d.target_path());
        if (!opened.ok()) return Annotate(opened.status(), "data.target_path");
        targets = *std::move(opened);
      }
      absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> indexed =
          IndexedSampleDataset::FromFiles(*std::move(inputs), std::move(targets), vocab);
      if (!indexed.ok()) return Annotate(indexed.status(), "data.target_path");
      return std::unique_ptr<SampleDataset>(std::move(*indexed));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("data.format ", v1::DatasetFormat_Name(d.format()), " has no reader"));
  }
}

}  // namespace varipipe
