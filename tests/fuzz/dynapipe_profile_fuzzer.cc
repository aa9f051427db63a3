// DynaPipe profile directories (planner.cost_model_path naming a directory):
// the input is one or more files, each introduced by a line
//   ==> microbench_tp1_hs32_ah4_kv8_ffhs128_sl64_mbs1.txt
// (the file name; text before the first such line is ignored, and an input
// without one is a single file of that name). The files are written to a
// directory, read as a DynaPipe profile directory, and the cost model used
// as the planner uses it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "planner/cost/dynapipe_profile_reader.h"
#include "tests/fuzz/cost_model_fuzz.h"
#include "tests/fuzz/fuzz_scratch.h"

namespace {

constexpr absl::string_view kMarker = "==> ";
constexpr int kMaxFiles = 64;

// False when `name` cannot be a file of the directory.
bool IsFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.size() < 200 &&
         !absl::StrContains(name, '/') && !absl::StrContains(name, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using varipipe::fuzz::Scratch;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  Scratch::Clear();
  if (!absl::StartsWith(input, kMarker) && !absl::StrContains(input, absl::StrCat("\n", kMarker))) {
    Scratch::Write("microbench_tp1_hs32_ah4_kv8_ffhs128_sl64_mbs1.txt", data, size);
  } else {
    std::string name;
    std::string body;
    int files = 0;
    const auto flush = [&] {
      if (IsFileName(name) && files < kMaxFiles) {
        Scratch::Write(name, reinterpret_cast<const uint8_t*>(body.data()), body.size());
        ++files;
      }
      body.clear();
    };
    for (absl::string_view line : absl::StrSplit(input, '\n')) {
      if (absl::StartsWith(line, kMarker)) {
        flush();
        name = std::string(line.substr(kMarker.size()));
      } else if (!name.empty()) {
        absl::StrAppend(&body, line, "\n");
      }
    }
    flush();
  }
  absl::StatusOr<varipipe::planner::CostModel> model =
      varipipe::planner::ReadDynaPipeProfileDirectory(Scratch::Dir());
  if (!model.ok()) return 0;
  varipipe::fuzz::ExerciseCostModel(*model);
  return 0;
}
