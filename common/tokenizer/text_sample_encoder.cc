#include "common/tokenizer/text_sample_encoder.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace varipipe {
namespace {

// The string field `name` of `object`: null when absent, an error when it
// is not a string.
absl::StatusOr<const std::string*> StringField(const nlohmann::json& object,
                                               const std::string& name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) return nullptr;
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", name, "\" must be a string, not ", it->type_name()));
  }
  return it->get_ptr<const std::string*>();
}

}  // namespace

const char* TextFamilyName(TextFamily family) {
  return family == TextFamily::kLlama ? "llama" : "t5";
}

absl::StatusOr<TextFamily> ParseTextFamily(const std::string& name,
                                           const SentencePieceTokenizer& tokenizer) {
  if (name == "llama") return TextFamily::kLlama;
  if (name == "t5") return TextFamily::kT5;
  if (name == "auto") return tokenizer.bos_id() >= 0 ? TextFamily::kLlama : TextFamily::kT5;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tokenizer family \"", name, "\" (auto, llama or t5)"));
}

std::string DescribeTextFamilyChoice(const std::string& name, TextFamily family,
                                     const SentencePieceTokenizer& tokenizer) {
  const bool llama = family == TextFamily::kLlama;
  const std::string why =
      name != "auto" ? absl::StrCat("--family ", name)
      : llama        ? absl::StrCat("chosen by --family auto: ", tokenizer.path(),
                                    " has a BOS token, id ", tokenizer.bos_id())
                     : absl::StrCat("chosen by --family auto: ", tokenizer.path(),
                                    " has no BOS token, like T5's spiece.model (spm_train "
                                    "--bos_id=-1 trains such a model)");
  const char* rules =
      llama ? "BOS before each sample, EOS after its response or text (decoder-only)"
            : "no BOS, EOS after the prompt and after the response, no \"text\" lines "
              "(encoder-decoder)";
  return absl::StrCat(TextFamilyName(family), " rules (", why, "): ", rules,
                      name == "auto" && !llama ? "; --family llama for a decoder-only model" : "");
}

absl::StatusOr<TextSampleEncoder> TextSampleEncoder::Create(const SentencePieceTokenizer* tokenizer,
                                                            TextFamily family, TextFields fields) {
  if (tokenizer->eos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokenizer->path(), " has no EOS token, which the ", TextFamilyName(family),
                     " family ends sequences with"));
  }
  if (family == TextFamily::kLlama && tokenizer->bos_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer->path(), " has no BOS token, which the llama family starts sequences with ",
        "(a T5 tokenizer? use --family t5)"));
  }
  return TextSampleEncoder(tokenizer, family, std::move(fields));
}

absl::Status TextSampleEncoder::EncodeLine(std::string_view line, const std::string& where,
                                           std::vector<int64_t>* input,
                                           std::vector<int64_t>* target) const {
  input->clear();
  target->clear();
  const nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded() || !object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  VP_ASSIGN_OR_RETURN(const std::string* prompt, StringField(object, fields_.prompt, where));
  VP_ASSIGN_OR_RETURN(const std::string* response, StringField(object, fields_.response, where));
  VP_ASSIGN_OR_RETURN(const std::string* text, StringField(object, fields_.text, where));
  const auto encode = [&](const std::string& s, const std::string& field,
                          std::vector<int64_t>* out) -> absl::Status {
    absl::Status status = tokenizer_->Encode(s, out);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", field, "\": ", status.message()));
    }
    return absl::OkStatus();
  };
  const int64_t bos = tokenizer_->bos_id();
  const int64_t eos = tokenizer_->eos_id();
  if (prompt != nullptr || response != nullptr) {
    if (prompt == nullptr || response == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", prompt == nullptr ? fields_.response : fields_.prompt,
                       "\" without \"", prompt == nullptr ? fields_.prompt : fields_.response,
                       "\" (a supervised line has both)"));
    }
    if (text != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": both \"", fields_.text, "\" and \"",
                                                     fields_.prompt, "\"/\"", fields_.response,
                                                     "\": choose one"));
    }
    if (family_ == TextFamily::kLlama) input->push_back(bos);
    VP_RETURN_IF_ERROR(encode(*prompt, fields_.prompt, input));
    if (family_ == TextFamily::kT5) input->push_back(eos);
    VP_RETURN_IF_ERROR(encode(*response, fields_.response, target));
    target->push_back(eos);
    return absl::OkStatus();
  }
  if (text != nullptr) {
    if (family_ == TextFamily::kT5) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a \"", fields_.text, "\" line has no target, and the t5 family (an ",
          "encoder-decoder) trains on targets: give \"", fields_.prompt, "\" and \"",
          fields_.response, "\""));
    }
    input->push_back(bos);
    VP_RETURN_IF_ERROR(encode(*text, fields_.text, input));
    input->push_back(eos);
    return absl::OkStatus();
  }
  std::string hint;
  if (object.contains("input")) hint = " (token-id lines are converted without --tokenizer)";
  return absl::InvalidArgumentError(absl::StrCat(where, ": no \"", fields_.prompt, "\"/\"",
                                                 fields_.response, "\" pair and no \"",
                                                 fields_.text, "\" field", hint));
}

}  // namespace varipipe
