// Hugging Face checkpoint directories (common/checkpoint/hf_checkpoint.h):
// the input is model.safetensors.index.json, beside a config.json and one
// valid shard. Opening either refuses the index or maps every tensor name to
// a shard beside it; looking each name up either finds the tensor or says
// why, and never leaves the directory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/checkpoint/hf_checkpoint.h"
#include "tests/fuzz/fuzz_scratch.h"

namespace {

// A shard holding one F32 tensor "w" of shape [2].
void WriteShard() {
  static bool written = false;
  if (written) return;
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header;
  file += std::string(8, '\0');
  varipipe::fuzz::Scratch::Write("shard.safetensors", reinterpret_cast<const uint8_t*>(file.data()),
                                 file.size());
  const std::string config = R"({"model_type":"llama"})";
  varipipe::fuzz::Scratch::Write("config.json", reinterpret_cast<const uint8_t*>(config.data()),
                                 config.size());
  written = true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace varipipe;
  WriteShard();
  fuzz::Scratch::Write("model.safetensors.index.json", data, size);
  absl::StatusOr<HuggingFaceCheckpoint> ckpt = HuggingFaceCheckpoint::Open(fuzz::Scratch::Dir());
  if (!ckpt.ok()) return 0;
  if (!ckpt->sharded()) std::abort();
  for (const std::string& name : ckpt->TensorNames()) {
    absl::StatusOr<HuggingFaceCheckpoint::Located> found = ckpt->Find(name);
    if (found.ok() && found->tensor->name != name) std::abort();
  }
  return 0;
}
