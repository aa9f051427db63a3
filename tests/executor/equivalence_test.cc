// Independent equivalence: the planner's plans, run by the executor's ranks
// (threads, Gloo over loopback TCP, rendezvous through a real redis-server),
// against the plain reference model of tests/testing/reference_model.h (the
// whole model, one sample at a time, written separately from executor/model).
//
// Each cell of the matrix {GPT, T5} x {GPipe, 1F1B, interleaved 1F1B (GPT),
// kFkB, adaptive} x {none, selective, full recomputation} x (pp, dp) in
// {(1,1), (2,1), (2,2), (4,1)}, plus packed micro-batches ("PackedVarlen":
// attention per sample, the variable-length kernel of attention_mask.h;
// "PackedMask": the dense block-diagonal mask), runs three
// iterations with plain SGD (constant learning rate, no clipping, so the
// update is the gradient times the learning rate and a wrong gradient scale
// shows) and checks, every iteration:
// - the loss normaliser (the plan's global_target_tokens) equals the
//   reference's count of loss tokens;
// - the loss (summed over the replicas' last stages) and the global gradient
//   norm within 1e-5 relative;
// - every parameter's gradient after the data-parallel reduction, before the
//   optimizer, within 1e-5 relative (max |difference| / max |reference|);
// and, after the three steps, every parameter within 1e-5 relative.
//
// The zero-bubble schedules (ZB-H1, adaptive zero-bubble; GPT and T5, every
// recomputation, pp 2 and 4, and dp 2) split backwards into B and W: their
// cells also run the same plans with every backward whole and require every
// gradient of every iteration to match the split run within 1e-6.
//
// LLAMA cells (docs/models.md; grouped-query attention, Llama 3.1 rotary
// scaling) cover every schedule family, each recompute mode, the four
// shapes, split backwards, packed rows and a tied head, against the
// reference's own LLAMA path; T5V11 cells (relative position bias, shared
// embedding and bias tables replicated across stages) the same against its
// T5V11 path. "LabelledHead" cells run the head (on the labelled positions
// only, chunked_loss_head.h) over chunks of a few tokens, smaller than a
// micro-batch: packed rows of GPT, LLAMA, T5 and T5V11, tied heads, split
// backwards, and tensor parallelism 2. "Layout" cells run uneven stage layouts
// (parallelism.stage_layout): GPT 3+1 and 1+3, interleaved, split-backward,
// packed; T5 with its encoder over three stages and its decoder over one,
// and the reverse; a tied LLAMA head and T5V11 across uneven stages.
// "MixedRecompute" cells give the micro-batches of the planner's plans
// different recompute modes (MicroBatch.recompute, cycling full, selective,
// none by micro-batch id, shifted by the data-parallel replica; the same on
// every rank of a pipeline): GPT under 1F1B and ZB-H1, LLAMA, T5 and T5V11
// at pp 2, and GPT at dp 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/status.h"
#include "executor/model/model_spec.h"
#include "executor/model/model_stage.h"
#include "executor/runtime/counting_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/split_backward.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/threaded_ranks.h"
#include "tests/testing/tiny_job.h"

namespace varipipe::testing {
namespace {

constexpr int kIterations = 3;
constexpr double kTolerance = 1e-5;
// Split backwards against whole ones (the same computation but for the
// order of the weight-gradient sums).
constexpr double kSplitTolerance = 1e-6;

struct Cell {
  bool t5 = false;
  bool llama = false;
  bool tied = false;  // LLAMA: tie_word_embeddings
  bool t5v11 = false;  // with t5: architecture T5V11
  v1::ScheduleKind schedule = v1::ONE_F_ONE_B;
  v1::RecomputeMode recompute = v1::RECOMPUTE_NONE;
  uint32_t pp = 1;
  uint32_t dp = 1;
  uint32_t chunks = 1;
  v1::PartitionMethod method = v1::DYNAMIC_PROGRAMMING;
  // An uneven stage layout (TinyJob::stage_layers); empty: the even split.
  std::vector<uint32_t> layout;
  uint32_t encoder_stages = 0;
  // PACKING cells: the packed rows' attention kernel.
  v1::PackedAttention packed_attention = v1::PER_SAMPLE;
  uint32_t tp = 1;  // parallelism.tensor
  bool sp = false;  // parallelism.sequence_parallel
  uint32_t zero_stage = 0;  // training.zero_stage
  // "LabelledHead" cells: the head's token chunk (ModelStage::
  // set_loss_chunk_tokens), smaller than a micro-batch's labelled tokens;
  // 0: the default (one chunk at these sizes).
  int64_t loss_chunk = 0;
  // "MixedRecompute" cells: the plans' micro-batches get their own modes
  // (MixRecompute); `recompute` stays the plans' mode.
  bool mixed_recompute = false;
};

std::string ScheduleName(const Cell& c) {
  switch (c.schedule) {
    case v1::GPIPE:
      return "GPipe";
    case v1::ONE_F_ONE_B:
      return "OneFOneB";
    case v1::INTERLEAVED_1F1B:
      return absl::StrCat("Interleaved", c.chunks);
    case v1::KFKB:
      return "Kfkb";
    case v1::ADAPTIVE:
      return "Adaptive";
    case v1::ZERO_BUBBLE_H1:
      return "ZeroBubbleH1";
    case v1::ADAPTIVE_ZERO_BUBBLE:
      return "AdaptiveZeroBubble";
    default:
      return v1::ScheduleKind_Name(c.schedule);
  }
}

std::string RecomputeName(v1::RecomputeMode mode) {
  switch (mode) {
    case v1::RECOMPUTE_NONE:
      return "RecomputeNone";
    case v1::RECOMPUTE_SELECTIVE:
      return "RecomputeSelective";
    case v1::RECOMPUTE_FULL:
      return "RecomputeFull";
    default:
      return v1::RecomputeMode_Name(mode);
  }
}

std::string CellName(const Cell& c) {
  return absl::StrCat(c.t5v11   ? "T5v11"
                      : c.t5    ? "T5"
                      : c.llama ? "Llama"
                                : "Gpt",
                      c.tied ? "Tied" : "",
                      c.loss_chunk > 0 ? absl::StrCat("LabelledHead", c.loss_chunk) : "",
                      c.method != v1::PACKING                         ? ""
                      : c.packed_attention == v1::BLOCK_DIAGONAL_MASK ? "PackedMask"
                                                                      : "PackedVarlen",
                      c.layout.empty() ? "" : absl::StrCat("Layout", absl::StrJoin(c.layout, "")),
                      "_", ScheduleName(c), "_",
                      c.mixed_recompute ? "MixedRecompute" : RecomputeName(c.recompute), "_pp",
                      c.pp, "dp",
                      c.dp, c.tp > 1 ? absl::StrCat("Tp", c.tp) : "", c.sp ? "Sp" : "",
                      c.zero_stage > 0 ? absl::StrCat("Zero", c.zero_stage) : "");
}

std::vector<Cell> Matrix() {
  std::vector<Cell> cells;
  const std::pair<uint32_t, uint32_t> shapes[] = {{1, 1}, {2, 1}, {2, 2}, {4, 1}};
  for (bool t5 : {false, true}) {
    for (v1::ScheduleKind schedule :
         {v1::GPIPE, v1::ONE_F_ONE_B, v1::INTERLEAVED_1F1B, v1::KFKB, v1::ADAPTIVE}) {
      if (t5 && schedule == v1::INTERLEAVED_1F1B) continue;  // GPT only
      for (v1::RecomputeMode recompute :
           {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
        for (const auto& [pp, dp] : shapes) {
          Cell c;
          c.t5 = t5;
          c.schedule = schedule;
          c.recompute = recompute;
          c.pp = pp;
          c.dp = dp;
          c.chunks = schedule == v1::INTERLEAVED_1F1B ? 2 : 1;
          cells.push_back(c);
        }
      }
    }
  }
  // Split backwards: the zero-bubble schedules.
  for (bool t5 : {false, true}) {
    for (v1::ScheduleKind schedule : {v1::ZERO_BUBBLE_H1, v1::ADAPTIVE_ZERO_BUBBLE}) {
      for (v1::RecomputeMode recompute :
           {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
        for (const auto& [pp, dp] : {std::pair<uint32_t, uint32_t>{2, 1}, {4, 1}, {2, 2}}) {
          if (dp > 1 && recompute != v1::RECOMPUTE_NONE) continue;
          Cell c;
          c.t5 = t5;
          c.schedule = schedule;
          c.recompute = recompute;
          c.pp = pp;
          c.dp = dp;
          cells.push_back(c);
        }
      }
    }
  }
  // Three virtual chunks per device, and packed micro-batches.
  Cell interleaved3;
  interleaved3.schedule = v1::INTERLEAVED_1F1B;
  interleaved3.chunks = 3;
  interleaved3.pp = 2;
  cells.push_back(interleaved3);
  for (bool t5 : {false, true}) {
    for (const auto& [pp, dp] : {std::pair<uint32_t, uint32_t>{1, 1}, {2, 2}}) {
      Cell packed;
      packed.t5 = t5;
      packed.method = v1::PACKING;
      packed.pp = pp;
      packed.dp = dp;
      cells.push_back(packed);
    }
  }
  // The dense block-diagonal mask, the kernel a plan may choose instead.
  for (bool t5 : {false, true}) {
    Cell mask;
    mask.t5 = t5;
    mask.method = v1::PACKING;
    mask.packed_attention = v1::BLOCK_DIAGONAL_MASK;
    mask.pp = 2;
    cells.push_back(mask);
  }
  // LLAMA (docs/models.md): every schedule family, each recompute mode, the
  // four shapes, split backwards, packed rows (rotary positions restart per
  // sample) and a tied head.
  // A cell of the model `base` describes (LLAMA or T5V11).
  const auto add = [&cells](Cell c, v1::ScheduleKind schedule, v1::RecomputeMode recompute,
                            uint32_t pp, uint32_t dp) -> Cell& {
    c.schedule = schedule;
    c.recompute = recompute;
    c.pp = pp;
    c.dp = dp;
    c.chunks = schedule == v1::INTERLEAVED_1F1B ? 2 : 1;
    return cells.emplace_back(c);
  };
  const auto llama = [&add](v1::ScheduleKind schedule, v1::RecomputeMode recompute, uint32_t pp,
                            uint32_t dp) -> Cell& {
    return add(Cell{.llama = true}, schedule, recompute, pp, dp);
  };
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1);
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, 2, 2);
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_FULL, 4, 1);
  llama(v1::GPIPE, v1::RECOMPUTE_FULL, 2, 1);
  llama(v1::KFKB, v1::RECOMPUTE_SELECTIVE, 4, 1);
  llama(v1::ADAPTIVE, v1::RECOMPUTE_NONE, 2, 2);
  llama(v1::INTERLEAVED_1F1B, v1::RECOMPUTE_NONE, 2, 1);
  llama(v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_NONE, 2, 1);
  llama(v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_FULL, 4, 1);
  llama(v1::ADAPTIVE_ZERO_BUBBLE, v1::RECOMPUTE_NONE, 4, 1);
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1).method = v1::PACKING;
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 2).method = v1::PACKING;
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1).tied = true;
  // A tied head across stages: the last stage's replica of the embedding,
  // its gradient summed with the first stage's (and counted once in the
  // gradient norm).
  llama(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1).tied = true;
  llama(v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_FULL, 4, 1).tied = true;
  Cell& tied_packed = llama(v1::ADAPTIVE, v1::RECOMPUTE_SELECTIVE, 2, 2);
  tied_packed.tied = true;
  tied_packed.method = v1::PACKING;
  // T5V11 (docs/models.md): every schedule family, each recompute mode, the
  // four shapes, split backwards and packed rows (relative positions restart
  // per sample). At pp = 4 the encoder and the decoder take two stages each,
  // so the shared embedding and both bias tables are replicated.
  const auto t5v11 = [&add](v1::ScheduleKind schedule, v1::RecomputeMode recompute, uint32_t pp,
                            uint32_t dp) -> Cell& {
    return add(Cell{.t5 = true, .t5v11 = true}, schedule, recompute, pp, dp);
  };
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1);
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, 2, 2);
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_FULL, 4, 1);
  t5v11(v1::GPIPE, v1::RECOMPUTE_FULL, 2, 1);
  t5v11(v1::KFKB, v1::RECOMPUTE_SELECTIVE, 4, 1);
  t5v11(v1::ADAPTIVE, v1::RECOMPUTE_NONE, 2, 2);
  t5v11(v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_NONE, 2, 1);
  t5v11(v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_FULL, 4, 1);
  t5v11(v1::ADAPTIVE_ZERO_BUBBLE, v1::RECOMPUTE_SELECTIVE, 4, 1);
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1).method = v1::PACKING;
  t5v11(v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 2).method = v1::PACKING;
  t5v11(v1::ADAPTIVE, v1::RECOMPUTE_SELECTIVE, 4, 1).method = v1::PACKING;
  // Uneven stage layouts (parallelism.stage_layout LISTED): stages of
  // different depth under plain, split-backward, interleaved and packed
  // schedules; T5 with the encoder over three stages and the decoder over
  // one; a tied LLAMA head and T5V11's shared parameters across them.
  add(Cell{.layout = {3, 1}}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.layout = {1, 3}}, v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_SELECTIVE, 2, 1);
  add(Cell{.layout = {2, 1, 1, 2}}, v1::ADAPTIVE, v1::RECOMPUTE_FULL, 4, 1);
  add(Cell{.layout = {3, 1, 1, 1}}, v1::INTERLEAVED_1F1B, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.method = v1::PACKING, .layout = {1, 3}}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 2);
  add(Cell{.t5 = true, .layout = {2, 1, 1, 4}, .encoder_stages = 3}, v1::ONE_F_ONE_B,
      v1::RECOMPUTE_SELECTIVE, 4, 1);
  add(Cell{.t5 = true, .layout = {4, 1, 3}, .encoder_stages = 1}, v1::ADAPTIVE_ZERO_BUBBLE,
      v1::RECOMPUTE_NONE, 3, 1);
  add(Cell{.llama = true, .tied = true, .layout = {3, 1}}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2,
      1);
  add(Cell{.t5 = true, .t5v11 = true, .layout = {1, 3, 3, 1}, .encoder_stages = 2},
      v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_FULL, 4, 1);
  // Tensor parallelism (tensor = 2; docs/executor.md, "Tensor
  // parallelism"): each architecture at pp 1 and 2, dp 1 and 2, with and
  // without sequence parallelism (whose tiny lengths are mostly odd, so the
  // sequence parts are padded), every recompute mode, split backwards,
  // packed rows, and the
  // shared parameters across stages (a tied LLAMA head, T5V11's embedding
  // and bias tables, whose heads are split too).
  const auto tp2 = [&add](Cell c, v1::ScheduleKind schedule, v1::RecomputeMode recompute,
                          uint32_t pp, uint32_t dp, bool sp) -> Cell& {
    c.tp = 2;
    c.sp = sp;
    return add(c, schedule, recompute, pp, dp);
  };
  tp2(Cell{}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1, false);
  tp2(Cell{}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 2, false);
  tp2(Cell{}, v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, 1, 2, true);
  tp2(Cell{}, v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_FULL, 2, 1, true);
  tp2(Cell{.method = v1::PACKING}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1, true);
  tp2(Cell{.t5 = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1, false);
  tp2(Cell{.t5 = true}, v1::ADAPTIVE, v1::RECOMPUTE_FULL, 2, 1, true);
  tp2(Cell{.t5 = true}, v1::ADAPTIVE_ZERO_BUBBLE, v1::RECOMPUTE_NONE, 2, 1, false);
  tp2(Cell{.llama = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, 2, 1, false);
  tp2(Cell{.llama = true, .tied = true}, v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_NONE, 2, 1, true);
  tp2(Cell{.llama = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_FULL, 2, 1, true);
  tp2(Cell{.llama = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 2, true);
  tp2(Cell{.t5 = true, .t5v11 = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1, false);
  tp2(Cell{.t5 = true, .t5v11 = true}, v1::ADAPTIVE_ZERO_BUBBLE, v1::RECOMPUTE_SELECTIVE, 2, 2,
      true);
  // ZeRO stage 1 over each tensor index's data-parallel group: the shards
  // of each tensor rank's parts.
  tp2(Cell{.zero_stage = 1}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 2, true);
  // The head on the labelled positions only, over several chunks of a few
  // tokens (chunked_loss_head.h): packed rows of each architecture, tied
  // LLAMA heads, split backwards (the head's weight gradient in B), full
  // recomputation, and the vocabulary-parallel head under tensor
  // parallelism 2 (with sequence parallelism: the head on gathered rows).
  const auto labelled = [&add](Cell c, int64_t chunk, v1::ScheduleKind schedule,
                               v1::RecomputeMode recompute, uint32_t pp, uint32_t dp) -> Cell& {
    c.loss_chunk = chunk;
    c.method = v1::PACKING;
    return add(c, schedule, recompute, pp, dp);
  };
  labelled(Cell{}, 5, v1::ONE_F_ONE_B, v1::RECOMPUTE_FULL, 2, 1);
  labelled(Cell{.llama = true, .tied = true}, 3, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1, 1);
  labelled(Cell{.llama = true, .tied = true}, 3, v1::ADAPTIVE, v1::RECOMPUTE_SELECTIVE, 2, 2);
  labelled(Cell{.t5 = true}, 4, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  labelled(Cell{.t5 = true, .t5v11 = true}, 4, v1::ONE_F_ONE_B, v1::RECOMPUTE_SELECTIVE, 2, 1);
  labelled(Cell{.tp = 2, .sp = true}, 5, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  labelled(Cell{.llama = true, .tied = true, .tp = 2}, 3, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 1,
           1);
  labelled(Cell{.t5 = true, .t5v11 = true, .tp = 2, .sp = true}, 4, v1::ONE_F_ONE_B,
           v1::RECOMPUTE_FULL, 2, 1);
  // Split backwards (unpacked: the zero-bubble cells' rows).
  add(Cell{.loss_chunk = 3}, v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.t5 = true, .loss_chunk = 4}, v1::ADAPTIVE_ZERO_BUBBLE, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.llama = true, .tied = true, .tp = 2, .sp = true, .loss_chunk = 3}, v1::ZERO_BUBBLE_H1,
      v1::RECOMPUTE_NONE, 2, 1);
  // Per-micro-batch recompute modes (MixRecompute): in 1F1B at pp 2 the
  // first stage runs the forward of micro-batch k + 1 (selective) before
  // the backward of k (full), whose re-run must still use k's mode.
  add(Cell{.mixed_recompute = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.mixed_recompute = true}, v1::ZERO_BUBBLE_H1, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.llama = true, .mixed_recompute = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.t5 = true, .mixed_recompute = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.t5 = true, .t5v11 = true, .mixed_recompute = true}, v1::ONE_F_ONE_B,
      v1::RECOMPUTE_NONE, 2, 1);
  add(Cell{.mixed_recompute = true}, v1::ONE_F_ONE_B, v1::RECOMPUTE_NONE, 2, 2);
  return cells;
}

// The modes MixRecompute cycles through, by micro-batch id.
constexpr const char* kMixedModes[] = {"full", "selective", "none"};

// Gives micro-batch `id` of data-parallel replica `dp_rank` the mode
// kMixedModes[(id + dp_rank) % 3]: every rank of a pipeline lists the same
// micro-batches, so all of them record the same mode for each.
void MixRecompute(std::vector<v1::ExecutionPlan>& plans) {
  for (v1::ExecutionPlan& plan : plans) {
    for (v1::MicroBatch& mb : *plan.mutable_micro_batches()) {
      mb.set_recompute(kMixedModes[(mb.id() + plan.dp_rank()) % 3]);
    }
  }
}

// Rewrites one iteration's plans ([rank]) before they run.
using PlanRewrite = std::function<void(std::vector<v1::ExecutionPlan>&)>;

// Replicas of shared parameters in one pipeline (docs/models.md, "Shared
// parameters"): the copies beyond each one's owner.
int SharedReplicas(const v1::JobConfig& config) {
  const absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(config);
  EXPECT_THAT(spec, IsOk());
  if (!spec.ok()) return 0;
  const absl::StatusOr<std::vector<executor::StageRole>> roles = executor::PipelineStageRoles(
      *spec, config.parallelism().pipeline() * config.parallelism().virtual_chunks());
  EXPECT_THAT(roles, IsOk());
  if (!roles.ok()) return 0;
  int replicas = 0;
  for (const executor::SharedParameter& shared : executor::SharedParameters(*spec, *roles)) {
    replicas += static_cast<int>(shared.stages.size()) - 1;
  }
  return replicas;
}

// Runs `plans` ([iteration][rank]) of `config` on threaded ranks (a fresh
// redis-server for the rendezvous), recording the gradients.
std::vector<RankRun> RunPlans(const v1::JobConfig& config,
                              const std::vector<std::vector<v1::ExecutionPlan>>& plans,
                              const SampleDataset& dataset, torch::Device device = torch::kCPU,
                              bool stage_through_host = false, int64_t loss_chunk_tokens = 0) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  EXPECT_THAT(redis, IsOk());
  if (!redis.ok()) return {};
  ThreadedRanksOptions options;
  options.redis_host = (*redis)->host();
  options.redis_port = (*redis)->port();
  options.redis_password = (*redis)->password();
  options.prefix = "equivalence";
  options.capture_gradients = true;
  options.device = device;
  options.stage_through_host = stage_through_host;
  options.loss_chunk_tokens = loss_chunk_tokens;
  return RunThreadedRanks(config, plans, dataset, options);
}

// Plans `iterations` iterations of `config`, runs them on threaded ranks and
// checks every iteration and the final parameters against the reference
// (the checks listed at the top). `rewrite`, when set, rewrites each
// iteration's plans first. Returns the plans ([iteration][rank], as run)
// and, when `runs` is set, the ranks' runs.
std::vector<std::vector<v1::ExecutionPlan>> RunAndCompare(const v1::JobConfig& config,
                                                          const std::string& name,
                                                          std::vector<RankRun>* runs = nullptr,
                                                          torch::Device device = torch::kCPU,
                                                          bool stage_through_host = false,
                                                          int64_t loss_chunk_tokens = 0,
                                                          const PlanRewrite& rewrite = {}) {
  const int iterations = static_cast<int>(config.training().iterations());
  const uint32_t dp = config.parallelism().data();
  // Ranks r * tp .. r * tp + tp - 1 run plan r, each on its part of the
  // model; the loss is the same on all of them.
  const int tp = static_cast<int>(config.parallelism().tensor());
  const bool sharded = config.training().zero_stage() >= 1 && dp > 1;
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  EXPECT_THAT(dataset, IsOk());
  if (!dataset.ok()) return {};
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
      MiniBatchSampler::Create((*dataset)->AllLengths(), SamplerOptionsFromConfig(config));
  EXPECT_THAT(sampler, IsOk());
  if (!sampler.ok()) return {};

  std::vector<std::vector<v1::ExecutionPlan>> plans;
  for (int it = 0; it < iterations; ++it) {
    uint64_t limit = 0;
    absl::StatusOr<std::vector<v1::ExecutionPlan>> p =
        PlanTinyIteration(config, it, **dataset, &limit);
    EXPECT_THAT(p, IsOk()) << "iteration " << it;
    if (!p.ok()) return {};
    if (rewrite) rewrite(*p);
    int micro_batches = 0;
    for (const v1::ExecutionPlan& plan : *p) {
      if (plan.pp_rank() == 0) micro_batches += plan.micro_batches_size();
    }
    std::printf(
        "iteration %d: %d micro-batches over %u replicas, %d instructions on rank 0, "
        "planned with %llu MiB per device\n",
        it, micro_batches, dp, (*p)[0].instructions_size(), static_cast<unsigned long long>(limit));
    // Every sample of the mini-batch is fed exactly once.
    std::vector<uint64_t> fed;
    for (const ReferenceSample& s : IterationSamples(*p)) fed.push_back(s.id);
    std::vector<uint64_t> sampled = (*sampler)->Get(it).sample_ids;
    std::sort(fed.begin(), fed.end());
    std::sort(sampled.begin(), sampled.end());
    EXPECT_EQ(fed, sampled) << "iteration " << it;
    plans.push_back(*std::move(p));
  }

  const std::vector<RankRun> ranks =
      RunPlans(config, plans, **dataset, device, stage_through_host, loss_chunk_tokens);
  if (runs != nullptr) *runs = ranks;
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_THAT(ranks[r].status, IsOk()) << "rank " << r;
    if (!ranks[r].status.ok() || ranks[r].stats.size() != size_t(iterations) ||
        ranks[r].gradients.size() != size_t(iterations)) {
      ADD_FAILURE() << "rank " << r << " ran " << ranks[r].stats.size() << " iterations";
      return plans;
    }
  }

  ReferenceModel reference(config);
  const NamedTensors initial = [&] {
    NamedTensors copy;
    for (const auto& [name, p] : reference.parameters()) copy[name] = p.detach().clone();
    return copy;
  }();
  double worst_gradient = 0;
  double worst_loss = 0;
  double worst_norm = 0;
  std::string worst_gradient_name;
  for (int it = 0; it < iterations; ++it) {
    const ReferencePass pass = reference.Gradients(IterationSamples(plans[it]), **dataset);
    EXPECT_EQ(plans[it][0].global_target_tokens(), pass.loss_tokens) << "iteration " << it;
    double loss = 0;
    int compared = 0;
    const NamedTensors& whole_gradients = pass.gradients;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const executor::IterationStats& stats = ranks[r].stats[it];
      const int index = static_cast<int>(r) % tp;
      if (stats.has_loss && index == 0) loss += stats.loss;
      // Padded tokens count rows (a packed row holds several samples).
      uint64_t padded = 0;
      for (const v1::MicroBatch& mb : plans[it][r / tp].micro_batches()) {
        const int rows = mb.row_starts_size() > 0 ? mb.row_starts_size() : mb.sample_ids_size();
        padded += static_cast<uint64_t>(rows) * (mb.input_len() + mb.target_len());
        // A packed micro-batch runs the kernel the job fixes, or one the
        // planner chose for it.
        if (mb.row_starts_size() > 0) {
          const v1::PackedAttention job_kernel = config.model().packed_attention();
          if (job_kernel != v1::FASTEST_PER_MICRO_BATCH) {
            EXPECT_EQ(mb.packed_attention(), job_kernel);
          }
          EXPECT_TRUE(mb.packed_attention() == v1::PER_SAMPLE ||
                      mb.packed_attention() == v1::BLOCK_DIAGONAL_MASK);
        }
      }
      EXPECT_EQ(stats.padded_tokens, padded) << "rank " << r << " iteration " << it;
      EXPECT_LE(stats.real_tokens, stats.padded_tokens) << "rank " << r << " iteration " << it;
      EXPECT_DOUBLE_EQ(stats.learning_rate, config.training().learning_rate());
      const double norm_error = std::abs(stats.grad_norm - pass.grad_norm) / pass.grad_norm;
      EXPECT_LE(norm_error, kTolerance) << "rank " << r << " iteration " << it << ": grad norm "
                                        << stats.grad_norm << " vs " << pass.grad_norm;
      worst_norm = std::max(worst_norm, norm_error);
      // Under ZeRO stage 1 a rank's gradients before the step are valid on
      // its shard only (optimizer_sharding.h): the loss, the norm and the
      // parameters after each step are compared instead.
      if (sharded) continue;
      const TensorDifference d =
          MaxRelativeDifference(ranks[r].gradients[it], TensorPartOf(whole_gradients, tp, index));
      EXPECT_LE(d.worst, kTolerance)
          << "rank " << r << " iteration " << it << ": gradient of " << d.worst_name;
      if (d.worst > worst_gradient) {
        worst_gradient = d.worst;
        worst_gradient_name = d.worst_name;
      }
      compared += d.compared;
    }
    // Each replica holds the whole model once (each tensor rank a part of
    // every parameter), and a shared parameter once per stage holding it (a
    // replica compares with the same reference gradient: the interpreter
    // summed its copies' gradients).
    EXPECT_EQ(
        compared,
        sharded ? 0 : static_cast<int>(dp * tp * (pass.gradients.size() + SharedReplicas(config))))
        << "iteration " << it;
    const double loss_error = std::abs(loss - pass.loss) / pass.loss;
    EXPECT_LE(loss_error, kTolerance)
        << "iteration " << it << ": loss " << loss << " vs " << pass.loss;
    worst_loss = std::max(worst_loss, loss_error);
    std::printf("iteration %d: loss %.9f (reference %.9f), grad norm %.9f (reference %.9f)\n", it,
                loss, pass.loss, ranks[0].stats[it].grad_norm, pass.grad_norm);
    reference.SgdStep(pass.gradients, config.training().learning_rate());
  }
  double worst_parameter = 0;
  double worst_update = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int index = static_cast<int>(r) % tp;
    const NamedTensors final_part = TensorPartOf(reference.parameters(), tp, index);
    const NamedTensors initial_part = TensorPartOf(initial, tp, index);
    const TensorDifference d = MaxRelativeDifference(ranks[r].parameters, final_part);
    EXPECT_LE(d.worst, kTolerance) << "rank " << r << ": parameter " << d.worst_name;
    worst_parameter = std::max(worst_parameter, d.worst);
    // The steps' total update, a stricter view of the same.
    NamedTensors update;
    NamedTensors reference_update;
    for (const auto& [name, p] : ranks[r].parameters) {
      update[name] = p - initial_part.at(name);
      reference_update[name] = final_part.at(name) - initial_part.at(name);
    }
    worst_update = std::max(worst_update, MaxRelativeDifference(update, reference_update).worst);
  }
  std::printf(
      "%s: worst relative difference over %d iterations: gradients %.3g (%s), loss %.3g, "
      "grad norm %.3g, parameters %.3g, updates %.3g\n",
      name.c_str(), iterations, worst_gradient, worst_gradient_name.c_str(), worst_loss, worst_norm,
      worst_parameter, worst_update);
  return plans;
}

// Zero-bubble cells: the plans split backwards (at least one over the
// iterations: at the tightest limit that plans, what a split backward keeps
// for its W, beside the transfer buffers the simulator counts, may not fit
// in some iteration, and the fill then keeps its backwards whole), and run
// with every backward whole they give the same gradients, every iteration,
// within 1e-6 relative.
void CompareWithWholeBackwards(const v1::JobConfig& config,
                               const std::vector<std::vector<v1::ExecutionPlan>>& plans,
                               const std::vector<RankRun>& split, int64_t loss_chunk_tokens) {
  std::vector<std::vector<v1::ExecutionPlan>> whole_plans;
  int split_backwards = 0;
  for (const std::vector<v1::ExecutionPlan>& iteration : plans) {
    split_backwards += SplitBackwards(iteration);
    std::vector<v1::ExecutionPlan>& whole = whole_plans.emplace_back();
    for (const v1::ExecutionPlan& plan : iteration) whole.push_back(WithWholeBackwards(plan));
  }
  EXPECT_GE(split_backwards, 1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<RankRun> whole =
      RunPlans(config, whole_plans, **dataset, torch::kCPU, false, loss_chunk_tokens);
  ASSERT_EQ(whole.size(), split.size());
  double worst = 0;
  std::string worst_name;
  for (size_t r = 0; r < whole.size(); ++r) {
    ASSERT_THAT(whole[r].status, IsOk()) << "rank " << r;
    ASSERT_EQ(whole[r].gradients.size(), split[r].gradients.size());
    for (size_t it = 0; it < whole[r].gradients.size(); ++it) {
      const TensorDifference d =
          MaxRelativeDifference(split[r].gradients[it], whole[r].gradients[it]);
      EXPECT_EQ(d.compared, static_cast<int>(whole[r].gradients[it].size()));
      EXPECT_LE(d.worst, kSplitTolerance)
          << "rank " << r << " iteration " << it << ": gradient of " << d.worst_name;
      if (d.worst > worst) {
        worst = d.worst;
        worst_name = d.worst_name;
      }
    }
  }
  std::printf(
      "%d split backwards over %zu iterations; split against whole backwards: worst relative "
      "gradient difference %.3g (%s)\n",
      split_backwards, plans.size(), worst, worst_name.c_str());
}

// The tiny job of a cell: plain SGD for kIterations iterations.
absl::StatusOr<v1::JobConfig> CellConfig(const Cell& c) {
  TinyJob job;
  job.t5 = c.t5;
  job.llama = c.llama;
  job.tie_word_embeddings = c.tied;
  job.t5v11 = c.t5v11;
  job.schedule = c.schedule;
  job.recompute = c.recompute;
  job.method = c.method;
  // Packed cells run the kernel they are named after.
  if (c.method == v1::PACKING) job.packed_attention = c.packed_attention;
  job.pipeline = c.pp;
  job.data = c.dp;
  job.chunks = c.chunks;
  job.tensor = c.tp;
  job.sequence_parallel = c.sp;
  job.stage_layers = c.layout;
  job.encoder_stages = c.encoder_stages;
  job.optimizer = v1::SGD;
  job.iterations = kIterations;
  VP_ASSIGN_OR_RETURN(v1::JobConfig config, TinyJobConfig(job));
  config.mutable_training()->set_zero_stage(c.zero_stage);
  return config;
}

class Equivalence : public ::testing::TestWithParam<Cell> {};

TEST_P(Equivalence, ThreeSgdStepsMatchTheReference) {
  const Cell& c = GetParam();
  absl::StatusOr<v1::JobConfig> config = CellConfig(c);
  ASSERT_THAT(config, IsOk());
  std::vector<RankRun> split;
  const std::vector<std::vector<v1::ExecutionPlan>> plans =
      RunAndCompare(*config, CellName(c), &split, torch::kCPU, false, c.loss_chunk,
                    c.mixed_recompute ? PlanRewrite(MixRecompute) : PlanRewrite());
  ASSERT_EQ(plans.size(), size_t{kIterations});
  if (c.mixed_recompute) {
    // Every mode ran on some micro-batch of each replica.
    for (int dp_rank = 0; dp_rank < static_cast<int>(c.dp); ++dp_rank) {
      std::map<std::string, int> modes;
      for (const std::vector<v1::ExecutionPlan>& iteration : plans) {
        for (const v1::ExecutionPlan& plan : iteration) {
          if (plan.dp_rank() != dp_rank || plan.pp_rank() != 0) continue;
          for (const v1::MicroBatch& mb : plan.micro_batches()) ++modes[mb.recompute()];
        }
      }
      for (const char* mode : kMixedModes) {
        EXPECT_GE(modes[mode], 1) << "replica " << dp_rank << " ran no micro-batch under " << mode;
      }
      std::printf("replica %d: %d full, %d selective, %d none micro-batches\n", dp_rank,
                  modes["full"], modes["selective"], modes["none"]);
    }
  }
  if (c.schedule == v1::ZERO_BUBBLE_H1 || c.schedule == v1::ADAPTIVE_ZERO_BUBBLE) {
    CompareWithWholeBackwards(*config, plans, split, c.loss_chunk);
  }
  for (const std::vector<v1::ExecutionPlan>& iteration : plans) {
    ASSERT_EQ(iteration.size(), size_t{c.pp} * c.dp);
    for (const v1::ExecutionPlan& plan : iteration) {
      EXPECT_EQ(plan.recompute(), c.recompute == v1::RECOMPUTE_FULL        ? "full"
                                  : c.recompute == v1::RECOMPUTE_SELECTIVE ? "selective"
                                                                           : "none");
      EXPECT_EQ(plan.partition_method(),
                c.method == v1::PACKING ? "packing" : "dynamic_programming");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, Equivalence, ::testing::ValuesIn(Matrix()),
                         [](const auto& info) { return CellName(info.param); });

// What one instruction did to its rank's measured memory
// (counting_allocator.h): the bytes it kept (live bytes after it minus
// before it) and its transient (its peak minus the bytes before it).
struct PassMemory {
  int64_t kept = 0;
  int64_t transient = 0;
};

// PassMemory of every instruction of every rank ([rank][instruction]) when
// `plans` run as one iteration on threaded ranks. Inputs are built on the
// rank's thread when taken: a prefetch thread's allocations are charged to
// its rank at times that vary, and without it every count is exact.
std::vector<std::vector<PassMemory>> MeasuredPasses(const v1::JobConfig& config,
                                                    const std::vector<v1::ExecutionPlan>& plans,
                                                    const SampleDataset& dataset) {
  executor::InstallCountingCpuAllocator();
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  EXPECT_THAT(redis, IsOk());
  if (!redis.ok()) return {};
  std::vector<std::unique_ptr<executor::MemoryAccount>> accounts;
  ThreadedRanksOptions options;
  options.redis_host = (*redis)->host();
  options.redis_port = (*redis)->port();
  options.redis_password = (*redis)->password();
  options.prefix = "mixed-recompute-memory";
  options.prefetch_inputs = 0;
  for (size_t r = 0; r < plans.size(); ++r) {
    accounts.push_back(std::make_unique<executor::MemoryAccount>());
    options.memory.push_back(accounts.back().get());
  }
  const std::vector<RankRun> ranks = RunThreadedRanks(config, {plans}, dataset, options);
  std::vector<std::vector<PassMemory>> passes(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_THAT(ranks[r].status, IsOk()) << "rank " << r;
    if (!ranks[r].status.ok() || ranks[r].stats.size() != 1) return {};
    const executor::IterationStats& stats = ranks[r].stats[0];
    int64_t before = stats.memory_start_bytes;
    for (const executor::InstructionMemory& m : stats.instruction_memory) {
      passes[r].push_back({.kept = m.current_bytes - before, .transient = m.peak_bytes - before});
      before = m.current_bytes;
    }
  }
  return passes;
}

// Each micro-batch runs under its own mode (MicroBatch.recompute), measured:
// the same plans (GPT, 1F1B, pp 2) run with every micro-batch under none,
// under selective, under full (the plans' recompute), and mixed
// (MixRecompute). Every forward keeps, and every backward's transient
// reaches, exactly the bytes of the uniform run of its micro-batch's mode,
// and the three modes keep amounts far apart (none > selective > full). In
// 1F1B the first stage runs a selective forward between each full
// micro-batch's forward and its backward: a backward that re-ran its layers
// under the latest forward's mode reaches 24 KiB or more above the uniform
// full run's transient.
TEST(MixedRecompute, EveryPassKeepsWhatItsOwnModeKeeps) {
  // How far apart two modes' kept bytes must be (one micro-batch's token
  // tensors are about 4 KiB here).
  constexpr int64_t kModesApart = 32 << 10;
  absl::StatusOr<v1::JobConfig> config = CellConfig(Cell{.pp = 2});
  ASSERT_THAT(config, IsOk());
  config->mutable_training()->set_iterations(1);
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans = PlanTinyIteration(*config, 0, **dataset);
  ASSERT_THAT(plans, IsOk());
  std::map<std::string, std::vector<std::vector<PassMemory>>> uniform;
  for (const char* mode : kMixedModes) {
    std::vector<v1::ExecutionPlan> same = *plans;
    for (v1::ExecutionPlan& plan : same) plan.set_recompute(mode);
    uniform[mode] = MeasuredPasses(*config, same, **dataset);
    ASSERT_EQ(uniform[mode].size(), plans->size()) << mode;
  }
  std::vector<v1::ExecutionPlan> mixed_plans = *plans;
  MixRecompute(mixed_plans);
  const std::vector<std::vector<PassMemory>> mixed =
      MeasuredPasses(*config, mixed_plans, **dataset);
  ASSERT_EQ(mixed.size(), plans->size());
  int forwards = 0;
  int backwards = 0;
  int64_t worst = 0;
  int64_t closest_modes = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < plans->size(); ++r) {
    const v1::ExecutionPlan& plan = mixed_plans[r];
    ASSERT_EQ(mixed[r].size(), static_cast<size_t>(plan.instructions_size()));
    for (int i = 0; i < plan.instructions_size(); ++i) {
      const v1::Instruction& in = plan.instructions(i);
      if (!in.has_forward() && !in.has_backward()) continue;
      const std::string mode = plan.micro_batches(static_cast<int>(in.micro_batch())).recompute();
      // Forwards: the bytes kept for the backward; backwards: the peak.
      const auto measure = [&](const std::vector<std::vector<PassMemory>>& run) {
        return in.has_forward() ? run[r][i].kept : run[r][i].transient;
      };
      const std::string where = absl::StrCat("rank ", r, " instruction #", i, " (",
                                             in.has_forward() ? "forward" : "backward",
                                             " of micro-batch ", in.micro_batch(), ", ", mode, ")");
      const int64_t difference = std::abs(measure(mixed) - measure(uniform.at(mode)));
      EXPECT_EQ(difference, 0) << where << ": " << measure(mixed) << " bytes mixed, "
                                           << measure(uniform.at(mode)) << " uniform";
      worst = std::max(worst, difference);
      if (in.has_forward()) {
        ++forwards;
        const int64_t none = measure(uniform.at("none"));
        const int64_t selective = measure(uniform.at("selective"));
        const int64_t full = measure(uniform.at("full"));
        EXPECT_GT(none - selective, kModesApart) << where;
        EXPECT_GT(selective - full, kModesApart) << where;
        closest_modes = std::min({closest_modes, none - selective, selective - full});
      } else {
        ++backwards;
      }
    }
  }
  std::printf(
      "%d forwards and %d backwards over %zu ranks: worst difference from the uniform run of "
      "their mode %lld bytes; closest two modes' kept bytes %lld apart\n",
      forwards, backwards, plans->size(), static_cast<long long>(worst),
      static_cast<long long>(closest_modes));
  EXPECT_GE(forwards, 6);
}

// The same comparison with the ranks' models on a GPU (fp32, TF32 off): one
// rank per cell, and cells whose ranks share the GPU over Gloo with their
// device buffers staged through host memory (DeviceStagingTransport; NCCL
// refuses two ranks on one device). deploy/gpu/run-on-gpu.sh runs these;
// they skip without a GPU.
class CudaEquivalence : public ::testing::TestWithParam<Cell> {};

TEST_P(CudaEquivalence, ThreeSgdStepsMatchTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible to LibTorch";
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const Cell& c = GetParam();
  absl::StatusOr<v1::JobConfig> config = CellConfig(c);
  ASSERT_THAT(config, IsOk());
  const std::vector<std::vector<v1::ExecutionPlan>> plans =
      RunAndCompare(*config, "Cuda" + CellName(c), nullptr, torch::Device(torch::kCUDA, 0),
                    /*stage_through_host=*/false, c.loss_chunk);
  EXPECT_EQ(plans.size(), size_t{kIterations});
}

std::vector<Cell> CudaCells() {
  std::vector<Cell> cells;
  for (int model = 0; model < 4; ++model) {
    for (v1::RecomputeMode recompute :
         {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
      Cell c;
      c.t5 = model == 1 || model == 3;
      c.llama = model == 2;
      c.t5v11 = model == 3;
      c.recompute = recompute;
      cells.push_back(c);
    }
    Cell packed;
    packed.t5 = model == 1 || model == 3;
    packed.llama = model == 2;
    packed.t5v11 = model == 3;
    packed.method = v1::PACKING;
    cells.push_back(packed);
  }
  // Several ranks on the one GPU: pipeline transfers, the data-parallel
  // all-reduce, split backwards and packed rows.
  const auto several = [&](bool t5, bool llama, v1::ScheduleKind schedule, uint32_t pp,
                           uint32_t dp) -> Cell& {
    cells.push_back(Cell{.t5 = t5, .llama = llama, .schedule = schedule, .pp = pp, .dp = dp});
    return cells.back();
  };
  several(false, false, v1::ONE_F_ONE_B, 2, 1);
  several(false, false, v1::ONE_F_ONE_B, 2, 2);
  several(true, false, v1::ONE_F_ONE_B, 2, 1);
  several(false, true, v1::ZERO_BUBBLE_H1, 2, 1);
  several(false, false, v1::ONE_F_ONE_B, 2, 1).method = v1::PACKING;
  // The labelled-positions head over several chunks, tied and not.
  several(false, true, v1::ONE_F_ONE_B, 1, 1).loss_chunk = 3;
  Cell& tied = several(false, true, v1::ONE_F_ONE_B, 1, 1);
  tied.tied = true;
  tied.method = v1::PACKING;
  tied.loss_chunk = 3;
  several(true, false, v1::ONE_F_ONE_B, 1, 1).loss_chunk = 4;
  return cells;
}

// The path the GPU cells with several ranks take (DeviceStagingTransport
// between the interpreter and Gloo, host reductions on Gloo itself), on the
// CPU: pipeline transfers, the data-parallel all-reduce, split backwards.
TEST(StagedEquivalence, RanksBehindTheStagingTransportMatchTheReference) {
  for (const auto& [schedule, pp, dp] :
       {std::tuple{v1::ONE_F_ONE_B, 2u, 2u}, std::tuple{v1::ZERO_BUBBLE_H1, 2u, 1u}}) {
    Cell c;
    c.schedule = schedule;
    c.pp = pp;
    c.dp = dp;
    absl::StatusOr<v1::JobConfig> config = CellConfig(c);
    ASSERT_THAT(config, IsOk());
    const std::vector<std::vector<v1::ExecutionPlan>> plans =
        RunAndCompare(*config, "Staged" + CellName(c), nullptr, torch::kCPU,
                      /*stage_through_host=*/true);
    EXPECT_EQ(plans.size(), size_t{kIterations}) << CellName(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaEquivalence, ::testing::ValuesIn(CudaCells()),
                         [](const auto& info) { return "Cuda" + CellName(info.param); });

// Samples the planner shortens to fit memory (planner.truncate_long_samples)
// are fed as the plan says: the reference reads the plan's lengths, so an
// executor that re-derived them (by the data limits alone) would train on
// other tokens and differ. The memory limit is low enough that some samples
// are shortened below the data limit.
TEST(TruncationEquivalence, SamplesShortenedToFitMemoryAreFedAsPlanned) {
  TinyJob job;
  job.pipeline = 2;
  job.optimizer = v1::SGD;
  job.iterations = 1;
  job.max_sequence_length = 2048;
  job.tokens_per_global_batch = 4096;
  job.truncate_long_samples = true;
  job.memory_mib = 6;
  absl::StatusOr<v1::JobConfig> config = TinyJobConfig(job);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
  ASSERT_THAT(dataset, IsOk());
  const std::vector<std::vector<v1::ExecutionPlan>> plans =
      RunAndCompare(*config, "TruncatedToFitMemory");
  ASSERT_EQ(plans.size(), 1u);
  const SamplerOptions sampler = SamplerOptionsFromConfig(*config);
  int shortened = 0;
  uint32_t longest = 0;
  for (const ReferenceSample& s : IterationSamples(plans[0])) {
    const SampleLengths by_data_limits = TruncateSample((*dataset)->Lengths(s.id), sampler);
    EXPECT_LE(s.input, by_data_limits.input);
    EXPECT_LE(s.target, by_data_limits.target);
    if (s.input + s.target < by_data_limits.input + by_data_limits.target) ++shortened;
    longest = std::max(longest, s.input + s.target);
  }
  std::printf("%d samples shortened to fit memory; the longest sample fed has %u tokens\n",
              shortened, longest);
  EXPECT_GE(shortened, 1);
}

}  // namespace
}  // namespace varipipe::testing
