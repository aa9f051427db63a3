// varipipe-convert-jsonl: converts a JSONL dataset into a pair of Megatron-LM
// indexed datasets, PREFIX_input.{idx,bin} and PREFIX_target.{idx,bin}, and
// prints the config lines that use them. Lines hold token ids
// ({"input": [...], "target": [...]}) or, with --tokenizer, text
// ({"prompt": ..., "response": ...} or {"text": ...}) that a SentencePiece
// model tokenizes with its family's BOS/EOS rules (docs/datasets.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/binary_main.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/jsonl_dataset.h"
#include "common/status.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"
#include "common/tokenizer/text_sample_encoder.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, input, "", "JSONL file to convert. Required.");
ABSL_FLAG(std::string, output_prefix, "",
          "Output prefix: writes PREFIX_input.{idx,bin} and PREFIX_target.{idx,bin}. Required.");
ABSL_FLAG(int64_t, vocab_size, 0,
          "Vocabulary size: token ids must be below it (0: no check; with --tokenizer, the "
          "tokenizer's piece count); below 65500 the files store uint16 tokens, else int32.");
ABSL_FLAG(std::string, tokenizer, "",
          "SentencePiece model (FLAN-T5's spiece.model, Llama 2's tokenizer.model): the lines "
          "hold text, which it tokenizes. Tiktoken (Llama 3) and tokenizer.json files are "
          "refused.");
ABSL_FLAG(std::string, family, "auto",
          "With --tokenizer, whose special-token rules apply: llama (input BOS prompt, target "
          "response EOS; text: BOS text EOS), t5 (input prompt EOS, target response EOS), or "
          "auto (llama when the tokenizer has a BOS token, else t5).");
ABSL_FLAG(std::string, prompt_field, "prompt", "With --tokenizer, the input text's field.");
ABSL_FLAG(std::string, response_field, "response", "With --tokenizer, the target text's field.");
ABSL_FLAG(std::string, text_field, "text",
          "With --tokenizer, the field of a document without target (language modelling).");
ABSL_FLAG(double, progress_interval_s, 10,
          "With --tokenizer, seconds between progress lines (0: after every line).");

namespace {

constexpr char kUsage[] =
    "Converts a JSONL dataset into Megatron-LM indexed datasets (.idx/.bin).\n"
    "\n"
    "Usage: varipipe-convert-jsonl --input data.jsonl --output_prefix out/data "
    "[--vocab_size N]\n"
    "       varipipe-convert-jsonl --input text.jsonl --output_prefix out/data "
    "--tokenizer tokenizer.model [--family auto|llama|t5]\n"
    "\n"
    "Token-id lines: {\"input\": [ids], \"target\": [ids]} (target optional).\n"
    "Text lines (--tokenizer): {\"prompt\": \"...\", \"response\": \"...\"} (the loss covers "
    "the response) or {\"text\": \"...\"} (every next token counts).";

void PrintConfigLines(uint64_t samples, const std::string& prefix) {
  std::printf(
      "converted %llu samples; use them with\n"
      "  \"data\": {\"format\": \"MEGATRON_INDEXED\", \"path\": \"%s_input\", "
      "\"target_path\": \"%s_target\", ...}\n",
      static_cast<unsigned long long>(samples), prefix.c_str(), prefix.c_str());
}

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "varipipe-convert-jsonl: %s\n", std::string(status.message()).c_str());
  return code;
}

int ConvertTokenIds(const std::string& input, const std::string& prefix, int64_t vocab) {
  spdlog::info("reading {}", input);
  absl::StatusOr<std::unique_ptr<varipipe::JsonlSampleDataset>> jsonl =
      varipipe::JsonlSampleDataset::Open(input, vocab);
  if (!jsonl.ok()) return Fail(jsonl.status(), varipipe::kExitUsage);
  for (const auto& [suffix, sequences] :
       {std::pair<const char*, const std::vector<std::vector<int64_t>>*>{"_input",
                                                                         &(*jsonl)->inputs()},
        {"_target", &(*jsonl)->targets()}}) {
    const std::string out = prefix + suffix;
    if (absl::Status s = varipipe::WriteIndexedFile(out, *sequences, vocab); !s.ok()) {
      return Fail(s, varipipe::kExitFailure);
    }
    spdlog::info("wrote {}.idx and {}.bin", out, out);
  }
  PrintConfigLines((*jsonl)->size(), prefix);
  return varipipe::kExitOk;
}

// The tokenizer, the rules that turn a line into a sample, and the
// vocabulary size the output declares (the tokenizer's when --vocab_size is
// 0). Errors are usage errors.
struct TextEncoding {
  std::unique_ptr<varipipe::SentencePieceTokenizer> tokenizer;
  std::optional<varipipe::TextSampleEncoder> encoder;  // reads *tokenizer
  int64_t vocab = 0;
};

absl::StatusOr<TextEncoding> OpenTextEncoding(int64_t vocab) {
  TextEncoding encoding;
  VP_ASSIGN_OR_RETURN(encoding.tokenizer,
                      varipipe::SentencePieceTokenizer::Open(absl::GetFlag(FLAGS_tokenizer)));
  const varipipe::SentencePieceTokenizer& tokenizer = *encoding.tokenizer;
  VP_ASSIGN_OR_RETURN(const varipipe::TextFamily family,
                      varipipe::ParseTextFamily(absl::GetFlag(FLAGS_family), tokenizer));
  varipipe::TextFields fields;
  fields.prompt = absl::GetFlag(FLAGS_prompt_field);
  fields.response = absl::GetFlag(FLAGS_response_field);
  fields.text = absl::GetFlag(FLAGS_text_field);
  VP_ASSIGN_OR_RETURN(encoding.encoder, varipipe::TextSampleEncoder::Create(
                                            encoding.tokenizer.get(), family, fields));
  const int64_t pieces = tokenizer.piece_size();
  if (vocab != 0 && vocab < pieces) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab_size ", vocab, " is below the ", pieces,
                                                   " pieces of ", tokenizer.path(),
                                                   ": the model could not embed every token"));
  }
  encoding.vocab = vocab == 0 ? pieces : vocab;
  spdlog::info("tokenizer {}: {} pieces, bos {}, eos {}", tokenizer.path(), pieces,
               tokenizer.bos_id(), tokenizer.eos_id());
  // One line: the rules and, under --family auto, why (a switch to T5's
  // rules is a warning: a decoder-only model would lose its BOS).
  const std::string choice =
      varipipe::DescribeTextFamilyChoice(absl::GetFlag(FLAGS_family), family, tokenizer);
  if (absl::GetFlag(FLAGS_family) == "auto" && family == varipipe::TextFamily::kT5) {
    spdlog::warn("{}", choice);
  } else {
    spdlog::info("{}", choice);
  }
  return encoding;
}

// Streams the text lines through the tokenizer into the two writers: memory
// stays at one line plus 12 bytes per sample.
int ConvertText(const std::string& input, const std::string& prefix, int64_t vocab_flag) {
  using varipipe::IndexedFileWriter;
  absl::StatusOr<TextEncoding> encoding = OpenTextEncoding(vocab_flag);
  if (!encoding.ok()) return Fail(encoding.status(), varipipe::kExitUsage);
  varipipe::TextSampleEncoder& encoder = *encoding->encoder;
  const int64_t vocab = encoding->vocab;

  std::ifstream in(input, std::ios::binary);
  if (!in) return Fail(varipipe::ErrnoToStatus(errno, absl::StrCat("open ", input)), 2);
  std::error_code size_error;
  const uintmax_t total_bytes = std::filesystem::file_size(input, size_error);
  const bool uint16_tokens = vocab < 65500;
  absl::StatusOr<std::unique_ptr<IndexedFileWriter>> inputs =
      IndexedFileWriter::Create(prefix + "_input", uint16_tokens);
  if (!inputs.ok()) return Fail(inputs.status(), varipipe::kExitFailure);
  absl::StatusOr<std::unique_ptr<IndexedFileWriter>> targets =
      IndexedFileWriter::Create(prefix + "_target", uint16_tokens);
  if (!targets.ok()) return Fail(targets.status(), varipipe::kExitFailure);

  const absl::Time start = absl::Now();
  const absl::Duration interval = absl::Seconds(absl::GetFlag(FLAGS_progress_interval_s));
  absl::Time next_progress = start + interval;
  uint64_t bytes = 0;
  const auto progress = [&](const char* what) {
    const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start));
    spdlog::info(
        "{} {} samples ({} input, {} target tokens), {:.1f} of {:.1f} MiB ({:.0f}%), "
        "{:.1f} MiB/s",
        what, (*inputs)->sequences(), (*inputs)->tokens(), (*targets)->tokens(), bytes / 1048576.0,
        total_bytes / 1048576.0, total_bytes > 0 ? 100.0 * bytes / total_bytes : 100.0,
        bytes / 1048576.0 / seconds);
  };
  std::vector<int64_t> input_ids;
  std::vector<int64_t> target_ids;
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    bytes += line.size() + 1;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where =
        absl::StrCat(input, ":", number, " (sample ", (*inputs)->sequences(), ")");
    absl::Status status = encoder.EncodeLine(line, where, &input_ids, &target_ids);
    if (status.ok()) status = (*inputs)->Append(input_ids);
    if (status.ok()) status = (*targets)->Append(target_ids);
    if (!status.ok()) return Fail(status, varipipe::kExitUsage);
    if (absl::Now() >= next_progress) {
      progress("tokenized");
      next_progress = absl::Now() + interval;
    }
  }
  if (in.bad()) return Fail(varipipe::ErrnoToStatus(errno, absl::StrCat("read ", input)), 1);
  if ((*inputs)->sequences() == 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(input, ": no samples")),
                varipipe::kExitUsage);
  }
  bytes = total_bytes;
  progress("done:");
  for (IndexedFileWriter* w : {inputs->get(), targets->get()}) {
    if (absl::Status s = w->Commit(); !s.ok()) return Fail(s, varipipe::kExitFailure);
  }
  spdlog::info("wrote {0}_input.{{idx,bin}} and {0}_target.{{idx,bin}} ({1} tokens)", prefix,
               uint16_tokens ? "uint16" : "int32");
  PrintConfigLines((*inputs)->sequences(), prefix);
  std::printf("  \"model\": {\"vocab_size\": %lld or more, ...}\n", static_cast<long long>(vocab));
  return varipipe::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-convert-jsonl", kUsage);
  if (!args.empty() || absl::GetFlag(FLAGS_input).empty() ||
      absl::GetFlag(FLAGS_output_prefix).empty()) {
    std::fprintf(stderr,
                 "varipipe-convert-jsonl: --input and --output_prefix are required (try --help)\n");
    return varipipe::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_vocab_size) < 0) {
    std::fprintf(stderr, "varipipe-convert-jsonl: --vocab_size must not be negative\n");
    return varipipe::kExitUsage;
  }
  // The output's directory is created when missing.
  const std::filesystem::path parent =
      std::filesystem::path(absl::GetFlag(FLAGS_output_prefix)).parent_path();
  if (std::error_code error; !parent.empty() && !std::filesystem::exists(parent) &&
                             !std::filesystem::create_directories(parent, error)) {
    std::fprintf(stderr, "varipipe-convert-jsonl: create %s: %s\n", parent.c_str(),
                 error.message().c_str());
    return varipipe::kExitFailure;
  }
  if (absl::GetFlag(FLAGS_tokenizer).empty()) {
    return ConvertTokenIds(absl::GetFlag(FLAGS_input), absl::GetFlag(FLAGS_output_prefix),
                           absl::GetFlag(FLAGS_vocab_size));
  }
  return ConvertText(absl::GetFlag(FLAGS_input), absl::GetFlag(FLAGS_output_prefix),
                     absl::GetFlag(FLAGS_vocab_size));
}
