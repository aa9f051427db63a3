// JSONL datasets (data.format JSONL): loaded from a file with a vocabulary
// of 512, every sample read back, and the lengths drawn into mini-batches.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/dataset/jsonl_dataset.h"
#include "tests/fuzz/fuzz_scratch.h"
#include "tests/fuzz/sampler_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace varipipe;
  const std::string path = fuzz::Scratch::Write("data.jsonl", data, size);
  absl::StatusOr<std::unique_ptr<JsonlSampleDataset>> dataset = JsonlSampleDataset::Open(path, 512);
  if (!dataset.ok()) return 0;
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  for (uint64_t i = 0; i < (*dataset)->size(); ++i) {
    if (!(*dataset)->ReadSample(i, &input, &target).ok()) std::abort();
    const SampleLengths lengths = (*dataset)->Lengths(i);
    if (lengths.input != input.size() || lengths.target != target.size()) std::abort();
  }
  fuzz::DrawMiniBatches((*dataset)->AllLengths());
  return 0;
}
