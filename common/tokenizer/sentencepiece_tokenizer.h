// A SentencePiece model (FLAN-T5's spiece.model, Llama 2's tokenizer.model)
// read by Debian's libsentencepiece, through the module of
// sentencepiece_module.h (loaded from next to the running executable, or
// from VARIPIPE_SENTENCEPIECE_MODULE).
//
// Files SentencePiece cannot read are refused with what they are: a
// tiktoken BPE vocabulary (Llama 3's tokenizer.model: base64 pieces and
// ranks, one per line) or a Hugging Face tokenizers JSON file
// (tokenizer.json).
#ifndef VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace varipipe {

class SentencePieceTokenizer {
 public:
  // The loaded module's entry points (sentencepiece_tokenizer.cc).
  struct Module;

  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Open(const std::string& path);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  // Appends the ids of `text` (UTF-8) to `ids`; no special tokens.
  absl::Status Encode(std::string_view text, std::vector<int64_t>* ids) const;

  int32_t piece_size() const { return piece_size_; }
  // -1 where the model has no such token (T5's models have no BOS).
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  const std::string& path() const { return path_; }

 private:
  SentencePieceTokenizer() = default;

  std::string path_;
  std::shared_ptr<const Module> module_;
  void* model_ = nullptr;
  int32_t piece_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
  int32_t unk_id_ = -1;
};

// What a file that is not a SentencePiece model is, from its first bytes:
// "" when it may be one; otherwise a description for the error message.
std::string DescribeNonSentencePieceFile(std::string_view head);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
