#include "common/dataset/lengths_csv.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace varipipe {

absl::StatusOr<std::vector<SampleLengths>> ParseLengthsCsv(absl::string_view text,
                                                           absl::string_view source) {
  std::vector<SampleLengths> samples;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    uint32_t input = 0;
    uint32_t target = 0;
    const bool ok = fields.size() == 2 &&
                    absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[0]), &input) &&
                    absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[1]), &target);
    if (!ok) {
      if (samples.empty() && absl::StrContains(line, "input")) continue;  // header
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", number, ": expected 'input_len,target_len' (non-negative integers), got '",
          line, "'"));
    }
    samples.push_back({input, target});
  }
  if (samples.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no samples"));
  return samples;
}

absl::StatusOr<std::vector<SampleLengths>> ReadLengthsCsv(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseLengthsCsv(*text, path);
}

}  // namespace varipipe
