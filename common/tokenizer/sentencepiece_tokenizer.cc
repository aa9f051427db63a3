#include "common/tokenizer/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/tokenizer/sentencepiece_module.h"

namespace varipipe {

constexpr char kModuleName[] = "libvaripipe_sentencepiece.so";
constexpr char kModuleEnv[] = "VARIPIPE_SENTENCEPIECE_MODULE";

// The module's entry points. Loaded once per process and never unloaded.
struct SentencePieceTokenizer::Module {
  decltype(&VaripipeSpmLoad) load = nullptr;
  decltype(&VaripipeSpmFree) free = nullptr;
  decltype(&VaripipeSpmPieceSize) piece_size = nullptr;
  decltype(&VaripipeSpmBosId) bos_id = nullptr;
  decltype(&VaripipeSpmEosId) eos_id = nullptr;
  decltype(&VaripipeSpmPadId) pad_id = nullptr;
  decltype(&VaripipeSpmUnkId) unk_id = nullptr;
  decltype(&VaripipeSpmEncode) encode = nullptr;
};

namespace {

// Where the module may be: $VARIPIPE_SENTENCEPIECE_MODULE, else next to the
// running executable.
std::vector<std::string> ModuleCandidates() {
  if (const char* env = std::getenv(kModuleEnv); env != nullptr && *env != '\0') return {env};
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return {kModuleName};
  return {(exe.parent_path() / kModuleName).string()};
}

absl::StatusOr<std::shared_ptr<const SentencePieceTokenizer::Module>> LoadModule() {
  static absl::Mutex mutex(absl::kConstInit);
  static std::shared_ptr<const SentencePieceTokenizer::Module>* loaded = nullptr;
  absl::MutexLock lock(&mutex);
  if (loaded != nullptr) return *loaded;
  std::string tried;
  void* handle = nullptr;
  for (const std::string& path : ModuleCandidates()) {
    // RTLD_DEEPBIND: libsentencepiece's own protobuf and Abseil copies win
    // over the process's for every lookup made from inside the module.
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle != nullptr) break;
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load the SentencePiece module (", tried, "); it is built next to the ",
        "binaries as ", kModuleName, " (set ", kModuleEnv, " to its path if it lives elsewhere)"));
  }
  auto module = std::make_shared<SentencePieceTokenizer::Module>();
  std::string missing;
  const auto bind = [&](auto* slot, const char* name) {
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(dlsym(handle, name));
    if (*slot == nullptr) absl::StrAppend(&missing, " ", name);
  };
  bind(&module->load, "VaripipeSpmLoad");
  bind(&module->free, "VaripipeSpmFree");
  bind(&module->piece_size, "VaripipeSpmPieceSize");
  bind(&module->bos_id, "VaripipeSpmBosId");
  bind(&module->eos_id, "VaripipeSpmEosId");
  bind(&module->pad_id, "VaripipeSpmPadId");
  bind(&module->unk_id, "VaripipeSpmUnkId");
  bind(&module->encode, "VaripipeSpmEncode");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the SentencePiece module lacks", missing, ": rebuild it"));
  }
  loaded = new std::shared_ptr<const SentencePieceTokenizer::Module>(std::move(module));
  return *loaded;
}

bool IsBase64(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '=';
}

}  // namespace

std::string DescribeNonSentencePieceFile(std::string_view head) {
  size_t first = 0;
  while (first < head.size() && absl::ascii_isspace(static_cast<unsigned char>(head[first]))) {
    ++first;
  }
  if (first < head.size() && head[first] == '{') {
    return "a Hugging Face tokenizers JSON file (tokenizer.json)";
  }
  // tiktoken: "<base64 piece> <rank>\n" lines.
  const size_t end = head.find('\n');
  if (end != std::string_view::npos && end > 0) {
    const std::string_view line = head.substr(0, end);
    const size_t space = line.find(' ');
    bool tiktoken = space != std::string_view::npos && space > 0 && space + 1 < line.size();
    for (size_t i = 0; tiktoken && i < space; ++i) tiktoken = IsBase64(line[i]);
    for (size_t i = space + 1; tiktoken && i < line.size(); ++i) {
      tiktoken = absl::ascii_isdigit(static_cast<unsigned char>(line[i]));
    }
    if (tiktoken) {
      return "a tiktoken BPE vocabulary (base64 pieces and ranks, as in Llama 3's "
             "tokenizer.model)";
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Open(
    const std::string& path) {
  std::string head(4096, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return ErrnoToStatus(errno, absl::StrCat("open tokenizer ", path));
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
  }
  if (head.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty file, not a SentencePiece model"));
  }
  if (const std::string what = DescribeNonSentencePieceFile(head); !what.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", what, ", which SentencePiece cannot read. Only SentencePiece models ",
        "(FLAN-T5's spiece.model, Llama 2's tokenizer.model) are supported: tokenize the text ",
        "with the model's own tokenizer and convert {\"input\": [ids], \"target\": [ids]} ",
        "lines instead"));
  }
  VP_ASSIGN_OR_RETURN(std::shared_ptr<const Module> module, LoadModule());
  char error[512] = {0};
  void* model = module->load(path.c_str(), error, sizeof(error));
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model (libsentencepiece: ", error, ")"));
  }
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->path_ = path;
  t->module_ = std::move(module);
  t->model_ = model;
  t->piece_size_ = t->module_->piece_size(model);
  t->bos_id_ = t->module_->bos_id(model);
  t->eos_id_ = t->module_->eos_id(model);
  t->pad_id_ = t->module_->pad_id(model);
  t->unk_id_ = t->module_->unk_id(model);
  return t;
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (model_ != nullptr) module_->free(model_);
}

absl::Status SentencePieceTokenizer::Encode(std::string_view text,
                                            std::vector<int64_t>* ids) const {
  // SentencePiece yields about one id per 3-4 bytes of text; retry once
  // with the exact count when that guess was short.
  std::vector<int32_t> buffer(text.size() / 2 + 16);
  char error[512] = {0};
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int64_t count = module_->encode(model_, text.data(), text.size(), buffer.data(),
                                          buffer.size(), error, sizeof(error));
    if (count < 0) {
      return absl::InvalidArgumentError(absl::StrCat("SentencePiece cannot encode: ", error));
    }
    if (static_cast<size_t>(count) <= buffer.size()) {
      ids->insert(ids->end(), buffer.begin(), buffer.begin() + count);
      return absl::OkStatus();
    }
    buffer.resize(static_cast<size_t>(count));
  }
  return absl::InternalError("SentencePiece returned different lengths for the same text");
}

}  // namespace varipipe
