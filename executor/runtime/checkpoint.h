// Per-rank training checkpoints (training.checkpoint_dir, every
// training.checkpoint_interval iterations; docs/operations.md).
//
// Layout: DIR/iteration_NNNNNN/rank_NNNNN.pt is the state of one rank after N
// iterations (resuming runs iteration N next): its stages' parameters
// ("stage<S>/<name>"), AdamW's state (under ZeRO stage 1 the rank's shard
// of it, with the data-parallel degree and shard index: such a checkpoint
// resumes only with the same degree), N, the rank and the CPU generator's
// state, in one LibTorch archive. A file is written to a temporary name,
// synced and renamed, so a rank's file is either complete or absent. The
// file also records the job's stage layout ("varipipe/stage_layout": each
// stage's encoder layers, then each stage's decoder layers): a layout
// changes which stage holds which layer, so resuming under another one is
// refused, naming both.
//
// Under ZeRO stage 1 the file also records the layout the optimizer state's
// shards were cut from ("varipipe/zero_layout", "varipipe/zero_bucket_bytes":
// each stage's gradient buckets, optimizer_sharding.h) when the checkpoints
// know the sharding: a file of another layout (another
// training.gradient_bucket_mib) is refused naming the setting, before
// anything changes; a file without one (an older executor's: one bucket per
// stage) loads only into that layout.
//
// A checkpoint is complete when every rank holds its file. Ranks delete
// their older files only after all ranks wrote the newer one (a barrier), and
// keep the two newest, so every rank always holds the newest complete
// checkpoint, and at most one newer, partial one exists.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_CHECKPOINT_H_
#define VARIPIPE_EXECUTOR_RUNTIME_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/comm/transport.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/optimizer_sharding.h"
#include "executor/runtime/training_optimizer.h"

namespace varipipe::executor {

class RankCheckpoints {
 public:
  // `layout`: the job's stage layout, recorded in every file this writes;
  // a file recording another is refused on load, naming both (files of
  // older executors record none and are not compared). Empty: none.
  // `sharding` (not owned; null without ZeRO stage 1): its shard layout is
  // recorded and checked likewise. Null under stage 1: nothing is recorded
  // or checked (a file of another layout then fails to load, or fails the
  // first step, with LibTorch's error).
  RankCheckpoints(std::string dir, int rank, LayerLayout layout = {},
                  const OptimizerSharding* sharding = nullptr)
      : dir_(std::move(dir)), rank_(rank), layout_(std::move(layout)), sharding_(sharding) {}

  std::string PathFor(uint64_t iterations_done) const;

  // Iterations of the checkpoints this rank holds a complete file of,
  // ascending (temporary files of interrupted writes are ignored).
  std::vector<uint64_t> List() const;

  // Writes the state after `iterations_done` iterations atomically.
  absl::Status Save(uint64_t iterations_done, const std::vector<ModelStage*>& stages,
                    const TrainingOptimizer& optimizer) const;

  // Restores parameters, optimizer state and the generator's state; fails
  // naming the file and the tensor when it does not fit these stages.
  absl::Status Load(uint64_t iterations_done, const std::vector<ModelStage*>& stages,
                    TrainingOptimizer& optimizer) const;

  // Restores only the parameters of `stages` (varipipe-export-hf): no
  // optimizer state, no generator; the same errors as Load for them.
  absl::Status LoadParameters(uint64_t iterations_done,
                              const std::vector<ModelStage*>& stages) const;

  // The stage layout this rank's file of `iterations_done` records
  // (nullopt: a file of an older executor, which records none).
  absl::StatusOr<std::optional<LayerLayout>> RecordedLayout(uint64_t iterations_done) const;

  // Deletes this rank's files of checkpoints older than `keep_from` (and
  // their directories once empty).
  void DeleteOlderThan(uint64_t keep_from) const;

 private:
  std::string dir_;
  int rank_;
  LayerLayout layout_;
  const OptimizerSharding* sharding_;
};

// The newest checkpoint every rank of `world` holds, agreed over `host`
// (collective: every rank calls it with its own List()). nullopt: none.
// Relies on the invariant above (every rank holds the newest complete one);
// fails when ranks still disagree, naming the directory.
absl::StatusOr<std::optional<uint64_t>> AgreeOnCheckpoint(const std::vector<uint64_t>& held,
                                                          Transport& host,
                                                          const std::vector<int>& world,
                                                          const std::string& dir);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_CHECKPOINT_H_
