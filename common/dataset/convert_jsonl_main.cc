// varipipe-convert-jsonl: converts a JSONL dataset ({"input": [...],
// "target": [...]} per line) into a pair of Megatron-LM indexed datasets,
// PREFIX_input.{idx,bin} and PREFIX_target.{idx,bin}, and prints the config
// lines that use them.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/binary_main.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/jsonl_dataset.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, input, "", "JSONL file to convert. Required.");
ABSL_FLAG(std::string, output_prefix, "",
          "Output prefix: writes PREFIX_input.{idx,bin} and PREFIX_target.{idx,bin}. Required.");
ABSL_FLAG(int64_t, vocab_size, 0,
          "Vocabulary size: token ids must be below it (0: no check); below 65500 the files "
          "store uint16 tokens, else int32.");

namespace {

constexpr char kUsage[] =
    "Converts a JSONL dataset into Megatron-LM indexed datasets (.idx/.bin).\n"
    "\n"
    "Usage: varipipe-convert-jsonl --input data.jsonl --output-prefix out/data "
    "[--vocab-size N]";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-convert-jsonl", kUsage);
  if (!args.empty() || absl::GetFlag(FLAGS_input).empty() ||
      absl::GetFlag(FLAGS_output_prefix).empty()) {
    std::fprintf(stderr,
                 "varipipe-convert-jsonl: --input and --output-prefix are required (try --help)\n");
    return varipipe::kExitUsage;
  }
  const int64_t vocab = absl::GetFlag(FLAGS_vocab_size);
  spdlog::info("reading {}", absl::GetFlag(FLAGS_input));
  absl::StatusOr<std::unique_ptr<varipipe::JsonlSampleDataset>> jsonl =
      varipipe::JsonlSampleDataset::Open(absl::GetFlag(FLAGS_input), vocab);
  if (!jsonl.ok()) {
    std::fprintf(stderr, "varipipe-convert-jsonl: %s\n",
                 std::string(jsonl.status().message()).c_str());
    return varipipe::kExitUsage;
  }
  const std::string prefix = absl::GetFlag(FLAGS_output_prefix);
  for (const auto& [suffix, sequences] :
       {std::pair<const char*, const std::vector<std::vector<int64_t>>*>{"_input",
                                                                         &(*jsonl)->inputs()},
        {"_target", &(*jsonl)->targets()}}) {
    const std::string out = prefix + suffix;
    if (absl::Status s = varipipe::WriteIndexedFile(out, *sequences, vocab); !s.ok()) {
      std::fprintf(stderr, "varipipe-convert-jsonl: %s\n", std::string(s.message()).c_str());
      return varipipe::kExitFailure;
    }
    spdlog::info("wrote {}.idx and {}.bin", out, out);
  }
  std::printf(
      "converted %llu samples; use them with\n"
      "  \"data\": {\"format\": \"MEGATRON_INDEXED\", \"path\": \"%s_input\", "
      "\"target_path\": \"%s_target\", ...}\n",
      static_cast<unsigned long long>((*jsonl)->size()), prefix.c_str(), prefix.c_str());
  return varipipe::kExitOk;
}
