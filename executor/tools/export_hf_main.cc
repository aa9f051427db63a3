// varipipe-export-hf: a Varipipe training checkpoint (training.checkpoint_dir,
// any pipeline depth, data-parallel degree and ZeRO stage) as a Hugging Face
// checkpoint directory, in one process, stage by stage (one stage's
// parameters in memory at a time). The files equal those the executors'
// --export_hf writes for the same weights (executor/model/hf_export.h).
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/status.h"
#include "executor/model/hf_export.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/model/tensor_group.h"
#include "executor/model/tensor_shard.h"
#include "executor/runtime/checkpoint.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "The job's config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "The job's checkpoints. Default: the config's training.checkpoint_dir.");
ABSL_FLAG(int64_t, iteration, -1,
          "Export the checkpoint taken after this many iterations. Default: the newest one "
          "that every pipeline rank of data-parallel replica 0 holds.");
ABSL_FLAG(std::string, out, "", "The Hugging Face directory to write (created). Required.");
ABSL_FLAG(std::string, dtype, "",
          "FLOAT32, BFLOAT16 or FLOAT16 for the exported weights. Default: model.dtype.");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "Exports a Varipipe training checkpoint as a Hugging Face checkpoint directory\n"
    "(config.json, model.safetensors.index.json, one safetensors shard per layer), which\n"
    "transformers' LlamaForCausalLM or T5ForConditionalGeneration .from_pretrained reads.\n"
    "LLAMA and T5V11 (T5 v1.1 / FLAN-T5) models only. A job started from a Hugging Face\n"
    "checkpoint (training.init_from) exports that checkpoint's config.json (with the\n"
    "export's torch_dtype) and copies its generation and tokenizer files.\n"
    "\n"
    "Usage: varipipe-export-hf --config job.json --out DIR [--checkpoint_dir DIR]\n"
    "                          [--iteration N] [--dtype BFLOAT16]\n"
    "\n"
    "Data-parallel replica 0's rank files hold every parameter (ZeRO stage 1 shards only\n"
    "the optimizer state), so any data-parallel degree and ZeRO stage export alike. Under\n"
    "tensor parallelism each stage's tensor ranks' parts are gathered back into whole\n"
    "tensors.";

// --dtype, else the model's dtype, else FLOAT32.
absl::StatusOr<v1::DType> ExportDtype(const v1::JobConfig& config) {
  v1::DType dtype = config.model().dtype();
  if (const std::string d = absl::GetFlag(FLAGS_dtype); !d.empty()) {
    if (!v1::DType_Parse(d, &dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("--dtype ", d, ": not a dtype"));
    }
  }
  if (dtype == v1::DTYPE_UNSPECIFIED) dtype = v1::FLOAT32;
  return dtype;
}

// --iteration, else the newest checkpoint that every rank of replica 0
// (global ranks 0 .. pp * tensor - 1: its pipeline ranks' tensor ranks)
// holds in `dir` (which `field` names).
absl::StatusOr<uint64_t> IterationToExport(const std::string& dir, const std::string& field,
                                           uint32_t ranks) {
  if (absl::GetFlag(FLAGS_iteration) >= 0)
    return static_cast<uint64_t>(absl::GetFlag(FLAGS_iteration));
  std::optional<uint64_t> iteration;
  std::map<uint64_t, uint32_t> holders;
  for (uint32_t r = 0; r < ranks; ++r) {
    for (uint64_t it : executor::RankCheckpoints(dir, static_cast<int>(r)).List()) ++holders[it];
  }
  for (const auto& [it, count] : holders) {
    if (count == ranks) iteration = it;
  }
  if (!iteration.has_value()) {
    return absl::NotFoundError(absl::StrCat(field, ": ", dir, ": no checkpoint that all ", ranks,
                                            " ranks of replica 0 hold"));
  }
  return *iteration;
}

// Stage `role` of the checkpoint after `iteration`, whole: from pipeline rank
// `pipeline_rank`'s file, or under tensor parallelism from the files of its
// tensor ranks (global ranks pipeline_rank * t + i), each holding part i of
// every sharded parameter, put back together (tensor_shard.h) into `stage`,
// a stage of the model without tensor parallelism.
absl::Status LoadWholeStage(const std::string& dir, uint64_t iteration,
                            const executor::ModelSpec& spec, const executor::StageRole& role,
                            const LayerLayout& layout, int pipeline_rank,
                            executor::ModelStage& stage) {
  const int t = static_cast<int>(spec.tensor_parallel);
  if (t == 1) {
    return executor::RankCheckpoints(dir, pipeline_rank, layout)
        .LoadParameters(iteration, {&stage});
  }
  std::vector<std::unique_ptr<executor::ModelStage>> parts;
  for (int i = 0; i < t; ++i) {
    const int rank = pipeline_rank * t + i;
    parts.push_back(std::make_unique<executor::ModelStage>(
        spec, role, std::make_shared<executor::TensorGroup>(rank, t, spec.sequence_parallel)));
    VP_RETURN_IF_ERROR(executor::RankCheckpoints(dir, rank, layout)
                           .LoadParameters(iteration, {parts.back().get()}));
  }
  torch::NoGradGuard no_grad;
  for (auto& item : stage.named_parameters()) {
    std::vector<torch::Tensor> pieces;
    for (const auto& part : parts) pieces.push_back(part->named_parameters()[item.key()]);
    item.value().copy_(executor::UnshardOf(pieces, executor::ShardOfParameter(item.key())));
  }
  return absl::OkStatus();
}

absl::Status Export() {
  if (absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("--config is required (try --help)");
  }
  if (absl::GetFlag(FLAGS_out).empty()) {
    return absl::InvalidArgumentError("--out is required (try --help)");
  }
  VP_ASSIGN_OR_RETURN(const v1::JobConfig config, LoadJobConfigFile(absl::GetFlag(FLAGS_config)));
  VP_ASSIGN_OR_RETURN(executor::ModelSpec spec, executor::ModelSpecFromConfig(config));
  if (!spec.llama && !spec.t5v11) {
    return absl::InvalidArgumentError(
        "only model.architecture LLAMA and T5V11 have a Hugging Face layout to export to");
  }
  const bool from_flag = !absl::GetFlag(FLAGS_checkpoint_dir).empty();
  const std::string dir =
      from_flag ? absl::GetFlag(FLAGS_checkpoint_dir) : config.training().checkpoint_dir();
  const std::string dir_field = from_flag ? "--checkpoint_dir" : "training.checkpoint_dir";
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "no checkpoints: the config has no training.checkpoint_dir and --checkpoint_dir is unset");
  }
  VP_ASSIGN_OR_RETURN(const v1::DType dtype, ExportDtype(config));
  const uint32_t pp = config.parallelism().pipeline();
  const uint32_t stages = pp * std::max<uint32_t>(1, config.parallelism().virtual_chunks());
  VP_ASSIGN_OR_RETURN(
      const uint64_t exported,
      IterationToExport(dir, dir_field, pp * static_cast<uint32_t>(spec.tensor_parallel)));
  const std::optional<uint64_t> iteration = exported;
  // The stage layout: the config's, checked against each file; an AUTO
  // job's as its checkpoint records it.
  if (spec.layout_auto) {
    VP_ASSIGN_OR_RETURN(const std::optional<LayerLayout> recorded,
                        executor::RankCheckpoints(dir, 0).RecordedLayout(*iteration));
    if (!recorded.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": the checkpoint after ", *iteration,
          " iterations records no stage layout, and parallelism.stage_layout is AUTO"));
    }
    spec.layers = *recorded;
  }
  VP_ASSIGN_OR_RETURN(const LayerLayout layout, executor::StageLayoutOf(spec, stages));
  VP_ASSIGN_OR_RETURN(const std::vector<executor::StageRole> roles,
                      executor::PipelineStageRoles(spec, stages));
  const std::string out = absl::GetFlag(FLAGS_out);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(out, ": cannot create: ", ec.message()));
  spdlog::info(
      "exporting the checkpoint after {} iterations in {} ({} stages, layout {}) to {} as {}",
      *iteration, dir, stages, layout.ToString(), out, v1::DType_Name(dtype));
  // Stage by stage (stage s lives on pipeline rank s % pp), so only one
  // stage's parameters are in memory at a time; under tensor parallelism its
  // tensor ranks' parts are gathered into the whole stage first.
  executor::ModelSpec whole = spec;
  whole.tensor_parallel = 1;
  whole.sequence_parallel = false;
  for (uint32_t s = 0; s < stages; ++s) {
    const int rank = static_cast<int>(s % pp);
    executor::ModelStage stage(whole, roles[s]);
    VP_RETURN_IF_ERROR(LoadWholeStage(dir, *iteration, spec, roles[s], layout, rank, stage));
    VP_RETURN_IF_ERROR(executor::ExportHuggingFaceShards(out, whole, {&stage}, dtype));
    spdlog::info("stage {} (pipeline rank {}{}): {}", s, rank,
                 spec.tensor_parallel > 1
                     ? absl::StrCat(", gathered from ", spec.tensor_parallel, " tensor ranks")
                     : "",
                 roles[s].DebugString());
  }
  // A job started from a Hugging Face checkpoint: its config.json and
  // tokenizer, so that the export replaces it.
  VP_RETURN_IF_ERROR(
      executor::ExportHuggingFaceIndex(out, whole, dtype, config.training().init_from()));
  spdlog::info("wrote {}", out);
  return absl::OkStatus();
}

}  // namespace
}  // namespace varipipe

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-export-hf", varipipe::kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-export-hf: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  const absl::Status status = varipipe::Export();
  if (!status.ok()) {
    std::fprintf(stderr, "varipipe-export-hf: %s\n", std::string(status.message()).c_str());
    return absl::IsInvalidArgument(status) ? varipipe::kExitUsage : varipipe::kExitFailure;
  }
  return varipipe::kExitOk;
}
