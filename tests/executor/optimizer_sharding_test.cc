// ZeRO stage 1 (executor/runtime/optimizer_sharding.h) on executor ranks as
// threads (Gloo over loopback TCP, rendezvous through a real redis-server),
// each run against the same planner plans with training.zero_stage 0:
// - Zero1Equivalence: after three steps (AdamW with gradient clipping, or
//   SGD), every parameter of every rank equal to stage 0's within 1e-5
//   relative, and every iteration's loss and global gradient norm too; the
//   optimizer state per rank 1/dp of stage 0's (up to the shard padding).
// - Zero1Checkpoint: two steps, a checkpoint, a resumed third step equal to
//   three steps in one run; a checkpoint is refused by a run of another
//   data-parallel degree, naming both.
// - Zero1MemoryModel: each rank's measured parameter and optimizer-state
//   bytes against the planner's ModelStatePerDevice for the same layout.
// - Zero1Buckets: the shards are this rank's chunk of every gradient bucket
//   (views into the parameters' buffer); a checkpoint records the buckets it
//   was cut from and is refused, naming training.gradient_bucket_mib, by a
//   run cutting other ones (a file without a record: by a bucketed run).
// The threaded ranks cut ZeRO stage 1's shards from 8 KiB buckets (several
// per stage), whose reduce-scatters start inside the last backward pass.
#include "executor/runtime/optimizer_sharding.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dataset/sample_dataset.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/checkpoint.h"
#include "executor/runtime/counting_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/memory_model.h"
#include "planner/planner.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"
#include "tests/testing/threaded_ranks.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr int kIterations = 3;
constexpr double kTolerance = 1e-5;

struct Cell {
  std::string name;
  bool t5 = false;
  bool llama = false;  // LLAMA layers (docs/models.md)
  bool tied = false;   // LLAMA: tie_word_embeddings
  bool t5v11 = false;  // with t5: T5V11 layers, shared embedding across stages
  uint32_t pp = 1;
  uint32_t dp = 2;
  uint32_t chunks = 1;  // > 1: interleaved 1F1B, several stages per rank
  v1::Optimizer optimizer = v1::ADAMW;
};

absl::StatusOr<v1::JobConfig> CellConfig(const Cell& c, uint32_t zero_stage, int iterations) {
  TinyJob job;
  job.t5 = c.t5;
  job.llama = c.llama;
  job.tie_word_embeddings = c.tied;
  job.t5v11 = c.t5v11;
  job.pipeline = c.pp;
  job.data = c.dp;
  job.chunks = c.chunks;
  job.schedule = c.chunks > 1 ? v1::INTERLEAVED_1F1B : v1::ONE_F_ONE_B;
  job.optimizer = c.optimizer;
  job.iterations = static_cast<uint64_t>(iterations);
  absl::StatusOr<v1::JobConfig> config = TinyJobConfig(job);
  if (!config.ok()) return config;
  config->mutable_training()->set_zero_stage(zero_stage);
  if (c.optimizer == v1::ADAMW) {
    // Low enough that every step clips: the norm must be the global one.
    config->mutable_training()->set_gradient_clip_norm(0.05);
  }
  return config;
}

// The planner's plans of iterations [first, first + count), planned once
// with the stage 0 config: both stages run exactly the same plans.
std::vector<std::vector<v1::ExecutionPlan>> Plans(const v1::JobConfig& config,
                                                  const SampleDataset& dataset, int first,
                                                  int count) {
  std::vector<std::vector<v1::ExecutionPlan>> plans;
  for (int it = first; it < first + count; ++it) {
    absl::StatusOr<std::vector<v1::ExecutionPlan>> p = PlanTinyIteration(config, it, dataset);
    EXPECT_THAT(p, IsOk()) << "iteration " << it;
    if (!p.ok()) return {};
    plans.push_back(*std::move(p));
  }
  return plans;
}

std::vector<RankRun> RunRanks(const v1::JobConfig& config,
                              const std::vector<std::vector<v1::ExecutionPlan>>& plans,
                              const SampleDataset& dataset, const RedisServer& redis,
                              const std::string& prefix, const std::string& checkpoint_dir = "",
                              uint64_t resume_from = 0) {
  ThreadedRanksOptions options;
  options.redis_host = redis.host();
  options.redis_port = redis.port();
  options.redis_password = redis.password();
  options.prefix = prefix;
  options.checkpoint_dir = checkpoint_dir;
  options.resume_from = resume_from;
  return RunThreadedRanks(config, plans, dataset, options);
}

double RelativeDifference(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

class Zero1Equivalence : public ::testing::TestWithParam<Cell> {};

TEST_P(Zero1Equivalence, ThreeStepsMatchStageZero) {
  const Cell& c = GetParam();
  absl::StatusOr<v1::JobConfig> stage0 = CellConfig(c, 0, kIterations);
  absl::StatusOr<v1::JobConfig> stage1 = CellConfig(c, 1, kIterations);
  ASSERT_THAT(stage0, IsOk());
  ASSERT_THAT(stage1, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*stage0);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<std::vector<v1::ExecutionPlan>> plans =
      Plans(*stage0, **dataset, 0, kIterations);
  ASSERT_EQ(plans.size(), size_t{kIterations});
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::vector<RankRun> a = RunRanks(*stage0, plans, **dataset, **redis, "zero0");
  const std::vector<RankRun> b = RunRanks(*stage1, plans, **dataset, **redis, "zero1");
  ASSERT_EQ(a.size(), size_t{c.pp} * c.dp);
  ASSERT_EQ(b.size(), a.size());
  double worst_parameter = 0;
  std::string worst_name;
  double worst_norm = 0;
  double worst_loss = 0;
  double clipped_norm = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_THAT(a[r].status, IsOk()) << "stage 0, rank " << r;
    ASSERT_THAT(b[r].status, IsOk()) << "stage 1, rank " << r;
    ASSERT_EQ(a[r].stats.size(), size_t{kIterations});
    ASSERT_EQ(b[r].stats.size(), size_t{kIterations});
    for (int it = 0; it < kIterations; ++it) {
      const double norm = RelativeDifference(b[r].stats[it].grad_norm, a[r].stats[it].grad_norm);
      EXPECT_LE(norm, kTolerance) << "rank " << r << " iteration " << it;
      worst_norm = std::max(worst_norm, norm);
      clipped_norm = std::max(clipped_norm, a[r].stats[it].grad_norm);
      EXPECT_EQ(b[r].stats[it].has_loss, a[r].stats[it].has_loss);
      if (a[r].stats[it].has_loss) {
        const double loss = RelativeDifference(b[r].stats[it].loss, a[r].stats[it].loss);
        EXPECT_LE(loss, kTolerance) << "rank " << r << " iteration " << it;
        worst_loss = std::max(worst_loss, loss);
      }
    }
    const TensorDifference d = MaxRelativeDifference(b[r].parameters, a[r].parameters);
    EXPECT_LE(d.worst, kTolerance) << "rank " << r << ": parameter " << d.worst_name;
    EXPECT_EQ(d.compared, static_cast<int>(a[r].parameters.size()));
    if (d.worst >= worst_parameter) {
      worst_parameter = d.worst;
      worst_name = d.worst_name;
    }
    // Replicas of a stage stay identical (the all-gather gives every rank
    // the same bits).
    const size_t replica0 = r % c.pp;
    EXPECT_EQ(MaxRelativeDifference(b[r].parameters, b[replica0].parameters).worst, 0.0)
        << "rank " << r << " differs from rank " << replica0;
    // So do the stages' copies of a shared parameter (a tied embedding,
    // T5V11's shared embedding and bias tables), under both stages: each
    // equals the copy of the first rank of its pipeline replica holding it.
    for (const char* shared :
         {"word_embedding", "encoder_relative_bias", "decoder_relative_bias"}) {
      for (const std::vector<RankRun>* run : {&a, &b}) {
        if (!(*run)[r].parameters.contains(shared)) continue;
        size_t owner = r - r % c.pp;
        while (!(*run)[owner].parameters.contains(shared)) ++owner;
        EXPECT_TRUE(
            torch::equal((*run)[r].parameters.at(shared), (*run)[owner].parameters.at(shared)))
            << "rank " << r << "'s " << shared << " drifted from rank " << owner << "'s";
      }
    }
    // The optimizer state: AdamW's moments of 1/dp of the parameters (each
    // stage's shard padded by fewer than dp elements); SGD has none.
    const int64_t whole = a[r].optimizer_state_bytes.back();
    const int64_t shard = b[r].optimizer_state_bytes.back();
    if (c.optimizer == v1::ADAMW) {
      EXPECT_EQ(whole, 2 * a[r].parameter_bytes) << "rank " << r;
      EXPECT_GE(shard * static_cast<int64_t>(c.dp), whole) << "rank " << r;
      EXPECT_LT(shard * static_cast<int64_t>(c.dp), whole + int64_t{8} * c.dp * c.dp * c.chunks)
          << "rank " << r;
    } else {
      EXPECT_EQ(whole, 0);
      EXPECT_EQ(shard, 0);
    }
  }
  // Clipping was active (AdamW cells), so the norm had to be the global one.
  if (c.optimizer == v1::ADAMW) {
    EXPECT_GT(clipped_norm, 0.05);
  }
  std::printf(
      "%s: after %d steps, stage 1 vs stage 0: worst relative difference of parameters %.3g "
      "(%s), grad norm %.3g, loss %.3g; rank 0 optimizer state %lld vs %lld bytes\n",
      c.name.c_str(), kIterations, worst_parameter, worst_name.c_str(), worst_norm, worst_loss,
      static_cast<long long>(b[0].optimizer_state_bytes.back()),
      static_cast<long long>(a[0].optimizer_state_bytes.back()));
}

INSTANTIATE_TEST_SUITE_P(
    Cells, Zero1Equivalence,
    ::testing::Values(Cell{.name = "Gpt_pp1dp2"}, Cell{.name = "Gpt_pp2dp2", .pp = 2},
                      Cell{.name = "T5_pp1dp2", .t5 = true},
                      Cell{.name = "T5_pp2dp2", .t5 = true, .pp = 2},
                      Cell{.name = "Gpt_pp1dp3", .dp = 3},
                      Cell{.name = "GptInterleaved2_pp2dp2", .pp = 2, .chunks = 2},
                      Cell{.name = "GptSgd_pp2dp2", .pp = 2, .optimizer = v1::SGD},
                      Cell{.name = "Llama_pp2dp2", .llama = true, .pp = 2},
                      Cell{.name = "LlamaTied_pp2dp2", .llama = true, .tied = true, .pp = 2},
                      Cell{.name = "T5v11_pp2dp2", .t5 = true, .t5v11 = true, .pp = 2}),
    [](const auto& info) { return info.param.name; });

// A data-parallel degree of 1 leaves nothing to shard: stage 1 is stage 0.
TEST(Zero1Equivalence, DataParallelDegreeOneIsStageZero) {
  absl::StatusOr<v1::JobConfig> config = CellConfig({.name = "Gpt_pp1dp1", .dp = 1}, 1, 1);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  absl::StatusOr<std::vector<executor::StageRole>> roles = executor::PipelineStageRoles(*spec, 1);
  ASSERT_THAT(roles, IsOk());
  executor::ModelStage stage(*spec, (*roles)[0]);
  absl::StatusOr<executor::RankOptimizer> optimizer =
      executor::MakeRankOptimizer({{0, &stage}}, config->training(), {0}, 0, torch::kCPU);
  ASSERT_THAT(optimizer, IsOk());
  EXPECT_EQ(optimizer->sharding, nullptr);
  EXPECT_FALSE(optimizer->optimizer->shard().sharded());
}

// Checkpoints hold each rank's shard: two steps, a checkpoint, and a resumed
// third step give the parameters of three steps in one run (bit for bit:
// the same reductions in the same order). Stage 0 checkpoints keep working
// the same way.
TEST(Zero1Checkpoint, ResumesWithTheSameDataParallelDegree) {
  for (uint32_t zero_stage : {1u, 0u}) {
    const Cell c{.name = "Gpt_pp2dp2", .pp = 2};
    absl::StatusOr<v1::JobConfig> config = CellConfig(c, zero_stage, kIterations);
    ASSERT_THAT(config, IsOk());
    absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
    ASSERT_THAT(dataset, IsOk());
    const std::vector<std::vector<v1::ExecutionPlan>> plans =
        Plans(*config, **dataset, 0, kIterations);
    ASSERT_EQ(plans.size(), size_t{kIterations});
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    const std::filesystem::path dir =
        PerTestDirectory(absl::StrCat("zero1-checkpoint-stage", zero_stage));
    const std::vector<RankRun> whole = RunRanks(*config, plans, **dataset, **redis, "whole");
    const std::vector<RankRun> first =
        RunRanks(*config, {plans[0], plans[1]}, **dataset, **redis, "first", dir.string());
    ASSERT_EQ(whole.size(), 4u);
    for (size_t r = 0; r < whole.size(); ++r) {
      ASSERT_THAT(whole[r].status, IsOk()) << "rank " << r;
      ASSERT_THAT(first[r].status, IsOk()) << "rank " << r;
      ASSERT_TRUE(std::filesystem::exists(
          executor::RankCheckpoints(dir.string(), static_cast<int>(r)).PathFor(2)));
    }
    const std::vector<RankRun> third =
        RunRanks(*config, {plans[2]}, **dataset, **redis, "resumed", dir.string(), 2);
    for (size_t r = 0; r < whole.size(); ++r) {
      ASSERT_THAT(third[r].status, IsOk()) << "rank " << r;
      const TensorDifference d = MaxRelativeDifference(third[r].parameters, whole[r].parameters);
      EXPECT_EQ(d.worst, 0.0) << "stage " << zero_stage << " rank " << r << ": " << d.worst_name;
      EXPECT_EQ(third[r].optimizer_state_bytes.back(), whole[r].optimizer_state_bytes.back());
    }
    std::filesystem::remove_all(dir);
  }
}

// A checkpoint records the job's stage layout: a run under another layout
// is refused naming both, before any parameter changes; a file without one
// (an older executor's) is not compared.
TEST(CheckpointLayout, RefusesAnotherStageLayout) {
  absl::StatusOr<v1::JobConfig> config = CellConfig({.name = "Gpt_pp2", .pp = 2}, 0, 1);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  spec->layers = LayerLayout{.encoder = {3, 1}, .decoder = {0, 0}};
  const executor::StageRole role = (*executor::PipelineStageRoles(*spec, 2))[0];
  const std::filesystem::path dir = PerTestDirectory("checkpoint-layout");
  const LayerLayout three_one = spec->layers;
  {
    executor::ModelStage stage(*spec, role);
    absl::StatusOr<executor::RankOptimizer> optimizer =
        executor::MakeRankOptimizer({{0, &stage}}, config->training(), {0}, 0, torch::kCPU);
    ASSERT_THAT(optimizer, IsOk());
    ASSERT_THAT(executor::RankCheckpoints(dir.string(), 0, three_one)
                    .Save(1, {&stage}, *optimizer->optimizer),
                IsOk());
    ASSERT_THAT(executor::RankCheckpoints(dir.string(), 0).Save(2, {&stage}, *optimizer->optimizer),
                IsOk());
  }
  absl::StatusOr<std::optional<LayerLayout>> recorded =
      executor::RankCheckpoints(dir.string(), 0).RecordedLayout(1);
  ASSERT_THAT(recorded, IsOk());
  ASSERT_TRUE(recorded->has_value());
  EXPECT_EQ(**recorded, three_one);
  executor::ModelStage stage(*spec, role);
  absl::StatusOr<executor::RankOptimizer> optimizer =
      executor::MakeRankOptimizer({{0, &stage}}, config->training(), {0}, 0, torch::kCPU);
  ASSERT_THAT(optimizer, IsOk());
  const torch::Tensor before = stage.parameters()[0].detach().clone();
  const LayerLayout two_two{.encoder = {2, 2}, .decoder = {0, 0}};
  EXPECT_THAT(
      executor::RankCheckpoints(dir.string(), 0, two_two).Load(1, {&stage}, *optimizer->optimizer),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("rank_00000.pt"),
                     HasSubstr("written with the stage layout 3+1 but this job's is 2+2"))));
  EXPECT_TRUE(torch::equal(stage.parameters()[0], before)) << "a refused load changed a parameter";
  EXPECT_THAT(executor::RankCheckpoints(dir.string(), 0, three_one)
                  .Load(1, {&stage}, *optimizer->optimizer),
              IsOk());
  // No layout recorded: nothing to compare.
  absl::StatusOr<std::optional<LayerLayout>> none =
      executor::RankCheckpoints(dir.string(), 0, two_two).RecordedLayout(2);
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());
  EXPECT_THAT(
      executor::RankCheckpoints(dir.string(), 0, two_two).Load(2, {&stage}, *optimizer->optimizer),
      IsOk());
  std::filesystem::remove_all(dir);
}

// A stage 1 checkpoint of data-parallel degree 2 is refused, before any
// parameter changes, by a run of degree 4 (sharded) or 1 (whole state), and
// a stage 0 checkpoint by a stage 1 run; each error names both settings.
TEST(Zero1Checkpoint, RefusesAnotherDataParallelDegree) {
  absl::StatusOr<v1::JobConfig> config = CellConfig({.name = "Gpt_pp1dp2"}, 1, 1);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  const executor::StageRole role = (*executor::PipelineStageRoles(*spec, 1))[0];
  const std::filesystem::path dir = PerTestDirectory("zero1-refuse");
  const executor::RankCheckpoints checkpoints(dir.string(), 0);
  // Saved as shard 0 of 2 after one (local) step.
  {
    executor::ModelStage stage(*spec, role);
    absl::StatusOr<executor::RankOptimizer> saved =
        executor::MakeRankOptimizer({{0, &stage}}, config->training(), {0, 1}, 0, torch::kCPU);
    ASSERT_THAT(saved, IsOk());
    ASSERT_NE(saved->sharding, nullptr);
    for (torch::Tensor& p : saved->sharding->shard_parameters()) {
      p.mutable_grad() = torch::ones_like(p);
    }
    saved->optimizer->Step(0, 1.0);
    ASSERT_THAT(checkpoints.Save(1, {&stage}, *saved->optimizer), IsOk());
    ASSERT_THAT(checkpoints.Load(1, {&stage}, *saved->optimizer), IsOk());
  }
  const auto load = [&](uint32_t zero_stage, std::vector<int> group) {
    v1::TrainingConfig training = config->training();
    training.set_zero_stage(zero_stage);
    executor::ModelStage stage(*spec, role);
    const torch::Tensor before = stage.parameters()[0].detach().clone();
    absl::StatusOr<executor::RankOptimizer> optimizer =
        executor::MakeRankOptimizer({{0, &stage}}, training, group, 0, torch::kCPU);
    EXPECT_THAT(optimizer, IsOk());
    const absl::Status status = checkpoints.Load(1, {&stage}, *optimizer->optimizer);
    EXPECT_TRUE(torch::equal(stage.parameters()[0], before))
        << "a refused load changed a parameter";
    return status;
  };
  EXPECT_THAT(load(1, {0, 1, 2, 3}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank_00000.pt"), HasSubstr("data-parallel degree 2"),
                             HasSubstr("data-parallel degree 4"))));
  EXPECT_THAT(load(1, {0}), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     AllOf(HasSubstr("data-parallel degree 2"),
                                           HasSubstr("data-parallel degree 1"))));
  // A stage 0 checkpoint, loaded by a sharded run.
  {
    executor::ModelStage stage(*spec, role);
    v1::TrainingConfig training = config->training();
    training.set_zero_stage(0);
    absl::StatusOr<executor::RankOptimizer> whole =
        executor::MakeRankOptimizer({{0, &stage}}, training, {0, 1}, 0, torch::kCPU);
    ASSERT_THAT(whole, IsOk());
    ASSERT_EQ(whole->sharding, nullptr);
    ASSERT_THAT(checkpoints.Save(2, {&stage}, *whole->optimizer), IsOk());
  }
  {
    executor::ModelStage stage(*spec, role);
    absl::StatusOr<executor::RankOptimizer> sharded =
        executor::MakeRankOptimizer({{0, &stage}}, config->training(), {0, 1}, 0, torch::kCPU);
    ASSERT_THAT(sharded, IsOk());
    EXPECT_THAT(checkpoints.Load(2, {&stage}, *sharded->optimizer),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("whole optimizer state"), HasSubstr("zero_stage 0"),
                               HasSubstr("data-parallel degree 2"))));
  }
  std::filesystem::remove_all(dir);
}

// The shards of 8 KiB buckets at dp 2: one view per bucket, each half of
// its bucket, together half the padded buffer, aliasing the parameters; the
// unbucketed shard is the old contiguous half.
TEST(Zero1Buckets, ShardsAreThisRanksChunkOfEveryBucket) {
  absl::StatusOr<v1::JobConfig> config = CellConfig({.name = "Gpt_pp1dp2"}, 1, 1);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  const executor::StageRole role = (*executor::PipelineStageRoles(*spec, 1))[0];
  for (int64_t bucket_bytes : {int64_t{8} << 10, int64_t{0}}) {
    executor::ModelStage stage(*spec, role);
    int64_t numel = 0;
    for (const torch::Tensor& p : stage.parameters()) numel += p.numel();
    absl::StatusOr<executor::RankOptimizer> sharded = executor::MakeRankOptimizer(
        {{0, &stage}}, config->training(), {0, 1}, 1, torch::kCPU, bucket_bytes);
    ASSERT_THAT(sharded, IsOk());
    ASSERT_NE(sharded->sharding, nullptr);
    EXPECT_EQ(sharded->sharding->bucketed(), bucket_bytes > 0);
    const std::vector<torch::Tensor> shards = sharded->sharding->shard_parameters();
    const int64_t expected_buckets =
        bucket_bytes > 0 ? (numel + 2047) / 2048 : 1;  // 2,048 floats per bucket
    EXPECT_EQ(static_cast<int64_t>(shards.size()), expected_buckets) << bucket_bytes;
    int64_t total = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
      if (bucket_bytes > 0 && k + 1 < shards.size()) {
        EXPECT_EQ(shards[k].numel(), 1024) << k;
      }
      EXPECT_TRUE(shards[k].storage().is_alias_of(stage.parameters()[0].storage())) << k;
      ASSERT_TRUE(shards[k].grad().defined()) << k;
      EXPECT_TRUE(
          shards[k].grad().storage().is_alias_of(stage.parameters()[0].grad().storage()))
          << k;
      total += shards[k].numel();
    }
    EXPECT_EQ(total, (numel + 1) / 2) << bucket_bytes;
    if (bucket_bytes == 0) {
      // Rank 1's half of the parameters in order: the old layout.
      EXPECT_EQ(shards[0].storage_offset() - stage.parameters()[0].storage_offset(),
                (numel + 1) / 2);
    }
  }
}

// A checkpoint written with 8 KiB buckets is refused by runs cutting 16 KiB
// buckets or none, naming training.gradient_bucket_mib, with no parameter
// changed, and loads into 8 KiB buckets; a file without a record (an older
// executor's, or written without the sharding) loads into the unbucketed
// layout and is refused by a bucketed one.
TEST(Zero1Buckets, CheckpointsRefuseAnotherBucketSize) {
  absl::StatusOr<v1::JobConfig> config = CellConfig({.name = "Gpt_pp1dp2"}, 1, 1);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  const executor::StageRole role = (*executor::PipelineStageRoles(*spec, 1))[0];
  const std::filesystem::path dir = PerTestDirectory("zero1-buckets");
  const auto save = [&](int64_t bucket_bytes, uint64_t iteration, bool record) {
    executor::ModelStage stage(*spec, role);
    absl::StatusOr<executor::RankOptimizer> saved = executor::MakeRankOptimizer(
        {{0, &stage}}, config->training(), {0, 1}, 0, torch::kCPU, bucket_bytes);
    ASSERT_THAT(saved, IsOk());
    for (torch::Tensor& p : saved->sharding->shard_parameters()) p.mutable_grad().fill_(1);
    saved->optimizer->Step(0, 1.0);
    ASSERT_THAT(executor::RankCheckpoints(dir.string(), 0, {},
                                          record ? saved->sharding.get() : nullptr)
                    .Save(iteration, {&stage}, *saved->optimizer),
                IsOk());
  };
  save(8 << 10, 1, /*record=*/true);
  save(0, 2, /*record=*/false);
  const auto load = [&](int64_t bucket_bytes, uint64_t iteration) {
    executor::ModelStage stage(*spec, role);
    const torch::Tensor before = stage.parameters()[0].detach().clone();
    absl::StatusOr<executor::RankOptimizer> optimizer = executor::MakeRankOptimizer(
        {{0, &stage}}, config->training(), {0, 1}, 0, torch::kCPU, bucket_bytes);
    EXPECT_THAT(optimizer, IsOk());
    const absl::Status status =
        executor::RankCheckpoints(dir.string(), 0, {}, optimizer->sharding.get())
            .Load(iteration, {&stage}, *optimizer->optimizer);
    if (!status.ok()) {
      EXPECT_TRUE(torch::equal(stage.parameters()[0], before))
          << "a refused load changed a parameter";
    } else {
      // The loaded state steps (its moments fit the shards).
      for (torch::Tensor& p : optimizer->sharding->shard_parameters()) p.mutable_grad().fill_(1);
      optimizer->optimizer->Step(1, 1.0);
    }
    return status;
  };
  EXPECT_THAT(load(8 << 10, 1), IsOk());
  EXPECT_THAT(load(16 << 10, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank_00000.pt"), HasSubstr("buckets of 8192 bytes"),
                             HasSubstr("buckets of 16384 bytes"),
                             HasSubstr("training.gradient_bucket_mib"))));
  EXPECT_THAT(load(0, 1), StatusIs(absl::StatusCode::kFailedPrecondition,
                                   AllOf(HasSubstr("buckets of 8192 bytes"),
                                         HasSubstr("training.gradient_bucket_mib 0"))));
  EXPECT_THAT(load(0, 2), IsOk());
  EXPECT_THAT(load(8 << 10, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("without a record of its ZeRO stage 1 shard layout"),
                             HasSubstr("resume with training.gradient_bucket_mib 0"))));
  std::filesystem::remove_all(dir);
}

// The executor's measured model state per rank against the planner's
// ModelStatePerDevice for the same model and layout (GPT and T5, pp = 2,
// dp = 2, stages 0 and 1; LLAMA too): the planner counts 4 bytes of parameters, 4 of
// gradients and 8 of AdamW moments per parameter whatever model.dtype, the
// executor's layout (fp32 master weights, autocast on GPUs). The planner's
// parameter count omits only MEGATRON T5's final encoder LayerNorm (2h
// parameters on the last encoder device): the executor's count is the
// planner's plus exactly that (T5V11: exactly the planner's). Under stage 1 the measured optimizer
// state falls by (1 - 1/dp) of stage 0's, as the prediction does.
TEST(Zero1MemoryModel, MeasuredModelStateMatchesThePrediction) {
  // The tied LLAMA head counts the last stage's replica of the embedding
  // (StageLayout::tied_embedding_replica); T5V11 the decoder stage's replica
  // of the shared embedding and each stage's bias table.
  for (const auto& [t5, llama, tied, t5v11] :
       {std::tuple{false, false, false, false}, std::tuple{true, false, false, false},
        std::tuple{false, true, false, false}, std::tuple{false, true, true, false},
        std::tuple{true, false, false, true}}) {
    std::map<uint32_t, std::vector<RankRun>> runs;
    std::vector<double> planned;
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    for (uint32_t zero_stage : {0u, 1u}) {
      const Cell c{
          .name = "pp2dp2", .t5 = t5, .llama = llama, .tied = tied, .t5v11 = t5v11, .pp = 2};
      absl::StatusOr<v1::JobConfig> config = CellConfig(c, zero_stage, 1);
      ASSERT_THAT(config, IsOk());
      absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
      ASSERT_THAT(dataset, IsOk());
      const std::vector<std::vector<v1::ExecutionPlan>> plans = Plans(*config, **dataset, 0, 1);
      ASSERT_EQ(plans.size(), 1u);
      runs[zero_stage] =
          RunRanks(*config, plans, **dataset, **redis, absl::StrCat("memory", zero_stage));
      absl::StatusOr<planner::Planner> planner = planner::Planner::Create(*config);
      ASSERT_THAT(planner, IsOk());
      absl::StatusOr<planner::StageLayout> layout =
          planner::MakeStageLayout(planner::ModelDimsFromConfig(config->model()), c.pp, 1);
      ASSERT_THAT(layout, IsOk());
      planned = planner::ParametersPerDevice(planner->cost_model(), *layout);
      ASSERT_EQ(planned.size(), 2u);
    }
    for (uint32_t zero_stage : {0u, 1u}) {
      const planner::ZeroStage zero =
          zero_stage == 1 ? planner::ZeroStage::k1 : planner::ZeroStage::k0;
      for (size_t r = 0; r < 4; ++r) {
        const RankRun& run = runs[zero_stage][r];
        ASSERT_THAT(run.status, IsOk()) << "stage " << zero_stage << " rank " << r;
        // The executor's parameters: the planner's plus what it omits.
        double unmodelled = 0;
        for (const auto& [name, p] : run.parameters) {
          if (absl::StrContains(name, "encoder_ln_")) {
            unmodelled += static_cast<double>(p.numel());
          }
        }
        const double count = static_cast<double>(run.parameter_bytes) / 4;
        EXPECT_DOUBLE_EQ(count, planned[r % 2] + unmodelled) << "rank " << r;
        const planner::ModelStateBytes predicted = planner::ModelStatePerDevice(count, zero, 2);
        const planner::ModelStateBytes planner_own =
            planner::ModelStatePerDevice(planned[r % 2], zero, 2);
        const double optimizer = static_cast<double>(run.optimizer_state_bytes.front());
        EXPECT_DOUBLE_EQ(static_cast<double>(run.parameter_bytes), predicted.parameters);
        // Equal up to the shard padding (fewer than dp elements per stage).
        EXPECT_GE(optimizer, predicted.optimizer) << "rank " << r;
        EXPECT_LT(optimizer, predicted.optimizer + 8 * 2) << "rank " << r;
        std::printf(
            "%s stage %u rank %zu: measured parameters %lld + optimizer state %.0f = %.0f bytes; "
            "predicted for the executor's %.0f parameters %.0f + %.0f = %.0f bytes; for the "
            "planner's own count (%.0f parameters, without %.0f encoder-LayerNorm ones) %.0f + "
            "%.0f = %.0f bytes\n",
            t5v11   ? "T5V11"
            : t5    ? "T5"
            : tied  ? "LLAMA tied"
            : llama ? "LLAMA"
                    : "GPT",
            zero_stage, r, static_cast<long long>(run.parameter_bytes), optimizer,
            static_cast<double>(run.parameter_bytes) + optimizer, count, predicted.parameters,
            predicted.optimizer, predicted.parameters + predicted.optimizer, planned[r % 2],
            unmodelled, planner_own.parameters, planner_own.optimizer,
            planner_own.parameters + planner_own.optimizer);
      }
    }
    // The fall from stage 0 to stage 1: half the optimizer state, measured
    // and predicted.
    for (size_t r = 0; r < 4; ++r) {
      const double fall = static_cast<double>(runs[0][r].optimizer_state_bytes.front() -
                                              runs[1][r].optimizer_state_bytes.front());
      const double count = static_cast<double>(runs[0][r].parameter_bytes) / 4;
      EXPECT_NEAR(fall, 8 * count / 2, 8.0) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace varipipe::testing
