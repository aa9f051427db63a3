// Loading Hugging Face weights into a rank's stages from the page cache:
// a LLAMA model of about 0.25 billion parameters (hidden 1024, 16 layers,
// FFN 2816, vocabulary 32000) written once as F32 and as BF16 safetensors
// (random bytes that are valid floats), then loaded into one stage holding
// the whole model (pp = 1) and into the first of four stages (pp = 4, the
// share one rank reads). The baseline, in the same process, reads the same
// files' bytes with plain pread into one buffer: `vs_raw_read` is the
// loader's bytes/s over the baseline's. docs/benchmarks.md reports
// `bytes_per_second` (checkpoint bytes per rank) and that ratio.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "common/checkpoint/hf_checkpoint.h"
#include "common/checkpoint/safetensors_writer.h"
#include "executor/model/hf_export.h"
#include "executor/model/hf_weights.h"
#include "executor/model/model_stage.h"

namespace varipipe::executor {
namespace {

ModelSpec BenchSpec() {
  ModelSpec spec;
  spec.num_layers = 16;
  spec.hidden_size = 1024;
  spec.num_attention_heads = 16;
  spec.kv_channels = 64;
  spec.ffn_hidden_size = 2816;
  spec.vocab_size = 32000;
  spec.max_sequence_length = 2048;
  spec.llama = true;
  spec.num_key_value_heads = 4;
  return spec;
}

// The benchmark's checkpoints, removed when the process ends.
struct Written {
  std::vector<std::string> dirs;
  ~Written() {
    for (const std::string& d : dirs) std::filesystem::remove_all(d);
  }
};
Written& WrittenDirs() {
  static Written written;
  return written;
}

// The checkpoint, exported once per dtype from a whole-model stage.
std::string Checkpoint(v1::DType dtype) {
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("varipipe-hf-load-bench-" + v1::DType_Name(dtype) + "-" + std::to_string(getpid())))
          .string();
  if (std::filesystem::exists(std::filesystem::path(dir) / "config.json")) return dir;
  std::filesystem::create_directories(dir);
  WrittenDirs().dirs.push_back(dir);
  const ModelSpec spec = BenchSpec();
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, 1);
  ModelStage stage(spec, roles[0]);
  if (!ExportHuggingFaceShards(dir, spec, {&stage}, dtype).ok() ||
      !ExportHuggingFaceIndex(dir, spec, dtype).ok()) {
    return "";
  }
  return dir;
}

// Every shard file's bytes through pread (the page cache's speed).
uint64_t RawRead(const std::string& dir, std::vector<char>& buffer) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const int fd = open(entry.path().c_str(), O_RDONLY);
    const uint64_t size = std::filesystem::file_size(entry.path());
    if (buffer.size() < size) buffer.resize(size);
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = pread(fd, buffer.data() + done, size - done, static_cast<off_t>(done));
      if (n <= 0) break;
      done += static_cast<uint64_t>(n);
    }
    close(fd);
    total += done;
  }
  return total;
}

void BM_LoadHuggingFace(benchmark::State& state) {
  torch::set_num_threads(1);
  const v1::DType dtype = state.range(0) == 0 ? v1::FLOAT32 : v1::BFLOAT16;
  const int pipeline = static_cast<int>(state.range(1));
  const std::string dir = Checkpoint(dtype);
  if (dir.empty()) {
    state.SkipWithError("cannot write the checkpoint");
    return;
  }
  const ModelSpec spec = BenchSpec();
  const std::vector<StageRole> roles = *PipelineStageRoles(spec, pipeline);
  ModelStage stage(spec, roles[0]);
  std::vector<char> buffer;
  RawRead(dir, buffer);  // warm the page cache
  double load_seconds = 0;
  double raw_seconds = 0;
  uint64_t loaded = 0;
  uint64_t raw = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    HuggingFaceCheckpoint ckpt = *HuggingFaceCheckpoint::Open(dir);
    if (!LoadHuggingFaceWeights(ckpt, spec, {&stage}).ok()) {
      state.SkipWithError("load failed");
      return;
    }
    load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    loaded += ckpt.bytes_read();
    start = std::chrono::steady_clock::now();
    raw += RawRead(dir, buffer);
    raw_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double load_rate = static_cast<double>(loaded) / load_seconds;
  const double raw_rate = static_cast<double>(raw) / raw_seconds;
  state.counters["bytes_per_second"] = load_rate;
  state.counters["raw_read_bytes_per_second"] = raw_rate;
  state.counters["vs_raw_read"] = load_rate / raw_rate;
  state.counters["rank_bytes"] =
      static_cast<double>(loaded) / static_cast<double>(state.iterations());
}

BENCHMARK(BM_LoadHuggingFace)
    ->ArgNames({"bf16", "pp"})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({0, 4})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace varipipe::executor

BENCHMARK_MAIN();
