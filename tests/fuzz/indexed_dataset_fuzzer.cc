// Megatron-LM indexed datasets (data.format MEGATRON_INDEXED): the input is
// a 2-byte little-endian length N, then N bytes of .idx, then the .bin; the
// pair is written to files, opened with a vocabulary of 512, every sample
// read back, and the lengths drawn into mini-batches.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/dataset/indexed_dataset.h"
#include "tests/fuzz/fuzz_scratch.h"
#include "tests/fuzz/sampler_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace varipipe;
  if (size < 2) return 0;
  const size_t idx_size = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
  fuzz::Scratch::Write("data.idx", data + 2, idx_size);
  fuzz::Scratch::Write("data.bin", data + 2 + idx_size, size - 2 - idx_size);
  absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> dataset =
      IndexedSampleDataset::Open(fuzz::Scratch::Dir() + "/data", "", 512);
  if (!dataset.ok()) return 0;
  std::vector<int64_t> input;
  std::vector<int64_t> target;
  for (uint64_t i = 0; i < (*dataset)->size(); ++i) {
    const absl::Status read = (*dataset)->ReadSample(i, &input, &target);
    if (!read.ok() && read.code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (read.ok() && (*dataset)->Lengths(i).input != input.size()) std::abort();
  }
  fuzz::DrawMiniBatches((*dataset)->AllLengths());
  return 0;
}
