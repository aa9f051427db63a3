// libvaripipe_sentencepiece.so: SentencePieceProcessor behind the C
// interface of sentencepiece_module.h. This file includes no other Varipipe
// or Abseil header: sentencepiece_processor.h defines absl::string_view
// itself.
#include "common/tokenizer/sentencepiece_module.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

void CopyError(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  std::snprintf(error, error_size, "%s", message.c_str());
}

const sentencepiece::SentencePieceProcessor& Processor(const void* model) {
  return *static_cast<const sentencepiece::SentencePieceProcessor*>(model);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* VaripipeSpmLoad(const char* path, char* error,
                                                             size_t error_size) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    CopyError(status.ToString(), error, error_size);
    return nullptr;
  }
  return processor.release();
}

__attribute__((visibility("default"))) void VaripipeSpmFree(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

__attribute__((visibility("default"))) int32_t VaripipeSpmPieceSize(const void* model) {
  return Processor(model).GetPieceSize();
}
__attribute__((visibility("default"))) int32_t VaripipeSpmBosId(const void* model) {
  return Processor(model).bos_id();
}
__attribute__((visibility("default"))) int32_t VaripipeSpmEosId(const void* model) {
  return Processor(model).eos_id();
}
__attribute__((visibility("default"))) int32_t VaripipeSpmPadId(const void* model) {
  return Processor(model).pad_id();
}
__attribute__((visibility("default"))) int32_t VaripipeSpmUnkId(const void* model) {
  return Processor(model).unk_id();
}

__attribute__((visibility("default"))) int64_t VaripipeSpmEncode(const void* model,
                                                                 const char* text, size_t size,
                                                                 int32_t* ids, size_t capacity,
                                                                 char* error, size_t error_size) {
  std::vector<int> out;
  const auto status = Processor(model).Encode(std::string_view(text, size), &out);
  if (!status.ok()) {
    CopyError(status.ToString(), error, error_size);
    return -1;
  }
  for (size_t i = 0; i < out.size() && i < capacity; ++i) ids[i] = out[i];
  return static_cast<int64_t>(out.size());
}

}  // extern "C"
