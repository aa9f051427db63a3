// Lengths files (varipipe-plan --lengths): parsed, then drawn into
// mini-batches by the training sampler as varipipe-plan does, for a GPT and
// a T5 job.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/dataset/lengths_csv.h"
#include "tests/fuzz/sampler_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::vector<varipipe::SampleLengths>> lengths = varipipe::ParseLengthsCsv(
      absl::string_view(reinterpret_cast<const char*>(data), size), "lengths.csv");
  if (!lengths.ok()) return 0;
  varipipe::fuzz::DrawMiniBatches(*lengths);
  return 0;
}
