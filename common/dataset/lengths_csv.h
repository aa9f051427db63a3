// Lengths files: the sample lengths of a dataset as CSV, one
// 'input_len,target_len' line per sample (varipipe-plan --lengths). Blank
// lines and '#' comments are skipped, and so is a header line before the
// first sample (one that names "input"). Errors name the file and line.
#ifndef VARIPIPE_COMMON_DATASET_LENGTHS_CSV_H_
#define VARIPIPE_COMMON_DATASET_LENGTHS_CSV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dataset/synthetic_mixture.h"

namespace varipipe {

// Sample i's lengths at index i. `source` names the text in errors; at least
// one sample is required.
absl::StatusOr<std::vector<SampleLengths>> ParseLengthsCsv(absl::string_view text,
                                                           absl::string_view source);

// The same for a file.
absl::StatusOr<std::vector<SampleLengths>> ReadLengthsCsv(const std::string& path);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_LENGTHS_CSV_H_
