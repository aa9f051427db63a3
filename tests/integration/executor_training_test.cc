// Real executor processes (Gloo over loopback, rendezvous through a real
// redis-server) running plans that varipipe-plan emitted:
// - equivalence: pp=2, dp=2 (4 processes), three plain-SGD steps leave the
//   parameters of the independent reference model (1e-5 relative, fp32),
//   GPT and T5;
// - training.init_from: the same at pp=2, dp=2 from a Hugging Face Llama
//   checkpoint;
// - ten iterations of pp=4 on a small GPT: every rank exits 0, the loss
//   decreases (the data is learnable: arithmetic token sequences), and rank 0
//   writes one metrics line per iteration.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/hf_checkpoint.h"
#include "common/checkpoint/hf_export_config.h"
#include "common/config/job_config.h"
#include "common/dataset/sample_dataset.h"
#include "common/redis/redis_client.h"
#include "executor/model/hf_export.h"
#include "executor/model/hf_weights.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/model/tensor_shard.h"
#include "executor/runtime/plan_files.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/saved_parameters.h"
#include "tests/testing/split_backward.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::Config;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::LaunchRanks;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;

using ::varipipe::testing::IsOk;

struct EquivalenceCase {
  bool t5 = false;
  std::string schedule;     // planner.schedules
  std::string recompute;    // planner.recompute_modes
  std::string method;       // planner.partition_methods
  std::string name;         // names the model, schedule and recompute mode
  uint32_t zero_stage = 0;  // training.zero_stage
  // parallelism.tensor (2: pp = 2, dp = 1, the four processes two tensor
  // groups) and sequence_parallel.
  uint32_t tensor = 1;
  bool sequence_parallel = false;
};

constexpr int kSgdIterations = 3;

class ProcessEquivalence : public ::testing::TestWithParam<EquivalenceCase> {};

// The process-level subset of the equivalence matrix (the threaded matrix is
// tests/executor/equivalence_test.cc): four varipipe-executor processes,
// pp = 2, dp = 2 (tensor-parallel cases: pp = 2, tensor = 2, each rank
// compared on its part of every parameter), three plain-SGD steps (constant
// learning rate, no clipping) against the independent reference model: every
// parameter within 1e-5 relative on every rank. The zero-bubble cases split
// backwards into B and W.
TEST_P(ProcessEquivalence, FourProcessesMatchTheReferenceAfterThreeSgdSteps) {
  const EquivalenceCase& c = GetParam();
  const bool t5 = c.t5;
  const bool recompute_full = c.recompute == "RECOMPUTE_FULL";
  const int tensor = static_cast<int>(c.tensor);
  const int data = 2 / tensor;
  const int plan_ranks = 4 / tensor;  // one plan per pipeline rank
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("equiv-" + c.name);
  std::ofstream(dir / "job.json") << absl::StrCat(
      R"({"job_id": "equivalence", "model": {"kind": ")", t5 ? "T5" : "GPT",
      R"(", "num_layers": 4, )", t5 ? R"("num_decoder_layers": 4, )" : "",
      R"("hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 64, "vocab_size": 61,
        "dtype": "FLOAT32"},
      "parallelism": {"pipeline": 2, "data": )",
      data, R"(, "tensor": )", tensor, c.sequence_parallel ? R"(, "sequence_parallel": true)" : "",
      R"(},
      "cluster": {"device_memory_limit_mib": )",
      (t5 && !recompute_full) || c.method == "PACKING" ? 8 : 4,
      R"(, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1200,
               "max_sequence_length": 96, )",
      t5 ? R"("max_target_length": 48, )" : "",
      R"("seed": 11, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01, "schedules": [")",
      c.schedule, R"("],
                  "recompute_modes": [")",
      c.recompute, R"("],
                  "partition_methods": [")",
      c.method, R"("], "fixed_micro_batch_size": 2},
      "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
      (*redis)->port(), R"("},
      "training": {"iterations": )",
      kSgdIterations, R"(, "optimizer": "SGD",
                   "learning_rate": 0.05, "min_learning_rate": 0.05,
                   "gradient_clip_norm": 0, "zero_stage": )",
      c.zero_stage, "}}");
  const CommandResult plan = RunCommand(
      absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-plan"),
                   " --config job.json --iterations ", kSgdIterations, " --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const CommandResult run =
      LaunchRanks(dir, 4, (*redis)->password(),
                  "--config job.json --plans plans --run_id test --save_parameters params");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Every rank logs its measured model state after its first step.
  EXPECT_THAT(run.output, ::testing::HasSubstr(absl::StrCat(
                              "optimizer state ", c.zero_stage == 1 ? "sharded" : "whole")));
  EXPECT_THAT(run.output, ::testing::HasSubstr(absl::StrCat("(training.zero_stage ", c.zero_stage,
                                                            ", data-parallel degree ", data, ")")));
  if (tensor > 1) {
    EXPECT_THAT(run.output, ::testing::HasSubstr(absl::StrCat("tensor parallelism: index 1 of ",
                                                              tensor, " (global ranks 2,3)")));
  }

  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile((dir / "job.json").string());
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  testing::ReferenceModel reference(*config);
  const testing::NamedTensors initial = [&] {
    testing::NamedTensors copy;
    for (const auto& [name, p] : reference.parameters()) copy[name] = p.detach().clone();
    return copy;
  }();
  for (int it = 0; it < kSgdIterations; ++it) {
    std::vector<v1::ExecutionPlan> plans;
    int micro_batches = 0;
    for (int r = 0; r < plan_ranks; ++r) {
      absl::StatusOr<v1::ExecutionPlan> p = executor::ReadPlanFile((dir / "plans").string(), it, r);
      ASSERT_THAT(p, IsOk());
      if (p->pp_rank() == 0) micro_batches += p->micro_batches_size();
      EXPECT_EQ(p->schedule(), absl::AsciiStrToLower(c.schedule));
      EXPECT_EQ(p->recompute(), recompute_full                         ? "full"
                                : c.recompute == "RECOMPUTE_SELECTIVE" ? "selective"
                                                                       : "none");
      plans.push_back(*std::move(p));
    }
    EXPECT_GE(micro_batches, 2);
    if (absl::StrContains(c.schedule, "ZERO_BUBBLE")) {
      EXPECT_GE(testing::SplitBackwards(plans), 1) << "iteration " << it;
    }
    const testing::ReferencePass pass =
        reference.Gradients(testing::IterationSamples(plans), **dataset);
    EXPECT_EQ(plans[0].global_target_tokens(), pass.loss_tokens);
    std::printf("iteration %d: %d micro-batches, reference loss %.9f\n", it, micro_batches,
                pass.loss);
    reference.SgdStep(pass.gradients, config->training().learning_rate());
  }
  int compared = 0;
  for (int r = 0; r < 4; ++r) {
    const testing::NamedTensors trained =
        testing::LoadParameters(dir / absl::StrFormat("params.rank_%05d.pt", r));
    // Global rank r holds tensor index r % tensor's part.
    const testing::NamedTensors final_part =
        testing::TensorPartOf(reference.parameters(), tensor, r % tensor);
    const testing::NamedTensors initial_part = testing::TensorPartOf(initial, tensor, r % tensor);
    const testing::TensorDifference d = testing::MaxRelativeDifference(trained, final_part);
    testing::NamedTensors update;
    testing::NamedTensors reference_update;
    for (const auto& [name, p] : trained) {
      update[name] = p - initial_part.at(name);
      reference_update[name] = final_part.at(name) - initial_part.at(name);
    }
    const testing::TensorDifference u = testing::MaxRelativeDifference(update, reference_update);
    std::printf("rank %d: %d tensors, parameters %.3g (%s), updates %.3g (%s)\n", r, d.compared,
                d.worst, d.worst_name.c_str(), u.worst, u.worst_name.c_str());
    EXPECT_LE(d.worst, 1e-5) << "rank " << r << ": " << d.worst_name;
    compared += d.compared;
  }
  // Each replica's ranks hold every parameter once per tensor index.
  EXPECT_EQ(compared, data * tensor * static_cast<int>(reference.parameters().size()));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ProcessEquivalence,
    ::testing::Values(
        EquivalenceCase{false, "ONE_F_ONE_B", "RECOMPUTE_NONE", "DYNAMIC_PROGRAMMING",
                        "Gpt_OneFOneB_RecomputeNone", 0},
        EquivalenceCase{false, "ONE_F_ONE_B", "RECOMPUTE_SELECTIVE", "DYNAMIC_PROGRAMMING",
                        "Gpt_OneFOneB_RecomputeSelective", 0},
        EquivalenceCase{false, "ADAPTIVE", "RECOMPUTE_FULL", "DYNAMIC_PROGRAMMING",
                        "Gpt_Adaptive_RecomputeFull", 0},
        EquivalenceCase{false, "ONE_F_ONE_B", "RECOMPUTE_NONE", "PACKING",
                        "GptPackedVarlen_OneFOneB_RecomputeNone", 0},
        EquivalenceCase{true, "ONE_F_ONE_B", "RECOMPUTE_SELECTIVE", "DYNAMIC_PROGRAMMING",
                        "T5_OneFOneB_RecomputeSelective", 0},
        EquivalenceCase{true, "ADAPTIVE", "RECOMPUTE_FULL", "DYNAMIC_PROGRAMMING",
                        "T5_Adaptive_RecomputeFull", 0},
        // ZeRO stage 1: the shards' steps give the same parameters.
        EquivalenceCase{false, "ONE_F_ONE_B", "RECOMPUTE_NONE", "DYNAMIC_PROGRAMMING",
                        "Gpt_OneFOneB_RecomputeNone_Zero1", 1},
        EquivalenceCase{true, "ONE_F_ONE_B", "RECOMPUTE_SELECTIVE", "DYNAMIC_PROGRAMMING",
                        "T5_OneFOneB_RecomputeSelective_Zero1", 1},
        // Split backwards (B and W), also with sharded optimizer
        // states (every W before the reduce-scatter).
        EquivalenceCase{false, "ZERO_BUBBLE_H1", "RECOMPUTE_NONE", "DYNAMIC_PROGRAMMING",
                        "Gpt_ZeroBubbleH1_RecomputeNone", 0},
        EquivalenceCase{true, "ADAPTIVE_ZERO_BUBBLE", "RECOMPUTE_SELECTIVE", "DYNAMIC_PROGRAMMING",
                        "T5_AdaptiveZeroBubble_RecomputeSelective", 0},
        EquivalenceCase{false, "ZERO_BUBBLE_H1", "RECOMPUTE_NONE", "DYNAMIC_PROGRAMMING",
                        "Gpt_ZeroBubbleH1_RecomputeNone_Zero1", 1},
        // Tensor parallelism: two tensor groups of two processes, the
        // pipeline's transfers between matching tensor ranks; with
        // sequence parallelism and split backwards.
        EquivalenceCase{false, "ONE_F_ONE_B", "RECOMPUTE_NONE", "DYNAMIC_PROGRAMMING",
                        "Gpt_OneFOneB_RecomputeNone_Tp2", 0, 2},
        EquivalenceCase{true, "ZERO_BUBBLE_H1", "RECOMPUTE_SELECTIVE", "DYNAMIC_PROGRAMMING",
                        "T5_ZeroBubbleH1_RecomputeSelective_Tp2Sp", 0, 2, true}),
    [](const auto& info) { return info.param.name; });

// training.init_from: four processes (pp = 2, dp = 2) start from the tiny
// Hugging Face Llama checkpoint of tests/data/hf (saved by transformers), each
// rank logging what it read, and three SGD steps (ZeRO stage 1) leave the
// parameters of the reference model started from the same weights (1e-5
// relative); the --export_hf directory the ranks write holds exactly the
// trained parameters, and both varipipe-export-hf (from the run's
// checkpoint) and an export of the same parameters at pp = 1 write the same
// files byte for byte.
// A Hugging Face model the four-process run starts from: the tiny Llama
// golden, or a FLAN-T5 that deploy/make-hf-t5.py writes (T5V11 at pp = 2:
// the decoder stage holds a replica of the shared embedding).
// The reference model started from a Hugging Face checkpoint's F32 tensors.
void LoadReferenceFromHuggingFace(const std::filesystem::path& checkpoint,
                                  const executor::ModelSpec& spec,
                                  testing::ReferenceModel& reference) {
  absl::StatusOr<HuggingFaceCheckpoint> hf = HuggingFaceCheckpoint::Open(checkpoint.string());
  ASSERT_THAT(hf, IsOk());
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : reference.parameters()) {
    absl::StatusOr<std::string> hf_name = executor::HuggingFaceName(spec, name);
    ASSERT_THAT(hf_name, IsOk());
    absl::StatusOr<HuggingFaceCheckpoint::Located> t = hf->Find(*hf_name);
    ASSERT_THAT(t, IsOk());
    ASSERT_EQ(t->tensor->dtype, "F32");
    torch::Tensor value = torch::empty(t->tensor->shape);
    ASSERT_THAT(t->file->Read(*t->tensor, value.data_ptr()), IsOk());
    ASSERT_EQ(value.sizes(), p.sizes()) << name;
    p.copy_(value);
  }
}

// kSgdIterations SGD steps of the reference over the samples of the plan
// files in `plans` (`plan_ranks` per iteration).
void StepReference(const std::filesystem::path& plans, int plan_ranks, const v1::JobConfig& config,
                   const SampleDataset& dataset, testing::ReferenceModel& reference) {
  for (int it = 0; it < kSgdIterations; ++it) {
    std::vector<v1::ExecutionPlan> iteration;
    for (int r = 0; r < plan_ranks; ++r) {
      absl::StatusOr<v1::ExecutionPlan> p = executor::ReadPlanFile(plans.string(), it, r);
      ASSERT_THAT(p, IsOk());
      iteration.push_back(*std::move(p));
    }
    const testing::ReferencePass pass =
        reference.Gradients(testing::IterationSamples(iteration), dataset);
    reference.SgdStep(pass.gradients, config.training().learning_rate());
  }
}

struct HuggingFaceRun {
  std::string name;
  std::string model;  // the job's model section
  std::string data;   // extra data fields
  bool t5 = false;
};

class ExecutorTrainingHf : public ::testing::TestWithParam<HuggingFaceRun> {};

TEST_P(ExecutorTrainingHf, HuggingFaceWeightsLoadAndTrainLikeTheReference) {
  const HuggingFaceRun& c = GetParam();
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("init-from-hf-" + c.name);
  std::filesystem::path checkpoint =
      std::filesystem::path(VARIPIPE_SOURCE_DIR) / "tests" / "data" / "hf" / "llama-tiny";
  if (c.t5) {
    checkpoint = dir / "flan-t5";
    const CommandResult made = RunCommand(absl::StrCat(
        "python3 '", VARIPIPE_SOURCE_DIR, "/deploy/make-hf-t5.py' --out '", checkpoint.string(),
        "' --layers 1 --decoder-layers 1 --hidden 32 --heads 4 --ffn 64 --vocab 96 --seed 4 "
        "--shards 2"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  std::ofstream(dir / "job.json") << absl::StrCat(
      R"({"job_id": "init-from-hf", "model": )", c.model, R"(,
      "parallelism": {"pipeline": 2, "data": 2},
      "cluster": {"device_memory_limit_mib": 8, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1200, )",
      c.data, R"(
               "max_sequence_length": 96, "seed": 11, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01},
      "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
      (*redis)->port(), R"("},
      "training": {"iterations": )",
      kSgdIterations, R"(, "optimizer": "SGD", "learning_rate": 0.05,
                   "min_learning_rate": 0.05, "gradient_clip_norm": 0,
                   "zero_stage": 1, "checkpoint_dir": "checkpoints", "checkpoint_interval": )",
      kSgdIterations, R"(, "init_from": ")", checkpoint.string(), R"("}})");
  const CommandResult plan = RunCommand(
      absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-plan"),
                   " --config job.json --iterations ", kSgdIterations, " --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const CommandResult run =
      LaunchRanks(dir, 4, (*redis)->password(),
                  "--config job.json --plans plans --run_id test --save_parameters params "
                  "--export_hf export");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              ::testing::HasSubstr("loaded this rank's weights from Hugging Face checkpoint"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("data-parallel ranks (training.zero_stage 1"));

  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile((dir / "job.json").string());
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  testing::ReferenceModel reference(*config);
  LoadReferenceFromHuggingFace(checkpoint, *spec, reference);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  StepReference(dir / "plans", 4, *config, **dataset, reference);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  int compared = 0;
  for (int r = 0; r < 4; ++r) {
    const testing::NamedTensors trained =
        testing::LoadParameters(dir / absl::StrFormat("params.rank_%05d.pt", r));
    const testing::TensorDifference d =
        testing::MaxRelativeDifference(trained, reference.parameters());
    std::printf("rank %d: %d tensors, parameters within %.3g (%s)\n", r, d.compared, d.worst,
                d.worst_name.c_str());
    EXPECT_LE(d.worst, 1e-5) << "rank " << r << ": " << d.worst_name;
    compared += d.compared;
  }
  // Each pipeline holds the model once, T5V11's shared embedding twice.
  EXPECT_EQ(compared, 2 * static_cast<int>(reference.parameters().size() + (c.t5 ? 1 : 0)));
  // The export the two pipeline ranks of replica 0 wrote in parallel holds
  // exactly the trained parameters.
  absl::StatusOr<HuggingFaceCheckpoint> exported =
      HuggingFaceCheckpoint::Open((dir / "export").string());
  ASSERT_THAT(exported, IsOk());
  ASSERT_THAT(executor::CheckHuggingFaceConfig(*exported, *spec), IsOk());
  // A replica holds its owner's values (the export is the owner's).
  std::set<std::string> exported_tensors;
  for (int r = 0; r < 2; ++r) {
    for (const auto& [key, trained] :
         testing::LoadParameters(dir / absl::StrFormat("params.rank_%05d.pt", r))) {
      absl::StatusOr<std::string> hf_name = executor::HuggingFaceName(*spec, key);
      ASSERT_THAT(hf_name, IsOk());
      absl::StatusOr<HuggingFaceCheckpoint::Located> t = exported->Find(*hf_name);
      ASSERT_THAT(t, IsOk());
      torch::Tensor value = torch::empty(t->tensor->shape);
      ASSERT_THAT(t->file->Read(*t->tensor, value.data_ptr()), IsOk());
      EXPECT_TRUE(torch::equal(value, trained)) << *hf_name;
      exported_tensors.insert(*hf_name);
    }
  }
  EXPECT_EQ(exported_tensors.size(), exported->TensorNames().size());
  // The same parameters in one pipeline stage, exported in this process:
  // the export of pp = 2, dp = 2 under ZeRO stage 1 byte for byte.
  {
    absl::StatusOr<std::vector<executor::StageRole>> roles = executor::PipelineStageRoles(*spec, 1);
    ASSERT_THAT(roles, IsOk());
    executor::ModelStage whole(*spec, roles->front());
    std::map<std::string, torch::Tensor> trained;
    for (int r = 0; r < 2; ++r) {
      trained.merge(testing::LoadParameters(dir / absl::StrFormat("params.rank_%05d.pt", r)));
    }
    torch::NoGradGuard no_grad;
    int copied = 0;
    for (auto& item : whole.named_parameters()) {
      ASSERT_TRUE(trained.count(item.key())) << item.key();
      item.value().copy_(trained.at(item.key()));
      ++copied;
    }
    EXPECT_EQ(copied, static_cast<int>(trained.size()));
    std::filesystem::create_directories(dir / "export-pp1");
    ASSERT_THAT(executor::ExportHuggingFaceShards((dir / "export-pp1").string(), *spec, {&whole},
                                                  v1::FLOAT32),
                IsOk());
    ASSERT_THAT(executor::ExportHuggingFaceIndex((dir / "export-pp1").string(), *spec, v1::FLOAT32,
                                                 config->training().init_from()),
                IsOk());
  }
  // varipipe-export-hf, one process, from the checkpoint after the last
  // iteration: the same files byte for byte.
  const CommandResult offline =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-export-hf"),
                              " --config job.json --out offline"));
  ASSERT_EQ(offline.exit_code, 0) << offline.output;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "export")) {
    for (const char* other : {"offline", "export-pp1"}) {
      EXPECT_EQ(ReadFile(entry.path()), ReadFile(dir / other / entry.path().filename()))
          << other << "/" << entry.path().filename().string();
    }
    ++files;
  }
  // config.json, the index, one shard per layer, and what the checkpoint
  // holds besides (tests/data/hf/llama-tiny: generation_config.json).
  EXPECT_EQ(files, c.t5 ? 4 : 5);
  // Started from `checkpoint`: its config.json with the export's dtype (its
  // positions, not the job's 96-token data limit; its special tokens).
  absl::StatusOr<std::string> carried =
      CarriedHuggingFaceConfig(ReadFile(checkpoint / "config.json"), "config.json", "float32");
  ASSERT_THAT(carried, IsOk());
  EXPECT_EQ(ReadFile(dir / "export" / "config.json"), *carried);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ExecutorTrainingHf,
    ::testing::Values(
        HuggingFaceRun{.name = "Llama",
                       .model = R"({"kind": "GPT", "architecture": "LLAMA", "num_layers": 2,
                           "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "ffn_hidden_size": 64, "vocab_size": 96, "norm_epsilon": 1e-5,
                           "rope_theta": 10000, "dtype": "FLOAT32"})",
                       .data = "",
                       .t5 = false},
        HuggingFaceRun{.name = "FlanT5",
                       .model = R"({"kind": "T5", "architecture": "T5V11", "num_layers": 1,
                           "num_decoder_layers": 1, "hidden_size": 32, "num_attention_heads": 4,
                           "ffn_hidden_size": 64, "vocab_size": 96, "dtype": "FLOAT32"})",
                       .data = R"("max_target_length": 48,)",
                       .t5 = true}),
    [](const auto& info) { return info.param.name; });

// Tensor parallelism with Hugging Face weights: four processes (pp = 2,
// tensor = 2, sequence parallel) start from the tiny Llama checkpoint, each
// tensor rank loading its part of every tensor, train three SGD steps like
// the reference started from the same weights (1e-5 relative, each rank on
// its part), and varipipe-export-hf gathers the tensor ranks' parts of the
// run's checkpoint back into whole tensors: exactly the ranks' trained
// parts put together.
TEST(ExecutorTrainingHfTensorParallel, TensorRanksLoadTheirPartsAndTheExportGathersThem) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("init-from-hf-tp");
  const std::filesystem::path checkpoint =
      std::filesystem::path(VARIPIPE_SOURCE_DIR) / "tests" / "data" / "hf" / "llama-tiny";
  std::ofstream(dir / "job.json") << absl::StrCat(
      R"({"job_id": "init-from-hf-tp", "model": {"kind": "GPT", "architecture": "LLAMA",
          "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "ffn_hidden_size": 64, "vocab_size": 96, "norm_epsilon": 1e-5, "rope_theta": 10000,
          "dtype": "FLOAT32"},
      "parallelism": {"pipeline": 2, "data": 1, "tensor": 2, "sequence_parallel": true},
      "cluster": {"device_memory_limit_mib": 8, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1200,
               "max_sequence_length": 96, "seed": 11, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01},
      "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
      (*redis)->port(), R"("},
      "training": {"iterations": )",
      kSgdIterations, R"(, "optimizer": "SGD", "learning_rate": 0.05,
                   "min_learning_rate": 0.05, "gradient_clip_norm": 0,
                   "checkpoint_dir": "checkpoints", "checkpoint_interval": )",
      kSgdIterations, R"(, "init_from": ")", checkpoint.string(), R"("}})");
  const CommandResult plan = RunCommand(
      absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-plan"),
                   " --config job.json --iterations ", kSgdIterations, " --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const CommandResult run =
      LaunchRanks(dir, 4, (*redis)->password(),
                  "--config job.json --plans plans --run_id test --save_parameters params");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              ::testing::HasSubstr("loaded this rank's weights from Hugging Face checkpoint"));

  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile((dir / "job.json").string());
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  ASSERT_THAT(spec, IsOk());
  testing::ReferenceModel reference(*config);
  LoadReferenceFromHuggingFace(checkpoint, *spec, reference);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  StepReference(dir / "plans", /*plan_ranks=*/2, *config, **dataset, reference);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<testing::NamedTensors> trained(4);
  for (int r = 0; r < 4; ++r) {
    trained[r] = testing::LoadParameters(dir / absl::StrFormat("params.rank_%05d.pt", r));
    const testing::TensorDifference d = testing::MaxRelativeDifference(
        trained[r], testing::TensorPartOf(reference.parameters(), 2, r % 2));
    std::printf("rank %d: %d tensors, parameters within %.3g (%s)\n", r, d.compared, d.worst,
                d.worst_name.c_str());
    EXPECT_LE(d.worst, 1e-5) << "rank " << r << ": " << d.worst_name;
  }
  const CommandResult offline =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-export-hf"),
                              " --config job.json --out offline 2>&1"));
  ASSERT_EQ(offline.exit_code, 0) << offline.output;
  EXPECT_THAT(offline.output, ::testing::HasSubstr("gathered from 2 tensor ranks"));
  absl::StatusOr<HuggingFaceCheckpoint> exported =
      HuggingFaceCheckpoint::Open((dir / "offline").string());
  ASSERT_THAT(exported, IsOk());
  int checked = 0;
  for (const auto& [name, p] : reference.parameters()) {
    // Pipeline rank name's stage: ranks 0, 1 (stage 0) or 2, 3 (stage 1).
    const int first = trained[0].count(name) > 0 ? 0 : 2;
    ASSERT_TRUE(trained[first].count(name) > 0) << name;
    const torch::Tensor gathered = executor::UnshardOf(
        {trained[first].at(name), trained[first + 1].at(name)}, executor::ShardOfParameter(name));
    absl::StatusOr<std::string> hf_name = executor::HuggingFaceName(*spec, name);
    ASSERT_THAT(hf_name, IsOk());
    absl::StatusOr<HuggingFaceCheckpoint::Located> t = exported->Find(*hf_name);
    ASSERT_THAT(t, IsOk());
    torch::Tensor value = torch::empty(t->tensor->shape);
    ASSERT_THAT(t->file->Read(*t->tensor, value.data_ptr()), IsOk());
    EXPECT_TRUE(torch::equal(value, gathered)) << *hf_name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(exported->TensorNames().size()));
  std::filesystem::remove_all(dir);
}

TEST(ExecutorTraining, FourPipelineRanksTrainTenIterations) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("train");
  // Arithmetic sequences of mixed lengths: token k = (start + step * k) % 60 + 1.
  {
    std::mt19937 rng(5);
    std::ofstream data(dir / "data.jsonl");
    std::ofstream lengths(dir / "lengths.csv");
    for (int i = 0; i < 2000; ++i) {
      const int bucket = static_cast<int>(rng() % 3);
      const int n = bucket == 0   ? 4 + static_cast<int>(rng() % 13)
                    : bucket == 1 ? 16 + static_cast<int>(rng() % 33)
                                  : 48 + static_cast<int>(rng() % 43);
      const int start = static_cast<int>(rng() % 60);
      const int step = 1 + static_cast<int>(rng() % 3);
      std::vector<int> tokens;
      for (int k = 0; k < n; ++k) tokens.push_back((start + step * k) % 60 + 1);
      data << "{\"input\": [" << absl::StrJoin(tokens, ", ") << "]}\n";
      lengths << n << ",0\n";
    }
  }
  std::ofstream(dir / "job.json") << absl::StrCat(R"({
    "job_id": "train-test",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "ffn_hidden_size": 128, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": 4, "data": 1},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "jsonl", "path": "data.jsonl", "tokens_per_global_batch": 2048,
             "max_sequence_length": 96, "seed": 3},
    "planner": {"schedules": ["adaptive", "one_f_one_b"], "tmax_interval_ms": 0.01},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
                                                  (*redis)->port(), R"("},
    "training": {"iterations": 10, "learning_rate": 0.003, "warmup_iterations": 2,
                 "watchdog_timeout_s": 60}
  })");
  const std::string cd = absl::StrCat("cd '", dir.string(), "' && ");
  const CommandResult plan =
      RunCommand(cd + Bin("varipipe-plan") +
                 " --config job.json --lengths lengths.csv --iterations 10 --emit-plans plans");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;

  // The password comes from the environment the config names.
  const CommandResult run =
      LaunchRanks(dir, 4, (*redis)->password(),
                  "--config job.json --plans plans --run_id test --metrics_jsonl metrics.jsonl");
  const std::string& logs = run.output;
  ASSERT_EQ(run.exit_code, 0) << logs;

  std::vector<double> losses;
  std::ifstream metrics(dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    google::protobuf::Struct record;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &record).ok()) << line;
    losses.push_back(record.fields().at("loss").number_value());
    EXPECT_GT(record.fields().at("padding_efficiency").number_value(), 0.5) << line;
    EXPECT_GT(record.fields().at("instructions").number_value(), 10) << line;
  }
  ASSERT_EQ(losses.size(), 10u) << logs;
  std::printf("losses: %s\n", absl::StrJoin(losses, " ").c_str());
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.5);  // near-uniform at the start
  EXPECT_LT(losses.back(), 0.9 * losses.front()) << logs;
  EXPECT_THAT(ReadFile(dir / "rank0.log"), ::testing::HasSubstr("iteration 9: loss"));
  std::filesystem::remove_all(dir);
}

// The service path: a planner daemon process plans into Redis; four
// executors (pp=2, dp=2) get the job's config and every plan over gRPC,
// train five iterations and acknowledge each plan, after which no plan is
// left in Redis. Either an external redis-server (executors read the
// password from the configured environment variable) or the daemon's
// embedded one (executors read the daemon's --store_file).
// The last case runs two tensor groups of two (pp = 2, tensor = 2): each
// plan is served to both tensor ranks of its pipeline rank, and retired once
// all four ranks acknowledged it.
struct ServiceCase {
  bool embedded = false;
  uint32_t tensor = 1;
};
class ServicePath : public ::testing::TestWithParam<ServiceCase> {};

TEST_P(ServicePath, ExecutorsTrainFromThePlannerService) {
  const bool embedded = GetParam().embedded;
  const uint32_t tensor = GetParam().tensor;
  std::unique_ptr<RedisServer> external;
  if (!embedded) {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    external = *std::move(redis);
  }
  const std::filesystem::path dir = FreshDirectory(
      absl::StrCat(embedded ? "service-embedded" : "service", tensor > 1 ? "-tp" : ""));
  const std::string store = embedded
                                ? "{}"
                                : absl::StrCat(R"({"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
                                  "redis_address": "127.0.0.1:)",
                                               external->port(), R"("})");
  std::ofstream(dir / "job.json") << absl::StrCat(R"({
    "job_id": "service-test",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "ffn_hidden_size": 64, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": 2, "data": )",
                                                  2 / tensor, R"(, "tensor": )", tensor, R"(},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "synthetic", "tokens_per_global_batch": 2048,
             "max_sequence_length": 96, "seed": 3, "synthetic_num_samples": 5000},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1},
    "store": )",
                                                  store, R"(,
    "training": {"iterations": 5, "learning_rate": 0.003, "watchdog_timeout_s": 60}
  })");
  const std::string cd =
      absl::StrCat("cd '", dir.string(), "' && export VARIPIPE_TEST_REDIS_PASSWORD='",
                   embedded ? "" : external->password(), "' && ");
  // The daemon runs in the background until killed: --keep_serving keeps
  // it (and an embedded Redis) up after the job is complete.
  ASSERT_EQ(RunCommand(cd + "(timeout 300 " + Bin("varipipe-planner") +
                       " --config job.json --listen 127.0.0.1:0 --port_file port"
                       " --store_file store --keep_serving > planner.log 2>&1 &"
                       " echo $! > planner.pid)")
                .exit_code,
            0);
  std::string port;
  // Up to 2 minutes on a loaded machine.
  for (int i = 0; i < 2400 && (port.empty() || ReadFile(dir / "store").empty()); ++i) {
    port = ReadFile(dir / "port");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(port.empty()) << ReadFile(dir / "planner.log");
  while (!port.empty() && (port.back() == '\n' || port.back() == ' ')) port.pop_back();
  const CommandResult run =
      LaunchRanks(dir, 4, embedded ? "" : external->password(),
                  absl::StrCat("--planner 127.0.0.1:", port,
                               // The job token: beside the store file (embedded), or the
                               // daemon's token file named explicitly.
                               embedded ? " --store_file store" : " --token_file store.token",
                               " --run_id service"));
  const std::string& logs = run.output;
  // Every plan was acknowledged: none is left in the store (read while the
  // daemon, and so an embedded Redis, still runs).
  std::istringstream store_file(ReadFile(dir / "store"));
  std::string address;
  std::string password;
  store_file >> address >> password;
  ASSERT_NE(address.find(':'), std::string::npos) << "store file: " << ReadFile(dir / "store");
  absl::StatusOr<std::unique_ptr<RedisClient>> client =
      RedisClient::Connect({.host = "127.0.0.1",
                            .port = std::stoi(address.substr(address.rfind(':') + 1)),
                            .password = password});
  absl::StatusOr<RedisReply> keys = absl::UnavailableError("no client");
  if (client.ok()) keys = (*client)->Command({"KEYS", "varipipe:service-test:plan:*"});
  RunCommand(cd + "kill $(cat planner.pid)");
  ASSERT_EQ(run.exit_code, 0) << logs << ReadFile(dir / "planner.log");
  EXPECT_THAT(ReadFile(dir / "rank0.log"),
              ::testing::AllOf(::testing::HasSubstr("plans from planner service at 127.0.0.1:"),
                               ::testing::HasSubstr("iteration 4: loss")));
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT(keys, IsOk());
  EXPECT_EQ(keys->size(), 0u) << "plans left in Redis";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(ExternalAndEmbeddedRedis, ServicePath,
                         ::testing::Values(ServiceCase{false, 1}, ServiceCase{true, 1},
                                           ServiceCase{false, 2}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.embedded ? "Embedded" : "External",
                                               info.param.tensor > 1 ? "Tp2" : "");
                         });

// A corrupted plan file: the executor that reads it exits with status 1 (not
// a signal, not an abort) and a message naming the iteration, rank and field;
// nothing is allocated from the bad number first.
struct CorruptPlanCase {
  std::string name;
  std::function<void(v1::ExecutionPlan&)> corrupt;
  std::string field;  // the message names it
};

class CorruptPlan : public ::testing::TestWithParam<CorruptPlanCase> {};

TEST_P(CorruptPlan, TheExecutorExitsWithAnErrorNamingTheField) {
  const CorruptPlanCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("corrupt-" + c.name);
  std::ofstream(dir / "job.json") << absl::StrCat(R"({"job_id": "corrupt",
      "model": {"kind": "GPT", "num_layers": 2, "hidden_size": 16, "num_attention_heads": 2,
                "ffn_hidden_size": 32, "vocab_size": 61, "dtype": "FLOAT32"},
      "parallelism": {"pipeline": 1, "data": 1},
      "cluster": {"device_memory_limit_mib": 64, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 600,
               "max_sequence_length": 64, "seed": 3, "synthetic_num_samples": 2000},
      "planner": {"tmax_interval_ms": 0.01},
      "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
                                                  (*redis)->port(), R"("},
      "training": {"iterations": 1, "watchdog_timeout_s": 60}})");
  const CommandResult plan =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-plan"),
                              " --config job.json --iterations 1 --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  // The plan of iteration 0 (one rank), corrupted and written back.
  absl::StatusOr<v1::ExecutionPlan> read = executor::ReadPlanFile((dir / "plans").string(), 0, 0);
  ASSERT_THAT(read, IsOk());
  v1::ExecutionPlan corrupted = *read;
  c.corrupt(corrupted);
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(corrupted, &json).ok());
  std::ofstream(executor::PlanFilePath((dir / "plans").string(), 0, 0), std::ios::trunc) << json;

  const CommandResult run =
      LaunchRanks(dir, 1, (*redis)->password(), "--config job.json --plans plans --run_id corrupt");
  EXPECT_NE(run.exit_code, 0) << run.output;
  const std::optional<int> exit = ::varipipe::testing::RankExit(dir, 0);
  ASSERT_TRUE(exit.has_value()) << run.output;
  EXPECT_GT(*exit, 0) << run.output;
  EXPECT_LT(*exit, 128) << "killed by a signal or aborted:\n" << run.output;
  EXPECT_THAT(ReadFile(dir / "rank0.log"),
              ::testing::AllOf(::testing::HasSubstr("plan of iteration 0 for rank 0"),
                               ::testing::HasSubstr(c.field)))
      << run.output;
}

v1::Instruction& FirstInstruction(v1::ExecutionPlan& plan, v1::Instruction::OpCase kind) {
  for (v1::Instruction& in : *plan.mutable_instructions()) {
    if (in.op_case() == kind) return in;
  }
  ADD_FAILURE() << "no instruction of kind " << static_cast<int>(kind);
  return *plan.mutable_instructions(0);
}

INSTANTIATE_TEST_SUITE_P(
    Executor, CorruptPlan,
    ::testing::Values(CorruptPlanCase{"HugeBufferCount",
                                      [](v1::ExecutionPlan& p) { p.set_num_buffers(4294967295u); },
                                      "num_buffers"},
                      CorruptPlanCase{"ShapeBeyondTheConfig",
                                      [](v1::ExecutionPlan& p) {
                                        FirstInstruction(p, v1::Instruction::kLoadInput)
                                            .mutable_load_input()
                                            ->mutable_tensors(0)
                                            ->set_dims(1, 1 << 30);
                                      },
                                      "load_input.tensors[0].dims[1]"},
                      CorruptPlanCase{"MismatchedBufferIdsAndTensors",
                                      [](v1::ExecutionPlan& p) {
                                        FirstInstruction(p, v1::Instruction::kLoadInput)
                                            .mutable_load_input()
                                            ->clear_tensors();
                                      },
                                      "load_input.tensors has 0 entries"},
                      CorruptPlanCase{"EmptyContents",
                                      [](v1::ExecutionPlan& p) {
                                        FirstInstruction(p, v1::Instruction::kLoadInput)
                                            .mutable_load_input()
                                            ->clear_contents();
                                      },
                                      "load_input.contents"},
                      CorruptPlanCase{"UnknownBufferId",
                                      [](v1::ExecutionPlan& p) {
                                        FirstInstruction(p, v1::Instruction::kForward)
                                            .mutable_forward()
                                            ->set_input_buffer_ids(0, p.num_buffers() + 3);
                                      },
                                      "forward.input_buffer_ids[0]"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace varipipe
