// Text JSONL lines to token-id samples with a model family's special-token
// rules, for varipipe-convert-jsonl --tokenizer (docs/datasets.md, "Text").
//
// A line is {"prompt": "...", "response": "..."} (supervised: the prompt
// becomes the input, the response the target, and the loss covers the
// target only, common/dataset/loss_tokens.h) or {"text": "..."} (a
// document for language modelling: input only, every next token counts).
//
// Special tokens follow Hugging Face's tokenizers for each family:
//   llama (LlamaTokenizer: BOS before every sequence; the EOS ends what the
//          model generates, so it closes the response and the document):
//     prompt/response  input = BOS prompt         target = response EOS
//     text             input = BOS text EOS
//   t5 (T5Tokenizer: </s> after every sequence, no BOS):
//     prompt/response  input = prompt EOS          target = response EOS
//     text             refused: an encoder-decoder trains on targets
#ifndef VARIPIPE_COMMON_TOKENIZER_TEXT_SAMPLE_ENCODER_H_
#define VARIPIPE_COMMON_TOKENIZER_TEXT_SAMPLE_ENCODER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"

namespace varipipe {

enum class TextFamily { kLlama, kT5 };

const char* TextFamilyName(TextFamily family);

// "llama", "t5", or "auto": llama when the tokenizer has a BOS token (Llama
// 2's has), else t5 (T5's spiece.model has none).
absl::StatusOr<TextFamily> ParseTextFamily(const std::string& name,
                                           const SentencePieceTokenizer& tokenizer);

// One line saying which rules `family` applies and, when `name` was "auto",
// why the tokenizer chose them (and how to choose the other family).
std::string DescribeTextFamilyChoice(const std::string& name, TextFamily family,
                                     const SentencePieceTokenizer& tokenizer);

// The JSON field names of a line.
struct TextFields {
  std::string prompt = "prompt";
  std::string response = "response";
  std::string text = "text";
};

class TextSampleEncoder {
 public:
  // Fails when the tokenizer lacks a special token the family needs.
  static absl::StatusOr<TextSampleEncoder> Create(const SentencePieceTokenizer* tokenizer,
                                                  TextFamily family, TextFields fields);

  // Tokenizes one JSON line into `input` and `target` (replacing their
  // contents). `where` (FILE:LINE) starts every error message.
  absl::Status EncodeLine(std::string_view line, const std::string& where,
                          std::vector<int64_t>* input, std::vector<int64_t>* target) const;

  TextFamily family() const { return family_; }

 private:
  TextSampleEncoder(const SentencePieceTokenizer* tokenizer, TextFamily family, TextFields fields)
      : tokenizer_(tokenizer), family_(family), fields_(std::move(fields)) {}

  const SentencePieceTokenizer* tokenizer_;
  TextFamily family_;
  TextFields fields_;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_TOKENIZER_TEXT_SAMPLE_ENCODER_H_
