#include "executor/runtime/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <mutex>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "executor/runtime/fault_injection.h"

namespace varipipe::executor {
namespace {

constexpr int64_t kFormatVersion = 1;
// Errors that concern the directory's files name the field first.
constexpr char kDirField[] = "training.checkpoint_dir";
constexpr char kLayoutKey[] = "varipipe/stage_layout";
constexpr char kZeroLayoutKey[] = "varipipe/zero_layout";
constexpr char kZeroBucketKey[] = "varipipe/zero_bucket_bytes";

// Each stage's encoder layers, then each stage's decoder layers (int64).
torch::Tensor LayoutTensor(const LayerLayout& layout) {
  std::vector<int64_t> values(layout.encoder.begin(), layout.encoder.end());
  values.insert(values.end(), layout.decoder.begin(), layout.decoder.end());
  return torch::tensor(values, torch::kInt64);
}

std::string StageKey(const ModelStage& stage, const std::string& name) {
  return absl::StrCat("stage", stage.role().stage, "/", name);
}

// fsync of a file or directory; best effort on file systems without it.
void SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string RankCheckpoints::PathFor(uint64_t iterations_done) const {
  return absl::StrFormat("%s/iteration_%06d/rank_%05d.pt", dir_, iterations_done, rank_);
}

std::vector<uint64_t> RankCheckpoints::List() const {
  std::vector<uint64_t> held;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, error)) {
    const std::string filename = entry.path().filename().string();
    absl::string_view name = filename;
    uint64_t iteration = 0;
    if (!absl::ConsumePrefix(&name, "iteration_") || !absl::SimpleAtoi(name, &iteration)) continue;
    if (std::filesystem::is_regular_file(PathFor(iteration), error)) held.push_back(iteration);
  }
  std::sort(held.begin(), held.end());
  return held;
}

absl::Status RankCheckpoints::Save(uint64_t iterations_done, const std::vector<ModelStage*>& stages,
                                   const TrainingOptimizer& optimizer) const {
  const std::string path = PathFor(iterations_done);
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid());
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    torch::serialize::OutputArchive archive;
    archive.write("varipipe/format", torch::tensor(kFormatVersion));
    archive.write("varipipe/iterations_done", torch::tensor(static_cast<int64_t>(iterations_done)));
    archive.write("varipipe/rank", torch::tensor(static_cast<int64_t>(rank_)));
    if (layout_.stages() > 0) archive.write(kLayoutKey, LayoutTensor(layout_));
    if (sharding_ != nullptr) {
      archive.write(kZeroLayoutKey, sharding_->LayoutTensor());
      archive.write(kZeroBucketKey, torch::tensor(sharding_->bucket_bytes()));
    }
    for (const ModelStage* stage : stages) {
      for (const auto& item : stage->named_parameters()) {
        archive.write(StageKey(*stage, item.key()), item.value().detach().to(torch::kCPU));
      }
    }
    torch::serialize::OutputArchive optimizer_archive;
    optimizer.Save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      archive.write("rng/cpu", generator.get_state());
    }
    archive.save_to(temporary);
    SyncPath(temporary, /*directory=*/false);
    // Test-only (fault_injection.h): the file written, not yet in place.
    if (absl::Status fault = MaybeInjectFault(FaultPoint::kInCheckpointWrite); !fault.ok()) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      return fault;
    }
    std::filesystem::rename(temporary, path);
    SyncPath(std::filesystem::path(path).parent_path().string(), /*directory=*/true);
  } catch (const std::exception& e) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    return absl::UnavailableError(
        absl::StrCat(kDirField, ": ", path, ": cannot write the checkpoint: ", e.what()));
  }
  return absl::OkStatus();
}

namespace {

// The layout as the archive stores it, and back.
LayerLayout LayoutOfTensor(const torch::Tensor& t) {
  LayerLayout layout;
  const torch::Tensor flat = t.to(torch::kInt64).contiguous();
  const int64_t stages = flat.numel() / 2;
  for (int64_t s = 0; s < stages; ++s) {
    layout.encoder.push_back(static_cast<uint32_t>(flat[s].item<int64_t>()));
    layout.decoder.push_back(static_cast<uint32_t>(flat[stages + s].item<int64_t>()));
  }
  return layout;
}

// Opens the archive and checks its format, iteration count and stage layout
// (throws what LibTorch throws; `reading` names the entry being read).
absl::Status OpenChecked(const std::string& path, uint64_t iterations_done,
                         const LayerLayout& layout, torch::serialize::InputArchive& archive,
                         std::string& reading) {
  reading = "the archive";
  archive.load_from(path);
  torch::Tensor value;
  reading = "varipipe/format";
  archive.read(reading, value);
  if (value.item<int64_t>() != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint format ",
                                                      value.item<int64_t>(),
                                                      ", this executor reads ", kFormatVersion));
  }
  reading = "varipipe/iterations_done";
  value = torch::Tensor();  // read() into a defined tensor would resize it
  archive.read(reading, value);
  if (value.item<int64_t>() != static_cast<int64_t>(iterations_done)) {
    return absl::DataLossError(absl::StrCat(path, ": holds the state after ",
                                            value.item<int64_t>(), " iterations, not ",
                                            iterations_done));
  }
  reading = kLayoutKey;
  torch::Tensor recorded;
  if (layout.stages() > 0 && archive.try_read(reading, recorded)) {
    const LayerLayout theirs = LayoutOfTensor(recorded);
    if (!(theirs == layout)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": written with the stage layout ", theirs.ToString(), " but this job's is ",
          layout.ToString(),
          " (parallelism.stage_layout): resume with the checkpoint's layout, or carry the "
          "weights over with --export_hf and training.init_from"));
    }
  }
  return absl::OkStatus();
}

// An int64 tensor's values, "1,2,3".
std::string Values(const torch::Tensor& t) {
  const torch::Tensor flat = t.to(torch::kInt64).contiguous().reshape(-1);
  return absl::StrJoin(std::span<const int64_t>(flat.data_ptr<int64_t>(),
                                                static_cast<size_t>(flat.numel())),
                       ",");
}

// The bucket size setting `bytes` came from, for messages.
std::string BucketSetting(int64_t bytes) {
  if (bytes <= 0) return "training.gradient_bucket_mib 0 (one bucket per stage)";
  return absl::StrCat("buckets of ", bytes, " bytes, training.gradient_bucket_mib ",
                      absl::StrFormat("%g", static_cast<double>(bytes) / (1 << 20)));
}

// OK when the archive's ZeRO stage 1 shards were cut from `sharding`'s
// layout (a file without a record: from one bucket per stage).
absl::Status CheckShardLayout(const std::string& path, torch::serialize::InputArchive& archive,
                              const OptimizerSharding& sharding, std::string& reading) {
  constexpr char kStartOver[] = ", or remove the checkpoint directory to start over";
  const torch::Tensor mine = sharding.LayoutTensor();
  reading = kZeroLayoutKey;
  torch::Tensor theirs;
  if (!archive.try_read(reading, theirs)) {
    if (OptimizerSharding::IsUnbucketed(mine)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        ": written without a record of its ZeRO stage 1 shard layout (an older executor's, "
        "whose shards are one range of each stage), but this run cuts its shards from ",
        BucketSetting(sharding.bucket_bytes()),
        ", several per stage: resume with training.gradient_bucket_mib 0", kStartOver));
  }
  if (theirs.sizes().equals(mine.sizes()) && torch::equal(theirs.to(torch::kInt64), mine)) {
    return absl::OkStatus();
  }
  reading = kZeroBucketKey;
  torch::Tensor bytes;
  archive.read(reading, bytes);
  const int64_t their_bytes = bytes.item<int64_t>();
  if (their_bytes != sharding.bucket_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the optimizer state's ZeRO stage 1 shards were cut from ",
        BucketSetting(their_bytes), ", but this run cuts them from ",
        BucketSetting(sharding.bucket_bytes()),
        ", which gives other shards: resume with the checkpoint's training.gradient_bucket_mib",
        kStartOver));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      path, ": the optimizer state's ZeRO stage 1 shard layout (stage, elements, buckets, bucket "
      "sizes: ",
      Values(theirs), ") is not this run's (", Values(mine), ") with the same ", BucketSetting(their_bytes),
      ": written for another model or parallelism?", kStartOver));
}

// Copies every parameter of `stages` from the archive.
absl::Status CopyParameters(const std::string& path, torch::serialize::InputArchive& archive,
                            const std::vector<ModelStage*>& stages, std::string& reading) {
  torch::NoGradGuard no_grad;
  for (ModelStage* stage : stages) {
    for (auto& item : stage->named_parameters()) {
      reading = StageKey(*stage, item.key());
      torch::Tensor saved;
      if (!archive.try_read(reading, saved)) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": no parameter ", reading,
            " (written for another model or parallelism? remove the checkpoint directory "
            "to start over)"));
      }
      if (!saved.sizes().equals(item.value().sizes())) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, ": parameter ", reading, " has shape ", c10::str(saved.sizes()),
                         ", the model has ", c10::str(item.value().sizes())));
      }
      item.value().copy_(saved);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<LayerLayout>> RankCheckpoints::RecordedLayout(
    uint64_t iterations_done) const {
  const std::string path = PathFor(iterations_done);
  std::string reading;
  try {
    torch::serialize::InputArchive archive;
    VP_RETURN_IF_ERROR(OpenChecked(path, iterations_done, LayerLayout(), archive, reading));
    reading = kLayoutKey;
    torch::Tensor recorded;
    if (!archive.try_read(reading, recorded)) return std::optional<LayerLayout>();
    return std::optional<LayerLayout>(LayoutOfTensor(recorded));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(kDirField, ": ", path, ": cannot read ", reading,
                                            " of the checkpoint: ", e.what()));
  }
}

absl::Status RankCheckpoints::LoadParameters(uint64_t iterations_done,
                                             const std::vector<ModelStage*>& stages) const {
  const std::string path = PathFor(iterations_done);
  std::string reading;
  try {
    torch::serialize::InputArchive archive;
    VP_RETURN_IF_ERROR(OpenChecked(path, iterations_done, layout_, archive, reading));
    return CopyParameters(path, archive, stages, reading);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(kDirField, ": ", path, ": cannot read ", reading,
                                            " of the checkpoint: ", e.what()));
  }
}

absl::Status RankCheckpoints::Load(uint64_t iterations_done, const std::vector<ModelStage*>& stages,
                                   TrainingOptimizer& optimizer) const {
  const std::string path = PathFor(iterations_done);
  std::string reading = "the archive";
  try {
    torch::serialize::InputArchive archive;
    VP_RETURN_IF_ERROR(OpenChecked(path, iterations_done, layout_, archive, reading));
    torch::Tensor value;
    // The optimizer state's sharding first: a checkpoint of another
    // data-parallel degree or ZeRO stage is refused before anything changes.
    reading = "optimizer";
    torch::serialize::InputArchive optimizer_archive;
    archive.read(reading, optimizer_archive);
    if (absl::Status fits = optimizer.CheckShard(optimizer_archive); !fits.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": ", fits.message()));
    }
    if (sharding_ != nullptr) {
      VP_RETURN_IF_ERROR(CheckShardLayout(path, archive, *sharding_, reading));
    }
    VP_RETURN_IF_ERROR(CopyParameters(path, archive, stages, reading));
    reading = "optimizer";
    if (absl::Status loaded = optimizer.Load(optimizer_archive); !loaded.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": ", loaded.message()));
    }
    reading = "rng/cpu";
    value = torch::Tensor();
    archive.read(reading, value);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(value);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(kDirField, ": ", path, ": cannot read ", reading,
                                            " of the checkpoint: ", e.what()));
  }
  return absl::OkStatus();
}

void RankCheckpoints::DeleteOlderThan(uint64_t keep_from) const {
  for (uint64_t iteration : List()) {
    if (iteration >= keep_from) break;
    std::error_code ignored;
    const std::filesystem::path file = PathFor(iteration);
    std::filesystem::remove(file, ignored);
    std::filesystem::remove(file.parent_path(), ignored);  // only once empty
  }
}

absl::StatusOr<std::optional<uint64_t>> AgreeOnCheckpoint(const std::vector<uint64_t>& held,
                                                          Transport& host,
                                                          const std::vector<int>& world,
                                                          const std::string& dir) {
  // Every rank holds the newest complete checkpoint C and perhaps one newer
  // partial one, so the mean of the ranks' newest lies in [C, newer]: each
  // rank takes its newest checkpoint not above the mean. Iteration numbers
  // are exact in float up to 2^24.
  std::vector<float> newest{held.empty() ? -1.0f : static_cast<float>(held.back())};
  VP_RETURN_IF_ERROR(host.AllReduceMean(newest, world));
  std::optional<uint64_t> choice;
  for (uint64_t iteration : held) {
    if (static_cast<double>(iteration) <= static_cast<double>(newest[0]) + 1e-3) {
      choice = iteration;
    }
  }
  const float mine = choice.has_value() ? static_cast<float>(*choice) : -1.0f;
  std::vector<float> check{mine};
  VP_RETURN_IF_ERROR(host.AllReduceMean(check, world));
  if (std::abs(check[0] - mine) > 1e-3f) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks hold different checkpoints in ", kDirField, " ", dir,
        " (this rank would resume after ",
        choice.has_value() ? absl::StrCat(*choice, " iterations") : std::string("none"),
        "): remove the newest iteration_* directories until every rank's file is present in "
        "the newest one"));
  }
  return choice;
}

}  // namespace varipipe::executor
