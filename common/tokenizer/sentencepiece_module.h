// The C interface of the SentencePiece module (libvaripipe_sentencepiece.so).
//
// Debian's libsentencepiece carries its own copies of protobuf-lite and parts
// of Abseil under their usual names (and its header redefines
// absl::string_view), so it cannot share a process's symbol namespace with
// the protobuf and Abseil the rest of Varipipe links. The module wraps it
// behind plain C functions and is loaded with dlopen(RTLD_LOCAL |
// RTLD_DEEPBIND) by SentencePieceTokenizer: its symbols and those of its
// dependencies resolve inside the module first, and nothing of it reaches
// the global namespace.
#ifndef VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_MODULE_H_
#define VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_MODULE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Loads a model file; null with a message in `error` on failure.
void* VaripipeSpmLoad(const char* path, char* error, size_t error_size);
void VaripipeSpmFree(void* model);
// Pieces in the vocabulary, and the special ids (-1: the model has none).
int32_t VaripipeSpmPieceSize(const void* model);
int32_t VaripipeSpmBosId(const void* model);
int32_t VaripipeSpmEosId(const void* model);
int32_t VaripipeSpmPadId(const void* model);
int32_t VaripipeSpmUnkId(const void* model);
// Encodes `size` bytes of UTF-8 text. Returns the number of ids (writing
// the first min(count, capacity) to `ids`; call again with a larger buffer
// when it exceeds `capacity`), or -1 with a message in `error`.
int64_t VaripipeSpmEncode(const void* model, const char* text, size_t size, int32_t* ids,
                          size_t capacity, char* error, size_t error_size);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // VARIPIPE_COMMON_TOKENIZER_SENTENCEPIECE_MODULE_H_
