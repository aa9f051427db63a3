// safetensors files (Hugging Face checkpoints, common/checkpoint): the input
// is the whole file. Whatever opens must keep its promises: every tensor's
// bytes lie inside the file and match its dtype and shape, and reading each
// one back succeeds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/checkpoint/safetensors_file.h"
#include "tests/fuzz/fuzz_scratch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace varipipe;
  fuzz::Scratch::Write("model.safetensors", data, size);
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(fuzz::Scratch::Dir() + "/model.safetensors");
  if (!file.ok()) return 0;
  std::vector<char> buffer;
  for (const SafetensorsTensor& t : file->tensors()) {
    if (t.end > size || t.begin > t.end) std::abort();
    if (t.bytes() !=
        static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(SafetensorsDtypeSize(t.dtype))) {
      std::abort();
    }
    if (file->Find(t.name) != &t) std::abort();
    buffer.resize(t.bytes());
    if (!file->Read(t, buffer.data()).ok()) std::abort();
  }
  return 0;
}
