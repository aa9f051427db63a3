#include "common/dataset/jsonl_dataset.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/mix64.h"
#include "common/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace varipipe {
namespace {

absl::Status ParseTokens(const google::protobuf::Struct& object, const char* key, bool required,
                         int64_t vocab_size, const std::string& where, std::vector<int64_t>* out) {
  const auto it = object.fields().find(key);
  if (it == object.fields().end()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat(where, ": no \"", key, "\" array"));
    return absl::OkStatus();
  }
  if (!it->second.has_list_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be an array"));
  }
  for (const google::protobuf::Value& v : it->second.list_value().values()) {
    const double x = v.number_value();
    if (!v.has_number_value() || x < 0 || x != std::floor(x) || x > 9.0e15) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\" must hold non-negative integer token ids"));
    }
    const int64_t id = static_cast<int64_t>(x);
    if (vocab_size > 0 && id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" has token id ", id,
                                                     " outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JsonlSampleDataset>> JsonlSampleDataset::Open(
    const std::string& path, int64_t vocab_size) {
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::unique_ptr<JsonlSampleDataset> d(new JsonlSampleDataset());
  d->path_ = path;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(path, ":", number, " (sample ", d->inputs_.size(), ")");
    google::protobuf::Struct object;
    const auto status = google::protobuf::util::JsonStringToMessage(line, &object);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a JSON object: ", status.message().as_string()));
    }
    std::vector<int64_t> input;
    std::vector<int64_t> target;
    VP_RETURN_IF_ERROR(ParseTokens(object, "input", true, vocab_size, where, &input));
    VP_RETURN_IF_ERROR(ParseTokens(object, "target", false, vocab_size, where, &target));
    if (input.empty() && target.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the sample has no tokens"));
    }
    d->inputs_.push_back(std::move(input));
    d->targets_.push_back(std::move(target));
  }
  if (in.bad()) return ErrnoToStatus(errno, absl::StrCat("read ", path));
  if (d->inputs_.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no samples"));
  return d;
}

SampleLengths JsonlSampleDataset::Lengths(uint64_t index) const {
  return {static_cast<uint32_t>(inputs_[index].size()),
          static_cast<uint32_t>(targets_[index].size())};
}

absl::Status JsonlSampleDataset::ReadSample(uint64_t index, std::vector<int64_t>* input,
                                            std::vector<int64_t>* target) const {
  if (index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": sample ", index, " is beyond its ", size(), " samples"));
  }
  *input = inputs_[index];
  *target = targets_[index];
  return absl::OkStatus();
}

std::string JsonlSampleDataset::Describe() const {
  return absl::StrCat("JSONL dataset ", path_, " (", size(), " samples)");
}

absl::Status SyntheticSampleDataset::ReadSample(uint64_t index, std::vector<int64_t>* input,
                                                std::vector<int64_t>* target) const {
  if (index >= samples_) {
    return absl::OutOfRangeError(
        absl::StrCat("synthetic dataset: sample ", index, " is beyond its ", samples_, " samples"));
  }
  const SampleLengths lengths = mixture_.Sample(index);
  const uint64_t range = vocab_size_ > 1 ? static_cast<uint64_t>(vocab_size_ - 1) : 1;
  // One pattern over input then target (the target continues the input), so
  // a model can learn it: an arithmetic progression with step 1 or 2 from a
  // random start, or one of 8 motifs of the dataset (2-5 tokens, fixed by
  // the seed) repeated from a random phase.
  const uint64_t h = Mix64(seed_ ^ Mix64(index));
  const uint64_t start = Mix64(h ^ 1) % range;
  const bool progression = (h & 1) == 0;
  const uint64_t step = 1 + (h >> 1) % 2;
  const uint64_t motif = (h >> 2) % 8;
  const uint64_t motif_length = 2 + Mix64(seed_ ^ (motif + 1)) % 4;
  const auto token = [&](uint64_t k) {
    const uint64_t v =
        progression ? (start + step * k) % range
                    : Mix64(seed_ ^ Mix64(100 + motif * 8 + (start + k) % motif_length)) % range;
    return 1 + static_cast<int64_t>(v);
  };
  input->resize(lengths.input);
  for (uint32_t k = 0; k < lengths.input; ++k) (*input)[k] = token(k);
  target->resize(lengths.target);
  for (uint32_t k = 0; k < lengths.target; ++k) (*target)[k] = token(lengths.input + k);
  return absl::OkStatus();
}

std::string SyntheticSampleDataset::Describe() const {
  return absl::StrCat("synthetic ", mixture_name_, " dataset (seed ", seed_, ", ", samples_, " samples)");
}

}  // namespace varipipe
