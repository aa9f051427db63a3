// Writes safetensors files (the format safetensors_file.h reads)
// deterministically: the header's keys sorted, the tensors' bytes in the
// same order, the header padded with spaces to a multiple of 8 bytes (as
// Hugging Face's writer does), so equal tensors always give equal files.
// The file appears complete or not at all: written to PATH.tmp, synced,
// renamed.
#ifndef VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_WRITER_H_
#define VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace varipipe {

struct TensorToWrite {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;  // shape's elements of dtype, little-endian
  uint64_t bytes = 0;
};

absl::Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `text` to `path` the same way (PATH.tmp, synced, renamed).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_WRITER_H_
