#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/config/rank_layout.h"
#include "common/dataset/loss_tokens.h"
#include "common/plan_contract/context_parallel_split.h"
#include "planner/comm/comm_planner.h"
#include "planner/cost/context_split_cost.h"
#include "planner/cost/cost_model_io.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/cost/update_costs.h"
#include "planner/method_summary.h"
#include "planner/microbatch/baseline_settings.h"
#include "planner/microbatch/context_placement.h"
#include "planner/microbatch/dp_balance.h"
#include "planner/microbatch/micro_batching.h"
#include "planner/microbatch/padding_stats.h"
#include "planner/parallel.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/sample_layout.h"
#include "planner/plan/validator.h"
#include "planner/schedule/backward_split.h"
#include "planner/schedule/lane_projection.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/chrome_trace.h"
#include "planner/sim/order_search.h"
#include "planner/sim/simulator.h"

namespace varipipe::planner {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double MiB(double bytes) { return bytes / (1 << 20); }

std::string ScheduleName(v1::ScheduleKind kind) {
  switch (kind) {
    case v1::GPIPE:
      return "gpipe";
    case v1::ONE_F_ONE_B:
      return "one_f_one_b";
    case v1::INTERLEAVED_1F1B:
      return "interleaved_1f1b";
    case v1::KFKB:
      return "kfkb";
    case v1::ADAPTIVE:
      return "adaptive";
    case v1::ZERO_BUBBLE_H1:
      return "zero_bubble_h1";
    case v1::ADAPTIVE_ZERO_BUBBLE:
      return "adaptive_zero_bubble";
    default:
      return "unknown";
  }
}

Link MakeLink(double latency_us, double gbps) { return {latency_us / 1e3, gbps * 1e6}; }

// Whether some context group's ranks (one tensor index each: global ranks
// (g + j) t + i for j < c, rank_layout.h) sit on more than one node of
// `devices_per_node` consecutive devices.
bool ContextGroupSpansNodes(const RankLayout& ranks, uint32_t devices_per_node) {
  const uint64_t per_node = std::max(1u, devices_per_node);
  const uint64_t c = ranks.context;
  const uint64_t t = ranks.tensor;
  if (c < 2) return false;
  if (per_node % (c * t) == 0) return false;  // every group inside one node
  for (uint64_t group = 0; group < static_cast<uint64_t>(ranks.plan_ranks()); group += c) {
    for (uint64_t i = 0; i < t; ++i) {
      if ((group * t + i) / per_node != ((group + c - 1) * t + i) / per_node) return true;
    }
  }
  return false;
}

// One replica's schedule and simulated timeline.
struct ReplicaTimeline {
  PipelineShape shape;
  StageCostTable costs;  // [stage][micro-batch of the replica], as each runs
  DeviceOrder order;     // with context parallelism: the slot schedule
  SimulationResult sim;  // with context parallelism: lane 0's
  std::string error;     // why it could not be scheduled; empty when it was
  bool starved = false;  // the replica got no micro-batch
  // Context parallelism (lanes > 1): the split/whole choice and lanes of
  // the replica's micro-batches, each lane's order (the slot schedule
  // projected, lane_projection.h) and the lanes' simulation.
  LanePlacement placement;
  std::vector<DeviceOrder> lane_orders;
  LaneSimulationResult lanes;
};

// Per-stage costs of every micro-batch of one (method setting, recompute
// mode, memory budget) pair at one chunk count, backward split applied:
// shared by the schedules over that pair (and by a baseline's budgets).
struct PairStageCosts {
  std::vector<std::vector<StageOpCost>> groups;  // [group][stage]
  // [group]: the recompute mode groups[group] is priced under: the
  // candidate's, or (PlannerConfig.uniform_recompute false) the least more
  // recomputing mode of the job's under which it fits a device alone when
  // the candidate's does not (a lone sample's micro-batch: LoneSamples).
  std::vector<Recompute> whole_modes;
  std::string error;  // empty when every group was costed
  // Context parallelism: each group's costs split across the lanes (the
  // slowest lane's; empty where the split cost model has none) and each
  // replica's placement of its groups (context_placement.h).
  std::vector<std::vector<StageOpCost>> split_groups;  // [group][stage]
  std::vector<uint32_t> split_tokens;                  // [group]: A, the lanes' padded count
  // [group]: the recompute mode split_groups[group] is priced under: the
  // candidate's, or (PlannerConfig.uniform_recompute false) the least
  // recomputing mode of the job's that fits a lane when the candidate's
  // does not (MicroBatch.recompute).
  std::vector<Recompute> split_modes;
  // [replica][variant]: the policy's choice, and under PER_MICRO_BATCH
  // also every micro-batch that fits split split, and only those that fit
  // nothing else, where they differ; the simulation keeps the fastest.
  std::vector<std::vector<LanePlacement>> placements;
};

// One (partition method and setting, recompute mode, schedule) candidate.
struct Candidate {
  CandidateReport report;
  PartitionMethod method = PartitionMethod::kDynamicProgramming;
  Recompute recompute = Recompute::kNone;
  v1::ScheduleKind schedule = v1::SCHEDULE_KIND_UNSPECIFIED;
  uint32_t chunks = 1;
  MicroBatchingResult* micro_batching = nullptr;  // owned by the search
  int pair = -1;                                  // in micro_batching->candidates
  std::vector<ReplicaTimeline> replicas;
  std::vector<double> peak_per_rank;
  bool starved = false;        // a replica got no micro-batch: not a memory failure
  bool lone_kept_out = false;  // its micro-batching's MethodSplit::lone_kept_out
  // Lone samples' micro-batches raised until they fit the pipeline-depth
  // budget (else only until they fit the device): CostStages, CostSplits.
  bool raise_to_depth = false;
  const PairStageCosts* stage_costs = nullptr;  // owned by the search
  // No schedule of these micro-batches finishes sooner (MakespanLowerBound).
  double bound_ms = 0;

  const MicroBatchingCandidate& split() const { return micro_batching->candidates[pair]; }
  void Reject(const char* phase, std::string why) {
    report.feasible = false;
    report.rejected_at = phase;
    report.reason = std::move(why);
  }
};

// Micro-batching of one mini-batch by one method and setting.
struct MethodSplit {
  PartitionMethod method;
  BaselineSetting setting;
  MicroBatchingOptions options;
  absl::StatusOr<MicroBatchingResult> result = absl::UnknownError("not run");
  double ms = 0;
  // The lone samples (LoneSamples) are micro-batches of their own here.
  bool lone_kept_out = false;
};

// The state of one Plan call: the phases below fill it in order.
class Search {
 public:
  Search(const v1::JobConfig& config, const CostModel& model, const CostModel& profiled,
         const CalibrationScales& scales, uint64_t calibration_version,
         const PlannerOptions& options, const MiniBatch& mini_batch)
      : c_(config),
        model_(model),
        profiled_(profiled),
        scales_(scales),
        calibration_version_(calibration_version),
        options_(options),
        mini_batch_(mini_batch) {}

  absl::Status Init();
  void MicroBatch();
  void EnumerateCandidates();
  // Schedules and simulates the candidates `which` in increasing order of
  // their makespan bound, a few at a time; with options.prune_by_bound, a
  // candidate whose bound exceeds the best fitting makespan so far is not
  // simulated (it cannot win).
  void Schedule(std::span<const size_t> which);
  bool Schedulable(Candidate& cand);
  int Choose() const;
  int SolvePrunedAndChoose();
  absl::StatusOr<std::vector<v1::ExecutionPlan>> Lower(const Candidate& best);
  absl::Status Validate(const Candidate& best, std::span<const v1::ExecutionPlan> plans);
  PlanReport Report(const Candidate* best, bool with_trace) const;
  absl::Status Failure() const;

  std::vector<Candidate>& candidates() { return candidates_; }
  double scheduling_ms() const { return scheduling_ms_; }

 private:
  ReplicaTimeline ScheduleReplica(const Candidate& cand, uint32_t r) const;
  // Context parallelism: replica r's slots scheduled with cand's schedule,
  // projected onto its lanes and simulated together (out.costs and
  // out.shape set).
  void ScheduleLanes(const Candidate& cand, uint32_t r, const ClusterNetwork& lane0,
                     ReplicaTimeline& out) const;
  void ScheduleVariant(const Candidate& cand, uint32_t r, uint32_t variant,
                       const ClusterNetwork& lane0, ReplicaTimeline& out) const;
  // Context parallelism: the split costs of pair `out`'s groups and each
  // replica's placement.
  void CostSplits(const Candidate& cand, PairStageCosts& out) const;
  // The adaptive schedules of replica r's micro-batches under `cand`'s
  // stage costs, built once and shared by the adaptive and adaptive
  // zero-bubble candidates over them (order_search.h).
  std::shared_ptr<const absl::StatusOr<AdaptiveOrders>> AdaptiveOrdersOf(
      const Candidate& cand, uint32_t r, const PipelineShape& shape, const StageCostTable& costs,
      std::span<const double> times) const;
  // The stage costs of every candidate in `ready`, computed once per pair.
  void CostStages(std::span<const size_t> ready);
  double MakespanLowerBound(const Candidate& cand) const;
  // The layers stage `stage` of `stages` runs for micro-batch `g` (the
  // backward split rule, backward_split.h): encoder layers (GPT layers) over
  // the input tokens, decoder layers over the target tokens, a single T5
  // stage both; the last stage the LM head.
  StageLayers StageLayersOf(uint32_t stage, uint32_t stages, const MicroBatchGroup& g) const {
    StageLayers layers{.samples = static_cast<double>(g.size()),
                       .input_len = g.input_len,
                       .target_len = g.target_len,
                       .head = stage + 1 == stages};
    // The stage's own layer counts, as the stage costs take them.
    layers.encoder_layers = layout_.StageEncoderLayers(stage, stages);
    layers.decoder_layers = layout_.StageDecoderLayers(stage, stages);
    return layers;
  }
  absl::StatusOr<DeviceOrder> StaticOrder(v1::ScheduleKind schedule,
                                          const PipelineShape& shape) const;
  void Judge(Candidate& cand) const;
  std::vector<double> RankLimits(const MicroBatchingResult& mbr) const;
  // The packed rows of `group` when they compute attention per sample
  // (model.packed_attention); nullopt otherwise.
  std::optional<PackedSamples> PerSampleRows(const MicroBatchGroup& group,
                                             const MicroBatchingResult& mbr) const;
  // Replica r's plans: one, or with context parallelism one per lane.
  std::vector<ReplicaPlan> ReplicaOf(const Candidate& best, uint32_t r, absl::Status* status) const;
  // `split_only` (may be null): the lone samples that fit one lane only
  // split, the ones one recompute mode per iteration keeps apart.
  std::vector<uint32_t> LoneSamples(const std::vector<double>& room,
                                    std::vector<uint32_t>* split_only);
  // Whether `ops` (one micro-batch's costs, stage s on device s % p) fits
  // the devices' `room` alone: on each device, every stage's peak plus the
  // stored bytes of the device's earlier stages (interleaved chunks) within
  // it; with `depth`, also the device's stored bytes within room / p, the
  // micro-batching's pipeline-depth budget (p micro-batches in flight).
  bool FitsAlone(const std::vector<StageOpCost>& ops, const std::vector<double>& room,
                 bool depth) const {
    if (ops.empty()) return false;
    std::vector<double> stored(p_, 0);  // per device, of the stages before
    for (size_t s = 0; s < ops.size(); ++s) {
      const size_t d = s % p_;
      if (d >= room.size()) continue;
      if (stored[d] + ops[s].peak_bytes > room[d]) return false;
      stored[d] += ops[s].stored_bytes;
      if (depth && stored[d] > room[d] / p_) return false;
    }
    return true;
  }
  // The mode one micro-batch of `cand` runs under, into `mode`, and its
  // costs under it, into `ops` (`price(mode, &ops)`: false where it cannot
  // price that mode). Every micro-batch: the candidate's mode, as the
  // partition formed it. A lone sample's (`lone`, IsLoneGroup), unless one
  // mode binds the iteration: the first from the candidate's on, in order
  // of recomputation, under which it fits a device alone (with
  // cand.raise_to_depth, within the pipeline-depth budget), else the first
  // under which it fits at all, else the candidate's (the simulation or
  // the placement then refuses it). Returns whether the candidate's own
  // mode was priced (when it was not and nothing else was, `ops` is empty).
  template <typename Price>
  bool PriceUnderItsMode(const Candidate& cand, bool lone, const std::vector<double>& room,
                         const Price& price, std::vector<StageOpCost>* ops, Recompute* mode) const {
    ops->clear();
    *mode = cand.recompute;
    bool priced = false;
    bool kept_fits = false;
    for (const auto& [m, model] : cost_models_) {
      if (m < cand.recompute) continue;
      if (m != cand.recompute && (!lone || c_.planner().uniform_recompute())) break;
      std::vector<StageOpCost> under;
      if (!model->ok() || !price(m, &under)) continue;
      priced |= m == cand.recompute;
      const bool fits = FitsAlone(under, room, false);
      const bool done = !lone || FitsAlone(under, room, cand.raise_to_depth);
      if (done || m == cand.recompute || (fits && !kept_fits)) {
        *ops = std::move(under);
        *mode = m;
        kept_fits = fits;
      }
      if (done) break;
    }
    return priced;
  }
  // Whether group g of `cand`'s micro-batching is a lone sample's
  // micro-batch of its own.
  bool IsLoneGroup(const Candidate& cand, const MicroBatchGroup& group) const {
    return cand.lone_kept_out && group.samples.size() == 1 && group.samples[0] < lone_.size() &&
           lone_[group.samples[0]];
  }
  MicroBatchingResult WithLoneSamples(const MicroBatchingResult* result,
                                      std::span<const uint32_t> kept,
                                      std::span<const uint32_t> lone,
                                      const std::vector<double>& room,
                                      const MicroBatchingOptions& options) const;
  // Appends each stage's profiled forward, backward and (split backward)
  // weight-gradient time of `stage_costs` to `planned`; `g` gives the
  // stages' layers (calibration.h: executors report their measurement
  // beside these).
  void RecordProfiledTimes(const std::vector<StageOpCost>& stage_costs, const MicroBatchGroup& g,
                           PlannedMicroBatch& planned) const {
    const uint32_t stages = static_cast<uint32_t>(stage_costs.size());
    for (uint32_t s = 0; s < stages; ++s) {
      StageOpCost op{.forward_ms = stage_costs[s].forward_ms,
                     .backward_ms = stage_costs[s].backward_ms};
      BackwardSplitRule(dims_).Split(StageLayersOf(s, stages, g), &op);
      planned.profiled_forward_ms.push_back(stage_costs[s].forward_ms);
      planned.profiled_backward_ms.push_back(stage_costs[s].backward_ms);
      planned.profiled_weight_ms.push_back(op.weight_ms);
    }
  }
  // Group g of best's micro-batching, split across the lanes.
  void SplitMicroBatchOf(const Candidate& best, uint32_t g, PlannedMicroBatch& planned) const;

  // The predicted iteration of a candidate: its makespan plus the slowest
  // device's calibrated all-reduce and optimizer step.
  double UpdateMs() const;
  // The calibrated per-iteration overhead; a negative one takes away at
  // most half of the pipeline and update.
  double OverheadMs(double makespan_ms) const;

  const v1::JobConfig& c_;
  const CostModel& model_;     // calibrated: what plans are made with
  const CostModel& profiled_;  // before calibration: the plans' profiled_ms
  const CalibrationScales& scales_;
  const uint64_t calibration_version_;
  const PlannerOptions& options_;
  const MiniBatch& mini_batch_;
  uint32_t p_ = 1;
  uint32_t dp_ = 1;
  uint32_t lanes_ = 1;  // parallelism.context
  v1::ContextSplitPolicy split_policy_ = v1::PER_MICRO_BATCH;
  RankLayout ranks_;
  ModelDims dims_;
  StageLayout layout_;
  LengthPolicy policy_;
  std::vector<MethodSplit> splits_;
  std::vector<bool> lone_;  // [mini-batch position]: LoneSamples
  std::map<Recompute, std::unique_ptr<absl::StatusOr<MicroBatchCostModel>>> cost_models_;
  std::map<Recompute, std::unique_ptr<absl::StatusOr<MicroBatchCostModel>>> profiled_models_;
  // Context parallelism: split micro-batches' costs, per mode.
  std::map<Recompute, std::unique_ptr<absl::StatusOr<ContextSplitCostModel>>> split_models_;
  std::map<Recompute, std::unique_ptr<absl::StatusOr<ContextSplitCostModel>>>
      profiled_split_models_;
  std::vector<DeviceUpdateCost> updates_;  // per pipeline device, profiled
  std::vector<Candidate> candidates_;
  std::map<std::tuple<const MicroBatchingResult*, int, uint32_t, bool>,
           std::unique_ptr<PairStageCosts>>
      pair_costs_;
  mutable absl::Mutex orders_mu_;
  mutable std::map<std::pair<const PairStageCosts*, uint32_t>,
                   std::shared_ptr<const absl::StatusOr<AdaptiveOrders>>>
      adaptive_orders_ ABSL_GUARDED_BY(orders_mu_);
  Clock::time_point start_ = Clock::now();
  double micro_batching_ms_ = 0;
  double scheduling_ms_ = 0;
  double plan_building_ms_ = 0;
  double validation_ms_ = 0;
};

absl::Status Search::Init() {
  if (mini_batch_.sample_ids.size() != mini_batch_.lengths.size()) {
    return absl::InvalidArgumentError("mini-batch: sample ids and lengths differ in number");
  }
  p_ = c_.parallelism().pipeline();
  dp_ = c_.parallelism().data();
  ranks_ = RankLayout::Of(c_.parallelism());
  dims_ = ModelDimsFromConfig(c_.model());
  absl::StatusOr<StageLayout> layout = JobStageLayout(c_);
  if (!layout.ok()) return layout.status();
  layout_ = *layout;
  policy_ = {.encoder_decoder = dims_.encoder_decoder(),
             .multiple = c_.planner().length_multiple(),
             .max_input = c_.data().max_sequence_length(),
             .max_target = dims_.encoder_decoder() ? c_.data().max_target_length() : 0};
  // Raw bytes per stage for schedules and the simulator.
  for (int mode_value : c_.planner().recompute_modes()) {
    const Recompute mode = RecomputeFromProto(static_cast<v1::RecomputeMode>(mode_value));
    cost_models_[mode] = std::make_unique<absl::StatusOr<MicroBatchCostModel>>(
        MicroBatchCostModel::Create(model_, layout_, mode, c_.parallelism().tensor()));
    profiled_models_[mode] = std::make_unique<absl::StatusOr<MicroBatchCostModel>>(
        MicroBatchCostModel::Create(profiled_, layout_, mode, c_.parallelism().tensor()));
  }
  updates_ = DeviceUpdateCosts(profiled_, layout_, c_);
  lanes_ = ranks_.context;
  split_policy_ = c_.parallelism().context_split() == v1::CONTEXT_SPLIT_POLICY_UNSPECIFIED
                      ? v1::PER_MICRO_BATCH
                      : c_.parallelism().context_split();
  if (lanes_ > 1) {
    // A group that spans nodes waits for its slowest ring step: the
    // inter-node link's.
    ContextSplitOptions split_options;
    split_options.spans_nodes = ContextGroupSpansNodes(ranks_, c_.cluster().devices_per_node());
    split_options.ideal = options_.ideal_context_split;
    split_options.link = split_options.spans_nodes
                             ? MakeLink(c_.cluster().inter_node_latency_us(),
                                        c_.cluster().inter_node_bandwidth_gbps())
                             : MakeLink(c_.cluster().intra_node_latency_us(),
                                        c_.cluster().intra_node_bandwidth_gbps());
    if (absl::StatusOr<Hardware> hardware = HardwarePreset(c_.cluster().hardware());
        hardware.ok()) {
      split_options.hardware = *hardware;
    }
    const auto create = [&](const absl::StatusOr<MicroBatchCostModel>& whole,
                            const CostModel& model) {
      if (!whole.ok()) {
        return std::make_unique<absl::StatusOr<ContextSplitCostModel>>(whole.status());
      }
      return std::make_unique<absl::StatusOr<ContextSplitCostModel>>(
          ContextSplitCostModel::Create(*whole, model, dims_, lanes_, split_options));
    };
    for (const auto& [mode, whole] : cost_models_) split_models_[mode] = create(*whole, model_);
    for (const auto& [mode, whole] : profiled_models_) {
      profiled_split_models_[mode] = create(*whole, profiled_);
    }
  }
  return absl::OkStatus();
}

// Lone samples, positions ascending: those whose micro-batch of one, under
// the job's least recomputing mode,
//  - does not fit one device (lane) whole (exceeds a stage's room) but
//    fits split under some mode (context parallelism, not NEVER), or
//  - does not fit whole, or fits only beyond the pipeline-depth budget
//    (stored bytes above room / p: nothing else fits in flight beside it),
//    but fits whole under a more recomputing mode, within that budget where
//    it fitted before (planner.uniform_recompute false).
// Judged at the least recomputation, so that one long sample does not
// force every micro-batch of the iteration into more recomputation (its
// micro-batching would otherwise reject or stall under the cheaper modes):
// alone in its micro-batch, split or under its own mode (CostSplits,
// CostStages), it leaves them open, and the search still compares every
// mode. The first kind also goes to `split_only`.
std::vector<uint32_t> Search::LoneSamples(const std::vector<double>& room,
                                          std::vector<uint32_t>* split_only) {
  std::vector<uint32_t> out;
  lone_.assign(mini_batch_.lengths.size(), false);
  const bool can_split = lanes_ > 1 && split_policy_ != v1::NEVER;
  const bool can_raise = !c_.planner().uniform_recompute();
  if ((!can_split && !can_raise) || room.empty()) return out;
  std::vector<StageOpCost> stage_costs;
  for (uint32_t i = 0; i < mini_batch_.lengths.size(); ++i) {
    const uint32_t length = SequenceLength(mini_batch_.lengths[i], policy_);
    // Over the data limits: the micro-batching names it (or truncates it).
    if (length == 0 || (policy_.max_input > 0 && length > policy_.max_input) ||
        (policy_.max_target > 0 && mini_batch_.lengths[i].target > policy_.max_target)) {
      continue;
    }
    const double labelled =
        static_cast<double>(LossTokens(mini_batch_.lengths[i], dims_.encoder_decoder()));
    MicroBatchGroup alone_group;  // its micro-batch of one, padded as the partition pads it
    alone_group.samples = {i};
    PadToLongest(mini_batch_.lengths, policy_, alone_group);
    // Under the least recomputing mode: whether it fits a device whole,
    // and within the pipeline-depth budget.
    bool whole = false;
    bool within_depth = false;
    // Under a later mode whole (with more room than before), or split.
    bool alone = false;
    bool split = false;
    bool least_mode = true;  // cost_models_ is ordered by recomputation
    for (const auto& [mode, model] : cost_models_) {
      if (!model->ok()) continue;
      if ((least_mode || can_raise) &&
          (*model)->EvaluateStages(1, alone_group.input_len, alone_group.target_len, nullptr,
                                   labelled, 1, dims_.hidden, dims_.dtype_bytes, &stage_costs)) {
        if (least_mode) {
          whole = FitsAlone(stage_costs, room, false);
          within_depth = FitsAlone(stage_costs, room, true);
        } else if (FitsAlone(stage_costs, room, /*depth=*/whole)) {
          // A sample that fits the device only beyond the pipeline-depth
          // budget stalls the pipeline under the least mode (nothing else
          // fits beside it): alone, it may take a later mode.
          alone = true;
        }
      }
      least_mode = false;
      if (!can_split) continue;
      const absl::StatusOr<ContextSplitCostModel>& splitter = *split_models_.at(mode);
      if (!whole && splitter.ok() &&
          splitter->EvaluateStages({length}, labelled, 1, dims_.hidden, dims_.dtype_bytes,
                                   &stage_costs) &&
          FitsAlone(stage_costs, room, false)) {
        alone = true;
        split = true;
      }
    }
    if (!within_depth && alone) {
      out.push_back(i);
      lone_[i] = true;
      if (split && split_only != nullptr) split_only->push_back(i);
    }
  }
  return out;
}

// The micro-batching of the mini-batch without the lone samples
// (`kept`: the others' positions, ascending; `result` indexes them) as a
// result over the whole mini-batch: positions mapped back, and every pair
// that has groups gets one more per lone sample (LoneSamples: a
// micro-batch of its own, which fits only split or only under more
// recomputation), its replicas balanced again over all.
// With `result` null (nothing kept) every pair of the job is made of those
// alone.
MicroBatchingResult Search::WithLoneSamples(const MicroBatchingResult* result,
                                            std::span<const uint32_t> kept,
                                            std::span<const uint32_t> lone,
                                            const std::vector<double>& room,
                                            const MicroBatchingOptions& options) const {
  MicroBatchingResult out;
  if (result != nullptr) out = *result;
  out.samples.assign(mini_batch_.lengths.begin(), mini_batch_.lengths.end());
  for (size_t j = 0; j < kept.size() && result != nullptr; ++j) {
    out.samples[kept[j]] = result->samples[j];
  }
  const auto remap = [&](std::vector<uint32_t>& positions) {
    for (uint32_t& p : positions) p = kept[p];
  };
  remap(out.truncated);
  remap(out.order);
  for (std::vector<uint32_t>& row : out.packed_rows) remap(row);
  for (uint32_t i : lone) out.order.push_back(i);
  if (result == nullptr) {
    out.available_per_device = room;
    out.available_activation_bytes = *std::min_element(room.begin(), room.end());
    for (Recompute mode : options.recompute_modes) {
      for (MemoryBudget budget : options.budgets) {
        MicroBatchingCandidate c;
        c.recompute = mode;
        c.budget = budget;
        c.stored_limit_bytes = out.available_activation_bytes;
        c.peak_limit_bytes = out.available_activation_bytes;
        out.candidates.push_back(std::move(c));
      }
    }
    out.chosen = 0;
    out.reason = "every sample fits one device only split or under more recomputation";
  }
  for (MicroBatchingCandidate& c : out.candidates) {
    if (!c.solved()) continue;
    for (MicroBatchGroup& g : c.groups) remap(g.samples);
    for (uint32_t i : lone) {
      MicroBatchGroup g;
      g.samples = {i};
      PadToLongest(out.samples, policy_, g);
      // Its time for the replicas' balance: under the first mode from the
      // pair's on whose micro-batch of one fits a device whole, as
      // CostStages raises it (else the first the model prices; a split
      // one's time is not known here).
      const double labelled =
          static_cast<double>(LossTokens(out.samples[i], dims_.encoder_decoder()));
      MicroBatchCost cost;
      bool priced = false;
      std::vector<StageOpCost> stage_costs;
      for (const auto& [mode, model] : cost_models_) {
        if (mode < c.recompute || !model->ok()) continue;
        MicroBatchCost under;
        if (!(*model)->Evaluate(1, g.input_len, g.target_len, nullptr, labelled, &under)) continue;
        if (!priced) cost = under;
        priced = true;
        if (c_.planner().uniform_recompute()) break;
        if ((*model)->EvaluateStages(1, g.input_len, g.target_len, nullptr, labelled, 1,
                                     dims_.hidden, dims_.dtype_bytes, &stage_costs) &&
            FitsAlone(stage_costs, room, false)) {
          cost = under;
          break;
        }
      }
      c.groups.push_back(std::move(g));
      c.costs.push_back(cost);
    }
    std::vector<double> times;
    for (const MicroBatchCost& cost : c.costs) times.push_back(cost.time_ms);
    c.replicas = BalanceReplicas(times, dp_);
    c.padding = ComputePaddingStats(out.samples, c.groups, policy_);
  }
  if (out.chosen >= 0 && out.chosen < static_cast<int>(out.candidates.size())) {
    out.replicas = out.candidates[out.chosen].replicas;
    out.padding = out.candidates[out.chosen].padding;
  }
  return out;
}

// Phase 1: one PlanMicroBatches per partition method over every (mode,
// budget) pair: shared run tables and cross-pair bound. With context
// parallelism, samples that fit one lane only split, and without
// uniform_recompute those that fit only under more recomputation, are kept
// out of it and become micro-batches of their own (LoneSamples).
void Search::MicroBatch() {
  std::vector<uint32_t> lone;
  // The samples one recompute mode per iteration keeps out (those that
  // fit one lane only split): a subset of `lone`.
  std::vector<uint32_t> split_only;
  std::vector<double> room;
  if ((lanes_ > 1 && split_policy_ != v1::NEVER) || !c_.planner().uniform_recompute()) {
    absl::StatusOr<std::vector<double>> rooms = AvailableActivationBytesPerDevice(
        model_, layout_, static_cast<ZeroStage>(std::min(c_.training().zero_stage(), 3u)),
        dp_ * lanes_, static_cast<double>(c_.cluster().device_memory_limit_mib()) * (1 << 20));
    if (rooms.ok()) {
      room = *std::move(rooms);
      // The room the partition and the stage costs judge by.
      if (!options_.per_device_memory) {
        std::fill(room.begin(), room.end(), *std::min_element(room.begin(), room.end()));
      }
      lone = LoneSamples(room, &split_only);
    }
  }
  // One partition of the mini-batch by `split`'s method and setting, the
  // samples `apart` (ascending) kept out of it as micro-batches of their
  // own.
  const auto partition = [&](MethodSplit& split, const std::vector<uint32_t>& apart) {
    const Clock::time_point t = Clock::now();
    if (apart.empty()) {
      split.result = PlanMicroBatches(mini_batch_.lengths, model_, split.options);
    } else {
      std::vector<uint32_t> kept;
      std::vector<SampleLengths> kept_lengths;
      std::vector<uint64_t> kept_ids;
      for (uint32_t i = 0, k = 0; i < mini_batch_.lengths.size(); ++i) {
        if (k < apart.size() && apart[k] == i) {
          ++k;
          continue;
        }
        kept.push_back(i);
        kept_lengths.push_back(mini_batch_.lengths[i]);
        kept_ids.push_back(mini_batch_.sample_ids[i]);
      }
      // Every pair solved (a pruned pair's later solve would index the
      // kept samples only).
      MicroBatchingOptions options = split.options;
      options.share_bound = false;
      options.sample_ids = kept_ids;
      absl::StatusOr<MicroBatchingResult> kept_result =
          kept.empty() ? absl::StatusOr<MicroBatchingResult>(MicroBatchingResult())
                       : PlanMicroBatches(kept_lengths, model_, options);
      if (kept_result.ok()) {
        split.result = WithLoneSamples(kept.empty() ? nullptr : &*kept_result, kept, apart, room,
                                       split.options);
      } else {
        split.result = kept_result.status();
      }
    }
    split.ms = MsSince(t);
    micro_batching_ms_ += split.ms;
  };
  for (int method_value : c_.planner().partition_methods()) {
    const PartitionMethod method =
        PartitionMethodFromProto(static_cast<v1::PartitionMethod>(method_value));
    for (const BaselineSetting& setting : BaselineSettings(c_, method)) {
      MethodSplit split;
      split.method = method;
      split.setting = setting;
      split.options = MicroBatchingOptionsFromConfig(c_, method);
      setting.ApplyTo(split.options);
      split.options.share_bound = options_.share_micro_batching_bound;
      split.options.per_device_memory = options_.per_device_memory;
      split.options.threads = options_.threads;
      split.options.fail_without_pair = false;  // each candidate reports its own pair
      split.options.sample_ids = mini_batch_.sample_ids;
      // With modes per micro-batch and lone samples, also the partition one
      // mode per iteration makes (only the split-only samples apart, every
      // micro-batch under the candidate's mode), so that the search keeps
      // every candidate that has: per-micro-batch modes never plan slower.
      if (!c_.planner().uniform_recompute() && !lone.empty()) {
        MethodSplit uniform = split;
        partition(uniform, split_only);
        splits_.push_back(std::move(uniform));
      }
      split.lone_kept_out = !lone.empty();
      partition(split, lone);
      splits_.push_back(std::move(split));
    }
  }
}

// Every (method, mode, schedule): the pair it needs, or why it has none.
namespace {

// Whether a baseline's whole-device pair of `mode` repeats its
// pipeline-depth pair: a baseline's groups do not depend on the budget, so
// they are the same whenever the pipeline-depth pair fits. (The DP's
// partitions differ per budget; whether they do is not known for a pair
// the shared bound pruned, so the DP always gets both.)
bool SameBaselinePartition(PartitionMethod method, const std::vector<MicroBatchingCandidate>& pairs,
                           Recompute mode) {
  if (method == PartitionMethod::kDynamicProgramming) return false;
  for (const MicroBatchingCandidate& depth : pairs) {
    if (depth.recompute == mode && depth.budget == MemoryBudget::kPipelineDepth) {
      return depth.status.ok();
    }
  }
  return false;
}

}  // namespace

void Search::EnumerateCandidates() {
  for (MethodSplit& split : splits_) {
    for (int mode_value : c_.planner().recompute_modes()) {
      const Recompute mode = RecomputeFromProto(static_cast<v1::RecomputeMode>(mode_value));
      for (int schedule_value : c_.planner().schedules()) {
        const v1::ScheduleKind schedule = static_cast<v1::ScheduleKind>(schedule_value);
        const bool adaptive = schedule == v1::ADAPTIVE || schedule == v1::ADAPTIVE_ZERO_BUBBLE;
        // Adaptive schedules hold as many micro-batches as fit: the
        // whole-device partition. Static ones take the pipeline-depth
        // partition (each micro-batch within room / depth), and also the
        // whole-device one where it differs, whose larger micro-batches may
        // still fit beside smaller ones: the simulated peak of each device
        // decides (Judge).
        for (MemoryBudget budget :
             adaptive ? std::vector{MemoryBudget::kWholeDevice}
                      : std::vector{MemoryBudget::kPipelineDepth, MemoryBudget::kWholeDevice}) {
          Candidate cand;
          cand.method = split.method;
          cand.recompute = mode;
          cand.schedule = schedule;
          cand.chunks = schedule == v1::INTERLEAVED_1F1B ? c_.parallelism().virtual_chunks() : 1;
          cand.report.partition_method = PartitionMethodName(split.method);
          cand.report.setting = split.setting.Describe();
          cand.report.schedule = ScheduleName(schedule);
          cand.report.recompute = RecomputeName(mode);
          cand.report.budget =
              budget == MemoryBudget::kPipelineDepth ? "pipeline-depth" : "whole-device";
          if (!split.result.ok()) {
            if (budget == MemoryBudget::kWholeDevice && !adaptive) continue;
            cand.Reject("micro-batching", std::string(split.result.status().message()));
          } else {
            cand.micro_batching = &*split.result;
            cand.lone_kept_out = split.lone_kept_out;
            const std::vector<MicroBatchingCandidate>& pairs = split.result->candidates;
            for (size_t k = 0; k < pairs.size(); ++k) {
              if (pairs[k].recompute == mode && pairs[k].budget == budget) cand.pair = k;
            }
            // The extra partition of a static schedule only where it exists
            // and may differ from the pipeline-depth one.
            if (budget == MemoryBudget::kWholeDevice && !adaptive &&
                (cand.pair < 0 || SameBaselinePartition(split.method, pairs, mode))) {
              continue;
            }
          }
          // Lone samples' micro-batches under their own modes both ways:
          // raised only until they fit, and until they fit the
          // pipeline-depth budget (nothing else may fit beside a long
          // micro-batch that keeps most of a device); the simulation
          // decides.
          // Their reports' settings say which ("lone", "lone+depth").
          if (cand.lone_kept_out && !c_.planner().uniform_recompute()) {
            const std::string setting = cand.report.setting;
            const auto named = [&setting](const char* way) {
              return absl::StrCat(setting, setting.empty() ? "" : " ", way);
            };
            Candidate raised = cand;
            raised.raise_to_depth = true;
            raised.report.setting = named("lone+depth");
            candidates_.push_back(std::move(raised));
            cand.report.setting = named("lone");
          }
          candidates_.push_back(std::move(cand));
        }
      }
    }
  }
}

absl::StatusOr<DeviceOrder> Search::StaticOrder(v1::ScheduleKind schedule,
                                                const PipelineShape& shape) const {
  switch (schedule) {
    case v1::GPIPE:
      return GpipeSchedule(shape);
    case v1::ONE_F_ONE_B:
      return OneFOneBSchedule(shape);
    case v1::INTERLEAVED_1F1B:
      return InterleavedOneFOneBSchedule(shape);
    case v1::KFKB:
      return KfkbSchedule(shape, c_.planner().kfkb_k());
    case v1::ZERO_BUBBLE_H1:
      return ZeroBubbleH1Schedule(shape);
    default:
      return absl::InvalidArgumentError("unknown schedule");
  }
}

// Phase 2 for one replica: stage costs, schedule, simulation.
ReplicaTimeline Search::ScheduleReplica(const Candidate& cand, uint32_t r) const {
  ReplicaTimeline out;
  const MicroBatchingCandidate& split = cand.split();
  const std::vector<uint32_t>& mine = split.replicas.replicas[r];
  if (mine.empty()) {
    out.error = absl::StrCat("data-parallel replica ", r, " gets no micro-batch (",
                             split.groups.size(), " micro-batches for ", dp_, " replicas)");
    out.starved = true;
    return out;
  }
  const PairStageCosts& pair = *cand.stage_costs;
  if (!pair.error.empty()) {
    out.error = pair.error;
    return out;
  }
  out.shape = {p_, cand.chunks, static_cast<uint32_t>(mine.size())};
  StageCostTable costs(out.shape.stages(), std::vector<StageOpCost>(mine.size()));
  std::vector<double> times(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    for (uint32_t s = 0; s < out.shape.stages(); ++s) costs[s][k] = pair.groups[mine[k]][s];
    times[k] = split.costs[mine[k]].time_ms;
  }
  // Measured point-to-point costs (varipipe-profile) replace the config's
  // intra-node link. Devices are global ranks (tensor index 0 of each plan
  // rank; its tensor group's other ranks send alike), t apart per stage.
  const std::optional<CommunicationCosts>& measured = model_.communication();
  const ClusterNetwork network{
      .devices_per_node = c_.cluster().devices_per_node(),
      .first_device = static_cast<uint32_t>(ranks_.GlobalRank(ranks_.Rank(r, 0), 0)),
      .intra_node = measured.has_value() ? measured->p2p
                                         : MakeLink(c_.cluster().intra_node_latency_us(),
                                                    c_.cluster().intra_node_bandwidth_gbps()),
      .inter_node =
          MakeLink(c_.cluster().inter_node_latency_us(), c_.cluster().inter_node_bandwidth_gbps()),
      .stride = ranks_.tensor};
  if (lanes_ > 1) {
    ScheduleLanes(cand, r, network, out);
    return out;
  }
  if (cand.schedule == v1::ADAPTIVE || cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE) {
    const std::shared_ptr<const absl::StatusOr<AdaptiveOrders>> orders =
        AdaptiveOrdersOf(cand, r, out.shape, costs, times);
    if (!orders->ok()) {
      out.error = std::string(orders->status().message());
      return out;
    }
    absl::StatusOr<AdaptiveSearchResult> searched =
        SearchAdaptiveOrder(out.shape, costs, **orders, cand.micro_batching->available_per_device,
                            network, cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE);
    if (!searched.ok()) {
      out.error = std::string(searched.status().message());
      return out;
    }
    out.order = std::move(searched->order);
    out.sim = std::move(searched->simulation);
    out.costs = std::move(costs);
    return out;
  }
  absl::StatusOr<DeviceOrder> order = StaticOrder(cand.schedule, out.shape);
  if (!order.ok()) {
    out.error = std::string(order.status().message());
    return out;
  }
  out.order = *std::move(order);
  out.sim = Simulate(out.shape, out.order, costs, network);
  if (!out.sim.completed)
    out.error = absl::StrCat("schedule does not complete: ", out.sim.deadlock);
  out.costs = std::move(costs);
  return out;
}

// Context parallelism (context_placement.h, lane_projection.h): the
// replica's micro-batches as each runs (split: the slowest lane's split
// costs), the slot pipeline scheduled once with the candidate's schedule
// (slot costs: the largest of the slot's micro-batches'), projected onto
// every lane and the lanes simulated together (simulator.h, SimulateLanes).
// Every placement variant of the replica is scheduled and simulated; the
// shortest makespan whose lanes fit their rooms wins (ties and nothing
// fitting: the earliest variant, the policy's own choice).
void Search::ScheduleLanes(const Candidate& cand, uint32_t r, const ClusterNetwork& lane0,
                           ReplicaTimeline& out) const {
  const std::vector<LanePlacement>& variants = cand.stage_costs->placements[r];
  const std::vector<double>& room = cand.micro_batching->available_per_device;
  const auto fits = [&](const ReplicaTimeline& t) {
    for (const SimulationResult& lane : t.lanes.lanes) {
      for (uint32_t d = 0; d < p_ && d < room.size(); ++d) {
        if (lane.peak_bytes[d] > room[d]) return false;
      }
    }
    return true;
  };
  bool best_fits = false;
  for (uint32_t v = 0; v < variants.size(); ++v) {
    ReplicaTimeline t;
    t.shape = out.shape;
    ScheduleVariant(cand, r, v, lane0, t);
    const bool t_fits = t.error.empty() && fits(t);
    if (v == 0 || (t_fits && (!best_fits || t.lanes.makespan_ms < out.lanes.makespan_ms))) {
      best_fits = t_fits;
      out = std::move(t);
    }
  }
}

void Search::ScheduleVariant(const Candidate& cand, uint32_t r, uint32_t variant,
                             const ClusterNetwork& lane0, ReplicaTimeline& out) const {
  const PairStageCosts& pair = *cand.stage_costs;
  const std::vector<uint32_t>& mine = cand.split().replicas.replicas[r];
  const LanePlacement& placement = pair.placements[r][variant];
  const uint32_t stages = out.shape.stages();
  StageCostTable costs(stages, std::vector<StageOpCost>(mine.size()));
  for (size_t k = 0; k < mine.size(); ++k) {
    const std::vector<StageOpCost>& ops =
        placement.split[k] ? pair.split_groups[mine[k]] : pair.groups[mine[k]];
    for (uint32_t s = 0; s < stages; ++s) costs[s][k] = ops[s];
  }
  const PipelineShape slot_shape{p_, cand.chunks, static_cast<uint32_t>(placement.slots.size())};
  const StageCostTable slot_costs = SlotCosts(costs, placement.slots);
  DeviceOrder slot_order;
  if (cand.schedule == v1::ADAPTIVE || cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE) {
    std::vector<double> times(placement.slots.size(), 0);
    for (size_t i = 0; i < times.size(); ++i) {
      for (uint32_t s = 0; s < stages; ++s) {
        times[i] += slot_costs[s][i].forward_ms + slot_costs[s][i].backward_ms;
      }
    }
    const std::shared_ptr<const absl::StatusOr<AdaptiveOrders>> orders =
        AdaptiveOrdersOf(cand, r * 3 + variant + 1, slot_shape, slot_costs, times);
    if (!orders->ok()) {
      out.error = std::string(orders->status().message());
      return;
    }
    ClusterNetwork slots_network = lane0;  // as lane 0 sits
    slots_network.stride = lanes_ * ranks_.tensor;
    absl::StatusOr<AdaptiveSearchResult> searched = SearchAdaptiveOrder(
        slot_shape, slot_costs, **orders, cand.micro_batching->available_per_device, slots_network,
        cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE);
    if (!searched.ok()) {
      out.error = std::string(searched.status().message());
      return;
    }
    slot_order = std::move(searched->order);
  } else {
    absl::StatusOr<DeviceOrder> order = StaticOrder(cand.schedule, slot_shape);
    if (!order.ok()) {
      out.error = std::string(order.status().message());
      return;
    }
    slot_order = *std::move(order);
  }
  LanePipelines lanes;
  lanes.shape = out.shape;
  lanes.split = placement.split;
  for (uint32_t k = 0; k < lanes_; ++k) {
    lanes.orders.push_back(ProjectOntoLane(slot_order, placement.slots, k));
    lanes.costs.push_back(costs);
    ClusterNetwork network = lane0;
    network.first_device = static_cast<uint32_t>(ranks_.GlobalRank(ranks_.Rank(r, 0, k), 0));
    network.stride = lanes_ * ranks_.tensor;
    lanes.networks.push_back(network);
  }
  out.lanes = SimulateLanes(lanes);
  if (!out.lanes.completed) {
    out.error = absl::StrCat("the lanes' schedule does not complete: ", out.lanes.deadlock);
    return;
  }
  out.sim = out.lanes.lanes[0];
  out.order = std::move(slot_order);
  out.lane_orders = std::move(lanes.orders);
  out.placement = placement;
  out.costs = std::move(costs);
}

std::shared_ptr<const absl::StatusOr<AdaptiveOrders>> Search::AdaptiveOrdersOf(
    const Candidate& cand, uint32_t r, const PipelineShape& shape, const StageCostTable& costs,
    std::span<const double> times) const {
  const auto key = std::make_pair(cand.stage_costs, r);
  {
    absl::MutexLock lock(&orders_mu_);
    if (const auto it = adaptive_orders_.find(key); it != adaptive_orders_.end()) return it->second;
  }
  // Built outside the lock; a candidate that built the same orders
  // meanwhile wins (they are equal).
  auto built = std::make_shared<const absl::StatusOr<AdaptiveOrders>>(
      BuildAdaptiveOrders(shape, costs, times, cand.micro_batching->available_per_device));
  absl::MutexLock lock(&orders_mu_);
  return adaptive_orders_.emplace(key, std::move(built)).first->second;
}

void Search::CostStages(std::span<const size_t> ready) {
  std::vector<std::pair<PairStageCosts*, const Candidate*>> todo;
  for (size_t k : ready) {
    Candidate& cand = candidates_[k];
    // A baseline's pairs of one recompute mode share its groups (only the
    // limits differ), hence their stage costs; the DP's differ per pair.
    const int pair = cand.method == PartitionMethod::kDynamicProgramming
                         ? cand.pair
                         : -1 - static_cast<int>(cand.recompute);
    std::unique_ptr<PairStageCosts>& slot =
        pair_costs_[std::make_tuple(static_cast<const MicroBatchingResult*>(cand.micro_batching),
                                    pair, cand.chunks, cand.raise_to_depth)];
    if (slot == nullptr) {
      slot = std::make_unique<PairStageCosts>();
      todo.emplace_back(slot.get(), &cand);
    }
    cand.stage_costs = slot.get();
  }
  ParallelFor(todo.size(), options_.threads, [&](size_t i) {
    PairStageCosts& out = *todo[i].first;
    const Candidate& cand = *todo[i].second;
    const std::vector<MicroBatchGroup>& groups = cand.split().groups;
    const uint32_t stages = p_ * cand.chunks;
    const std::vector<double>& room = cand.micro_batching->available_per_device;
    out.groups.resize(groups.size());
    out.whole_modes.assign(groups.size(), cand.recompute);
    std::vector<StageOpCost> stage_costs;
    for (size_t g = 0; g < groups.size(); ++g) {
      const MicroBatchGroup& group = groups[g];
      const std::optional<PackedSamples> packed = PerSampleRows(group, *cand.micro_batching);
      // The head on the group's labelled tokens, as the micro-batching
      // priced it.
      const double labelled = static_cast<double>(
          LabelledTokens(group, cand.micro_batching->samples, dims_.encoder_decoder()));
      const auto price = [&](Recompute mode, std::vector<StageOpCost>* ops) {
        if (!(*cost_models_.at(mode))
                 ->EvaluateStages(static_cast<uint32_t>(group.size()), group.input_len,
                                  group.target_len, packed ? &*packed : nullptr, labelled,
                                  cand.chunks, dims_.hidden, dims_.dtype_bytes, &stage_costs)) {
          return false;
        }
        ops->resize(stages);
        for (uint32_t s = 0; s < stages; ++s) {
          (*ops)[s] = stage_costs[s];
          BackwardSplitRule(dims_).Split(StageLayersOf(s, stages, group), &(*ops)[s]);
        }
        return true;
      };
      if (!PriceUnderItsMode(cand, IsLoneGroup(cand, group), room, price, &out.groups[g],
                             &out.whole_modes[g])) {
        out.error = "a micro-batch lies beyond the cost model";
        return;
      }
    }
    if (lanes_ > 1) CostSplits(cand, out);
  });
}

// Per group: the samples' sequences split over the lanes, priced on the
// slowest lane (context_split_cost.h), and whether each way fits a lane's
// room on every stage (the peak of the micro-batch alone; the simulation
// then checks what is in flight). Per replica: the split/whole choice of
// parallelism.context_split and the lanes (context_placement.h).
void Search::CostSplits(const Candidate& cand, PairStageCosts& out) const {
  const MicroBatchingResult& mbr = *cand.micro_batching;
  const std::vector<MicroBatchGroup>& groups = cand.split().groups;
  const uint32_t stages = p_ * cand.chunks;
  const absl::StatusOr<ContextSplitCostModel>& model = *split_models_.at(cand.recompute);
  const std::vector<double>& room = mbr.available_per_device;
  out.split_groups.assign(groups.size(), {});
  out.split_tokens.assign(groups.size(), 0);
  out.split_modes.assign(groups.size(), cand.recompute);
  std::vector<StageOpCost> stage_costs;
  for (size_t g = 0; g < groups.size() && model.ok() && split_policy_ != v1::NEVER; ++g) {
    const MicroBatchGroup& group = groups[g];
    std::vector<uint32_t> lengths;
    std::vector<int64_t> lengths64;
    for (uint32_t position : group.samples) {
      lengths.push_back(SequenceLength(mbr.samples[position], policy_));
      lengths64.push_back(lengths.back());
    }
    const absl::StatusOr<ContextParallelSplit> cut =
        ContextParallelSplit::Of(lengths64, static_cast<int>(lanes_), 0);
    if (!cut.ok()) continue;
    const double labelled =
        static_cast<double>(LabelledTokens(group, mbr.samples, dims_.encoder_decoder()));
    out.split_tokens[g] = static_cast<uint32_t>(cut->all_gather_count());
    MicroBatchGroup row;  // as the split runs: one row of A tokens
    row.samples = {0};
    row.input_len = out.split_tokens[g];
    const auto price = [&](Recompute mode, std::vector<StageOpCost>* ops) {
      const absl::StatusOr<ContextSplitCostModel>& splitter = *split_models_.at(mode);
      if (!splitter.ok() ||
          !splitter->EvaluateStages(lengths, labelled, cand.chunks, dims_.hidden, dims_.dtype_bytes,
                                    &stage_costs) ||
          stage_costs.size() != stages) {
        return false;
      }
      ops->resize(stages);
      for (uint32_t s = 0; s < stages; ++s) {
        (*ops)[s] = stage_costs[s];
        BackwardSplitRule(dims_).Split(StageLayersOf(s, stages, row), &(*ops)[s]);
      }
      return true;
    };
    (void)PriceUnderItsMode(cand, IsLoneGroup(cand, group), room, price, &out.split_groups[g],
                            &out.split_modes[g]);
  }
  const auto fits = [&](const std::vector<StageOpCost>& ops) {
    return FitsAlone(ops, room, false);
  };
  const auto total_ms = [&](const std::vector<StageOpCost>& ops) {
    double ms = 0;
    for (const StageOpCost& op : ops) ms += op.forward_ms + op.backward_ms;
    return ms;
  };
  for (uint32_t r = 0; r < dp_; ++r) {
    const std::vector<uint32_t>& mine = cand.split().replicas.replicas[r];
    std::vector<SplitOption> options;
    for (uint32_t g : mine) {
      options.push_back({.fits_whole = fits(out.groups[g]),
                         .fits_split = fits(out.split_groups[g]),
                         .whole_ms = total_ms(out.groups[g]),
                         .split_ms = total_ms(out.split_groups[g])});
    }
    std::vector<bool> split;
    std::string why;
    out.placements.emplace_back();
    if (!ChooseSplits(split_policy_, options, lanes_, p_, &split, &why)) {
      if (out.error.empty()) {
        out.error =
            absl::StrCat("data-parallel replica ", r, ": ", why,
                         model.ok() ? "" : absl::StrCat(" (", model.status().message(), ")"));
      }
      continue;
    }
    std::vector<std::vector<bool>> variants = {split};
    if (split_policy_ == v1::PER_MICRO_BATCH) {
      std::vector<bool> all(options.size());
      std::vector<bool> fewest(options.size());
      for (size_t k = 0; k < options.size(); ++k) {
        all[k] = options[k].fits_split || !options[k].fits_whole;
        fewest[k] = !options[k].fits_whole;
      }
      for (std::vector<bool>& v : {std::ref(all), std::ref(fewest)}) {
        if (std::find(variants.begin(), variants.end(), v) == variants.end()) {
          variants.push_back(std::move(v));
        }
      }
    }
    std::vector<double> whole_ms;
    std::vector<double> split_ms;
    for (const SplitOption& o : options) {
      whole_ms.push_back(o.whole_ms);
      split_ms.push_back(o.split_ms);
    }
    const std::unique_ptr<bool[]> flags(new bool[options.size()]);
    for (const std::vector<bool>& v : variants) {
      for (size_t k = 0; k < v.size(); ++k) flags[k] = v[k];
      out.placements.back().push_back(
          PlaceOnLanes(std::span<const bool>(flags.get(), v.size()), whole_ms, split_ms, lanes_));
    }
  }
}

// The larger of two bounds, per replica and device d:
// - time: d starts no earlier than the cheapest micro-batch's forward
//   through the stages before d (the first micro-batch's under a static
//   schedule, which always starts with it), runs all of its operations one
//   at a time, and (without split backwards, whose last operation may be a
//   weight gradient) is followed by the cheapest micro-batch's backward
//   through the stages before d;
// - memory: each micro-batch holds its stored bytes on d at least from its
//   forward on d to the end of its backward (input gradient) on d, which
//   spans its forwards and backwards on d and every later stage, and
//   while one of its operations runs on d that operation's transient (peak
//   - stored) as well. In a plan that fits, what d holds never exceeds its
//   room, so the makespan is at least (sum(stored x held time) +
//   sum(transient x duration)) / room. This is what makes the recompute
//   modes that keep many bytes, whose schedules serialise under a tight
//   room, cheap to rule out.
// Communication only adds to both.
double Search::MakespanLowerBound(const Candidate& cand) const {
  const PairStageCosts& pair = *cand.stage_costs;
  if (!pair.error.empty()) return 0;
  if (lanes_ > 1) {
    // Context parallelism: each lane's device runs every split micro-batch
    // and its own whole ones one at a time.
    const uint32_t stages = p_ * cand.chunks;
    double bound = 0;
    // The replica's bound is its best variant's.
    for (uint32_t r = 0; r < dp_ && r < pair.placements.size(); ++r) {
      double replica_bound = std::numeric_limits<double>::infinity();
      for (const LanePlacement& placement : pair.placements[r]) {
        const std::vector<uint32_t>& mine = cand.split().replicas.replicas[r];
        std::vector<double> busy(static_cast<size_t>(lanes_) * p_, 0);
        for (size_t k = 0; k < mine.size() && k < placement.split.size(); ++k) {
          const bool split = placement.split[k];
          const std::vector<StageOpCost>& ops =
              split ? pair.split_groups[mine[k]] : pair.groups[mine[k]];
          for (uint32_t lane = 0; lane < lanes_; ++lane) {
            if (!split && placement.lane[k] != lane) continue;
            for (uint32_t s = 0; s < stages && s < ops.size(); ++s) {
              busy[lane * p_ + s % p_] += ops[s].forward_ms + ops[s].backward_ms;
            }
          }
        }
        replica_bound = std::min(replica_bound, *std::max_element(busy.begin(), busy.end()));
      }
      if (std::isfinite(replica_bound)) bound = std::max(bound, replica_bound);
    }
    return bound;
  }
  const bool split_backward =
      cand.schedule == v1::ZERO_BUBBLE_H1 || cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE;
  const bool adaptive = cand.schedule == v1::ADAPTIVE || cand.schedule == v1::ADAPTIVE_ZERO_BUBBLE;
  const uint32_t stages = p_ * cand.chunks;
  const std::vector<double>& room = cand.micro_batching->available_per_device;
  double bound = 0;
  for (const std::vector<uint32_t>& mine : cand.split().replicas.replicas) {
    if (mine.empty()) continue;
    std::vector<double> busy(p_, 0);
    std::vector<double> area(p_, 0);  // bytes x ms
    std::vector<double> fill(p_, std::numeric_limits<double>::infinity());
    std::vector<double> drain(p_, std::numeric_limits<double>::infinity());
    for (uint32_t g : mine) {
      const std::vector<StageOpCost>& ops = pair.groups[g];
      double forward_before = 0;
      double backward_before = 0;
      for (uint32_t s = 0; s < stages; ++s) {
        const StageOpCost& op = ops[s];
        if (s < p_) {
          if (adaptive || g == mine.front()) fill[s] = std::min(fill[s], forward_before);
          drain[s] = std::min(drain[s], backward_before);
        }
        forward_before += op.forward_ms;
        backward_before += op.backward_ms;
        busy[s % p_] += op.forward_ms + op.backward_ms;
      }
      double after = 0;  // forwards and input gradients of the later stages
      for (uint32_t s = stages; s-- > 0;) {
        const StageOpCost& op = ops[s];
        const double input_grad_ms =
            split_backward ? op.backward_ms - op.weight_ms : op.backward_ms;
        after += op.forward_ms + input_grad_ms;
        // Its stored bytes from its forward to the end of its input
        // gradient; beside them, while its forward and input gradient run,
        // their transient (the simulator's peak - stored).
        area[s % p_] += op.stored_bytes * after +
                        (op.peak_bytes - op.stored_bytes) * (op.forward_ms + input_grad_ms);
      }
    }
    for (uint32_t d = 0; d < p_; ++d) {
      bound = std::max(bound, fill[d] + busy[d] + (split_backward ? 0 : drain[d]));
      if (d < room.size() && room[d] > 0) bound = std::max(bound, area[d] / room[d]);
    }
  }
  return bound;
}

// Makespan, bubbles and each device's peak against its own room.
void Search::Judge(Candidate& cand) const {
  cand.peak_per_rank.assign(static_cast<size_t>(ranks_.plan_ranks()), 0);
  double makespan = 0;
  double bubble = 0;
  cand.report.split_micro_batches = 0;
  for (uint32_t r = 0; r < dp_; ++r) {
    const ReplicaTimeline& t = cand.replicas[r];
    if (!t.error.empty()) {
      cand.starved = t.starved;
      return cand.Reject("scheduling", t.error);
    }
    makespan = std::max(makespan, t.sim.makespan_ms);
    // Each lane of the replica (one without context parallelism).
    const size_t lanes = lanes_ > 1 ? t.lanes.lanes.size() : 1;
    for (size_t k = 0; k < lanes; ++k) {
      const SimulationResult& sim = lanes_ > 1 ? t.lanes.lanes[k] : t.sim;
      bubble += sim.MeanBubbleFraction() / static_cast<double>(lanes);
      for (double busy : sim.busy_ms) {
        cand.report.busiest_device_ms = std::max(cand.report.busiest_device_ms, busy);
      }
      for (uint32_t d = 0; d < p_; ++d) {
        cand.peak_per_rank[ranks_.Rank(r, d, static_cast<uint32_t>(k))] = sim.peak_bytes[d];
      }
    }
    if (lanes_ > 1) cand.report.split_micro_batches += static_cast<int>(t.placement.split_count());
  }
  cand.report.makespan_ms = makespan;
  cand.report.bubble_fraction = bubble / dp_;
  cand.report.peak_bytes = *std::max_element(cand.peak_per_rank.begin(), cand.peak_per_rank.end());
  const std::vector<double> limits = RankLimits(*cand.micro_batching);
  for (size_t rank = 0; rank < limits.size(); ++rank) {
    if (cand.peak_per_rank[rank] > limits[rank]) {
      return cand.Reject(
          "memory", absl::StrFormat("simulated peak %.1f MiB on rank %d exceeds its %.1f MiB for "
                                    "activations (%+.1f%%)",
                                    MiB(cand.peak_per_rank[rank]), rank, MiB(limits[rank]),
                                    100 * (cand.peak_per_rank[rank] / limits[rank] - 1)));
    }
  }
  cand.report.feasible = true;
}

// Whether a candidate can be scheduled at all; otherwise it is rejected,
// saying why.
bool Search::Schedulable(Candidate& cand) {
  if (cand.micro_batching == nullptr) return false;  // rejected already
  if (cand.pair < 0) {
    cand.Reject("micro-batching", "the schedule's memory budget was not searched");
    return false;
  }
  const MicroBatchingCandidate& split = cand.split();
  cand.report.dp_objective_ms = split.objective_ms;
  if (!split.status.ok()) {
    cand.Reject("micro-batching", std::string(split.status.message()));
  } else if (split.pruned) {
    cand.Reject("micro-batching",
                absl::StrFormat("pruned: its micro-batching objective is at least %.2f ms, no "
                                "better than the best pair's",
                                split.objective_ms));
  } else if (dims_.encoder_decoder() && cand.chunks > 1) {
    cand.Reject("scheduling", "the interleaved schedule is not supported for T5 models");
  } else if (!dims_.encoder_decoder() && c_.parallelism().virtual_chunks() > 1 &&
             cand.chunks == 1) {
    // The executors build pipeline x virtual_chunks model stages (looped
    // placement); a plan over `pipeline` stages would leave some unrun.
    cand.Reject("scheduling",
                absl::StrCat("parallelism.virtual_chunks is ", c_.parallelism().virtual_chunks(),
                             ": the model is cut into ", p_ * c_.parallelism().virtual_chunks(),
                             " stages, which only INTERLEAVED_1F1B runs"));
  } else if (cand.chunks > 1 && dims_.encoder_layers < p_ * cand.chunks) {
    cand.Reject("scheduling", "too few layers for the virtual chunks");
  } else {
    cand.report.micro_batches = static_cast<int>(split.groups.size());
    cand.report.padding_efficiency = split.padding.Efficiency();
    cand.replicas.assign(dp_, ReplicaTimeline());
    return true;
  }
  return false;
}

// Phase 2: the candidates `which` whose pair has a partition, every
// (candidate, replica) an independent task on the planner's threads.
void Search::Schedule(std::span<const size_t> which) {
  const Clock::time_point t = Clock::now();
  std::vector<size_t> ready;
  for (size_t k : which) {
    if (Schedulable(candidates_[k])) ready.push_back(k);
  }
  CostStages(ready);
  for (size_t k : ready) candidates_[k].bound_ms = MakespanLowerBound(candidates_[k]);
  std::stable_sort(ready.begin(), ready.end(), [&](size_t a, size_t b) {
    return candidates_[a].bound_ms < candidates_[b].bound_ms;
  });
  double best_ms = std::numeric_limits<double>::infinity();
  for (const Candidate& cand : candidates_) {
    if (cand.report.feasible) best_ms = std::min(best_ms, cand.report.makespan_ms);
  }
  // A fixed wave size keeps the reports the same for any thread count;
  // plans never depend on it (a candidate is skipped only when its bound
  // is strictly above a makespan that fits). Without pruning, one wave.
  const size_t wave_size = options_.prune_by_bound ? 4 : std::max<size_t>(1, ready.size());
  for (size_t next = 0; next < ready.size();) {
    std::vector<size_t> wave;
    while (next < ready.size() && wave.size() < wave_size) {
      Candidate& cand = candidates_[ready[next++]];
      // The bound sums the simulator's own times in another order: a
      // relative margin keeps ties (which the earlier candidate wins)
      // simulated.
      if (options_.prune_by_bound && cand.bound_ms > best_ms * (1 + 1e-9)) {
        cand.report.makespan_bound_ms = cand.bound_ms;
        cand.Reject("bound", absl::StrFormat("no schedule of its micro-batches takes under %.2f "
                                             "ms; a plan of %.2f ms fits",
                                             cand.bound_ms, best_ms));
        continue;
      }
      wave.push_back(ready[next - 1]);
    }
    ParallelFor(wave.size() * dp_, options_.threads, [&](size_t task) {
      Candidate& cand = candidates_[wave[task / dp_]];
      cand.replicas[task % dp_] = ScheduleReplica(cand, static_cast<uint32_t>(task % dp_));
    });
    for (size_t k : wave) {
      Candidate& cand = candidates_[k];
      cand.report.makespan_bound_ms = cand.bound_ms;
      Judge(cand);
      if (cand.report.feasible) best_ms = std::min(best_ms, cand.report.makespan_ms);
    }
  }
  scheduling_ms_ += MsSince(t);
}

int Search::Choose() const {
  int chosen = -1;
  for (size_t k = 0; k < candidates_.size(); ++k) {
    if (candidates_[k].report.feasible &&
        (chosen < 0 ||
         candidates_[k].report.makespan_ms < candidates_[chosen].report.makespan_ms)) {
      chosen = static_cast<int>(k);
    }
  }
  return chosen;
}

// Nothing fits: solve the pruned pairs to their optimum, in increasing
// order of their bound, and schedule their candidates until one fits.
int Search::SolvePrunedAndChoose() {
  std::vector<std::pair<double, size_t>> pruned;
  for (size_t k = 0; k < candidates_.size(); ++k) {
    const Candidate& cand = candidates_[k];
    if (cand.micro_batching != nullptr && cand.pair >= 0 && cand.split().pruned) {
      pruned.emplace_back(cand.split().objective_ms, k);
    }
  }
  std::stable_sort(pruned.begin(), pruned.end());
  for (const auto& [bound, k] : pruned) {
    Candidate& cand = candidates_[k];
    if (cand.split().pruned) {
      const Clock::time_point t = Clock::now();
      MethodSplit* split = nullptr;
      for (MethodSplit& s : splits_) {
        if (s.result.ok() && &*s.result == cand.micro_batching) split = &s;
      }
      (void)SolvePrunedPair(model_, split->options, cand.pair, cand.micro_batching);
      micro_batching_ms_ += MsSince(t);
    }
    const size_t one[] = {k};
    Schedule(one);
    if (cand.report.feasible) return Choose();
  }
  return Choose();
}

double Search::UpdateMs() const {
  double slowest = 0;
  for (const DeviceUpdateCost& u : updates_) {
    slowest = std::max(slowest, u.all_reduce_ms + u.optimizer_ms * scales_.optimizer);
  }
  return slowest;
}

double Search::OverheadMs(double makespan_ms) const {
  return std::max(scales_.overhead_ms, -0.5 * (makespan_ms + UpdateMs()));
}

std::optional<PackedSamples> Search::PerSampleRows(const MicroBatchGroup& group,
                                                   const MicroBatchingResult& mbr) const {
  return PackedSamplesOf(group, mbr.samples, policy_, PackedAttentionPricingOf(c_));
}

// Per plan rank: its pipeline device's room.
std::vector<double> Search::RankLimits(const MicroBatchingResult& mbr) const {
  std::vector<double> limits;
  for (int rank = 0; rank < ranks_.plan_ranks(); ++rank) {
    limits.push_back(mbr.available_per_device[ranks_.PpRank(rank)]);
  }
  return limits;
}

// Phase 4 for one replica: its micro-batches and communication plan (with
// context parallelism: every lane's).
std::vector<ReplicaPlan> Search::ReplicaOf(const Candidate& best, uint32_t r,
                                           absl::Status* status) const {
  const MicroBatchingResult& mbr = *best.micro_batching;
  const MicroBatchingCandidate& split = best.split();
  const ReplicaTimeline& timeline = best.replicas[r];
  ReplicaPlan replica;
  replica.shape = timeline.shape;
  std::vector<StageOpCost> stage_costs;
  const std::vector<uint32_t>& mine = split.replicas.replicas[r];
  for (size_t k = 0; k < mine.size(); ++k) {
    const uint32_t g = mine[k];
    const MicroBatchGroup& group = split.groups[g];
    PlannedMicroBatch planned;
    if (lanes_ > 1 && timeline.placement.split[k]) {
      SplitMicroBatchOf(best, g, planned);
      replica.micro_batches.push_back(std::move(planned));
      continue;
    }
    if (lanes_ > 1) planned.context_lane = timeline.placement.lane[k];
    // The mode it was priced under (CostStages).
    const Recompute mode = g < best.stage_costs->whole_modes.size()
                               ? best.stage_costs->whole_modes[g]
                               : best.recompute;
    if (mode != best.recompute) planned.recompute = RecomputeName(mode);
    const absl::StatusOr<MicroBatchCostModel>& profiled = *profiled_models_.at(mode);
    // Packed rows: the kernel the candidate was priced with (CostStages):
    // per sample, or, under FASTEST_PER_MICRO_BATCH, whichever was faster.
    std::optional<PackedSamples> packed = PerSampleRows(group, mbr);
    if (packed.has_value() && packed->only_if_faster) {
      const absl::StatusOr<MicroBatchCostModel>& priced = *cost_models_.at(mode);
      if (priced.ok() && priced->PerSampleIsFaster(*packed, group.input_len, group.target_len)) {
        packed->only_if_faster = false;
      } else {
        packed.reset();
      }
    }
    if (!group.row_starts.empty()) {
      planned.packed_attention = packed.has_value() ? v1::PER_SAMPLE : v1::BLOCK_DIAGONAL_MASK;
    }
    // What the profiled model predicts for each stage (executors report it
    // beside their measurement: calibration.h).
    if (profiled.ok() &&
        profiled->EvaluateStages(
            static_cast<uint32_t>(group.size()), group.input_len, group.target_len,
            packed ? &*packed : nullptr,
            static_cast<double>(LabelledTokens(group, mbr.samples, dims_.encoder_decoder())),
            best.chunks, dims_.hidden, dims_.dtype_bytes, &stage_costs)) {
      RecordProfiledTimes(stage_costs, group, planned);
    }
    // The lengths after truncation: what the executor feeds.
    LayOutSamples(group, mini_batch_.sample_ids, mbr.samples, policy_, planned);
    replica.micro_batches.push_back(std::move(planned));
  }
  if (lanes_ <= 1) {
    absl::StatusOr<CommPlan> comm = PlanCommunication(timeline.shape, timeline.order, timeline.sim);
    if (comm.ok()) {
      replica.comm = *std::move(comm);
    } else {
      *status = comm.status();
    }
    return {std::move(replica)};
  }
  // Every lane lists the group's micro-batches; its programs are its own.
  std::vector<ReplicaPlan> lanes(lanes_, replica);
  for (uint32_t k = 0; k < lanes_; ++k) {
    absl::StatusOr<CommPlan> comm =
        PlanCommunication(timeline.shape, timeline.lane_orders[k], timeline.lanes.lanes[k]);
    if (comm.ok()) {
      lanes[k].comm = *std::move(comm);
    } else {
      *status = comm.status();
    }
  }
  return lanes;
}

// A micro-batch split across the lanes, as the plan contract lays it out
// (plan.proto, ContextPlacement): its samples' sequences back to back in
// one row (row_starts {0}, each sample's offset its packed start), every
// lane's tensors [1, A] with A the lanes' padded local count, target_len 0.
void Search::SplitMicroBatchOf(const Candidate& best, uint32_t g,
                               PlannedMicroBatch& planned) const {
  const MicroBatchingResult& mbr = *best.micro_batching;
  const MicroBatchGroup& group = best.split().groups[g];
  // The mode its split was priced under (CostSplits).
  const Recompute mode =
      g < best.stage_costs->split_modes.size() ? best.stage_costs->split_modes[g] : best.recompute;
  if (mode != best.recompute) planned.recompute = RecomputeName(mode);
  LayOutSamples(group, mini_batch_.sample_ids, mbr.samples, policy_, planned);
  std::vector<uint32_t> lengths;
  std::vector<int64_t> lengths64;
  for (size_t i = 0; i < planned.input_lens.size(); ++i) {
    const uint32_t target = i < planned.target_lens.size() ? planned.target_lens[i] : 0;
    lengths.push_back(planned.input_lens[i] + target);
    lengths64.push_back(lengths.back());
  }
  const absl::StatusOr<ContextParallelSplit> cut =
      ContextParallelSplit::Of(lengths64, static_cast<int>(lanes_), 0);
  planned.context_split = true;
  planned.context_lane = 0;
  planned.input_len = cut.ok() ? static_cast<uint32_t>(cut->all_gather_count()) : 0;
  planned.target_len = 0;
  planned.row_starts = {0};
  planned.packed_attention = v1::PER_SAMPLE;
  planned.input_offsets.clear();
  planned.target_offsets.assign(lengths.size(), 0);
  uint32_t offset = 0;
  for (uint32_t n : lengths) {
    planned.input_offsets.push_back(offset);
    offset += n;
  }
  // What the profiled model predicts for each stage of the slowest lane.
  const absl::StatusOr<ContextSplitCostModel>& profiled = *profiled_split_models_.at(mode);
  std::vector<StageOpCost> stage_costs;
  if (profiled.ok() &&
      profiled->EvaluateStages(
          lengths, static_cast<double>(LabelledTokens(group, mbr.samples, dims_.encoder_decoder())),
          best.chunks, dims_.hidden, dims_.dtype_bytes, &stage_costs)) {
    MicroBatchGroup row;
    row.samples = {0};
    row.input_len = planned.input_len;
    RecordProfiledTimes(stage_costs, row, planned);
  }
}

// Phase 4: replicas in parallel, then one plan per rank.
absl::StatusOr<std::vector<v1::ExecutionPlan>> Search::Lower(const Candidate& best) {
  const Clock::time_point t = Clock::now();
  std::vector<std::vector<ReplicaPlan>> per_replica(dp_);
  std::vector<absl::Status> status(dp_);
  ParallelFor(dp_, options_.threads, [&](size_t r) {
    per_replica[r] = ReplicaOf(best, static_cast<uint32_t>(r), &status[r]);
  });
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  // Replica r's lane k at r x lanes + k.
  std::vector<ReplicaPlan> replicas;
  for (std::vector<ReplicaPlan>& lanes : per_replica) {
    for (ReplicaPlan& lane : lanes) replicas.push_back(std::move(lane));
  }
  uint64_t global_target_tokens = 0;
  // The loss normaliser (common/dataset/loss_tokens.h).
  for (const SampleLengths& s : best.micro_batching->samples) {
    global_target_tokens += LossTokens(s, dims_.encoder_decoder());
  }
  PlanBuildOptions options;
  options.job_id = c_.job_id();
  options.iteration = mini_batch_.iteration;
  options.pipeline = p_;
  options.data_parallel = dp_;
  options.context = lanes_;
  options.encoder_decoder = dims_.encoder_decoder();
  options.encoder_stages = dims_.encoder_decoder() ? (p_ == 1 ? 1 : layout_.encoder_devices) : p_;
  options.layers = layout_.layers;
  options.hidden = dims_.hidden;
  options.dtype = c_.model().dtype();
  options.recompute = RecomputeName(best.recompute);
  options.schedule = best.report.schedule;
  options.partition_method = best.report.partition_method;
  options.global_target_tokens = global_target_tokens;
  options.predicted_makespan_ms = best.report.makespan_ms;
  options.predicted_iteration_ms =
      best.report.makespan_ms + UpdateMs() + OverheadMs(best.report.makespan_ms);
  options.predicted_overhead_ms = OverheadMs(best.report.makespan_ms);
  options.calibration_version = calibration_version_;
  for (const DeviceUpdateCost& u : updates_) {
    options.profiled_all_reduce_ms.push_back(u.all_reduce_ms);
    options.profiled_optimizer_ms.push_back(u.optimizer_ms);
    options.predicted_all_reduce_ms.push_back(u.all_reduce_ms);  // not calibrated
    options.predicted_optimizer_ms.push_back(u.optimizer_ms * scales_.optimizer);
  }
  options.predicted_activation_peak_bytes = best.peak_per_rank;
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans =
      BuildExecutionPlans(options, replicas, options_.threads);
  // Every tensor rank of a pipeline rank runs its plan.
  if (plans.ok() && c_.parallelism().tensor() > 1) {
    for (v1::ExecutionPlan& plan : *plans) {
      plan.set_tensor_parallel(c_.parallelism().tensor());
      plan.set_sequence_parallel(c_.parallelism().sequence_parallel());
    }
  }
  plan_building_ms_ = MsSince(t);
  return plans;
}

// Phase 5.
absl::Status Search::Validate(const Candidate& best, std::span<const v1::ExecutionPlan> plans) {
  const Clock::time_point t = Clock::now();
  const std::vector<double> limits = RankLimits(*best.micro_batching);
  // Each rank's plan replayed with its replica's costs (memory_replay.h).
  std::vector<const StageCostTable*> rank_costs(plans.size(), nullptr);
  for (size_t rank = 0; rank < rank_costs.size(); ++rank) {
    rank_costs[rank] = &best.replicas[ranks_.DpRank(static_cast<int>(rank))].costs;
  }
  absl::Status s = ValidateMicroBatchLengths(
      plans, {.max_input = c_.data().max_sequence_length(),
              .max_target = dims_.encoder_decoder() ? c_.data().max_target_length() : 0});
  if (s.ok()) s = ValidatePlans(plans, best.peak_per_rank, limits, options_.threads, rank_costs);
  validation_ms_ = MsSince(t);
  if (s.ok()) return s;
  return absl::InternalError(
      absl::StrCat("planner bug: iteration ", mini_batch_.iteration, ": ", s.message()));
}

// The report, in one place; `best` null for a failed search.
PlanReport Search::Report(const Candidate* best, bool with_trace) const {
  PlanReport report;
  for (const Candidate& cand : candidates_) report.candidates.push_back(cand.report);
  report.micro_batching_ms = micro_batching_ms_;
  report.scheduling_ms = scheduling_ms_;
  report.plan_building_ms = plan_building_ms_;
  report.validation_ms = validation_ms_;
  report.threads = options_.threads;
  report.total_ms = MsSince(start_);
  if (best == nullptr) return report;
  const MicroBatchingResult& mbr = *best->micro_batching;
  const MicroBatchingCandidate& split = best->split();
  report.partition_method = best->report.partition_method;
  report.setting = best->report.setting;
  report.schedule = best->report.schedule;
  report.recompute = best->report.recompute;
  report.predicted_makespan_ms = best->report.makespan_ms;
  report.predicted_update_ms = UpdateMs();
  report.predicted_overhead_ms = OverheadMs(best->report.makespan_ms);
  report.predicted_iteration_ms =
      best->report.makespan_ms + report.predicted_update_ms + report.predicted_overhead_ms;
  report.calibration_version = calibration_version_;
  report.bubble_fraction = best->report.bubble_fraction;
  report.busiest_device_ms = best->report.busiest_device_ms;
  report.peak_bytes = best->peak_per_rank;
  report.memory_limit_bytes = mbr.available_activation_bytes;
  report.memory_limit_per_rank = RankLimits(mbr);
  report.padding_efficiency = split.padding.Efficiency();
  report.input_padding_efficiency = split.padding.InputEfficiency();
  report.target_padding_efficiency = split.padding.TargetEfficiency();
  report.micro_batches = static_cast<int>(split.groups.size());
  for (const SampleLengths& s : mbr.samples) report.real_tokens += uint64_t{s.input} + s.target;
  report.context_parallel = lanes_;
  if (lanes_ > 1) report.lane_compute_ms.assign(static_cast<size_t>(dp_) * lanes_, 0);
  for (uint32_t r = 0; r < dp_; ++r) {
    const std::vector<uint32_t>& mine = split.replicas.replicas[r];
    const ReplicaTimeline& timeline = best->replicas[r];
    for (size_t k = 0; k < mine.size(); ++k) {
      const uint32_t g = mine[k];
      PlanReport::MicroBatchShape shape{r,
                                        {},
                                        static_cast<uint32_t>(split.groups[g].size()),
                                        split.groups[g].input_len,
                                        split.groups[g].target_len,
                                        split.costs[g].time_ms,
                                        /*split=*/false,
                                        /*lane=*/0,
                                        report.recompute};
      for (uint32_t position : split.groups[g].samples) {
        shape.sample_ids.push_back(mini_batch_.sample_ids[position]);
      }
      if (lanes_ > 1 && k < timeline.placement.split.size()) {
        shape.split = timeline.placement.split[k];
        shape.lane = timeline.placement.lane[k];
        double ms = 0;
        for (const std::vector<StageOpCost>& stage : timeline.costs) {
          ms += stage[k].forward_ms + stage[k].backward_ms;
        }
        shape.predicted_ms = ms;
        if (shape.split) {
          ++report.split_micro_batches;
          if (g < best->stage_costs->split_modes.size() &&
              best->stage_costs->split_modes[g] != best->recompute) {
            shape.recompute = RecomputeName(best->stage_costs->split_modes[g]);
            ++report.raised_recompute_micro_batches;
          }
          shape.rows = 1;
          shape.input_len = best->stage_costs->split_tokens[g];
          shape.target_len = 0;
          for (uint32_t lane = 0; lane < lanes_; ++lane) {
            report.lane_compute_ms[size_t{r} * lanes_ + lane] += ms;
          }
        } else {
          report.lane_compute_ms[size_t{r} * lanes_ + shape.lane] += ms;
        }
      }
      if (!shape.split && g < best->stage_costs->whole_modes.size() &&
          best->stage_costs->whole_modes[g] != best->recompute) {
        shape.recompute = RecomputeName(best->stage_costs->whole_modes[g]);
        ++report.raised_recompute_micro_batches;
        // Its time under its own mode, as the simulation ran it.
        double ms = 0;
        for (const StageOpCost& op : best->stage_costs->groups[g]) {
          ms += op.forward_ms + op.backward_ms;
        }
        shape.predicted_ms = ms;
      }
      report.micro_batch_shapes.push_back(std::move(shape));
    }
  }
  if (with_trace) {
    report.chrome_trace = ChromeTraceJson(
        best->replicas[0].sim,
        absl::StrCat(c_.job_id(), " iteration ", mini_batch_.iteration, ": ", best->report.schedule,
                     ", ", best->report.partition_method, ", recompute ", best->report.recompute));
  }
  return report;
}

absl::Status Search::Failure() const {
  // One line per (method and setting, recompute mode, reason), naming the
  // schedules that share it (a micro-batching failure is every schedule's).
  std::vector<std::string> reasons;
  std::map<std::string, size_t> line_of;
  bool all_starved = !candidates_.empty();
  for (const Candidate& cand : candidates_) {
    const CandidateReport& c = cand.report;
    const std::string what = absl::StrCat(MethodAndSetting(c), "/", c.recompute);
    const std::string why = absl::StrCat(": ", c.rejected_at, ": ", c.reason);
    auto [it, added] = line_of.emplace(absl::StrCat(what, why), reasons.size());
    if (added) {
      reasons.push_back(absl::StrCat(what, "/", c.schedule, why));
    } else {
      std::string& line = reasons[it->second];
      line.insert(line.size() - why.size(), absl::StrCat(",", c.schedule));
    }
    all_starved = all_starved && cand.starved;
  }
  // Too few micro-batches for the replicas is not a memory failure: say so.
  if (all_starved) {
    return absl::FailedPreconditionError(absl::StrCat(
        "iteration ", mini_batch_.iteration, ": the mini-batch (", mini_batch_.lengths.size(),
        " samples) splits into fewer micro-batches than the ", dp_,
        " data-parallel replicas in every candidate, and each replica needs at least one; "
        "use fewer replicas or more data.tokens_per_global_batch:\n  ",
        absl::StrJoin(reasons, "\n  ")));
  }
  return absl::ResourceExhaustedError(absl::StrCat("iteration ", mini_batch_.iteration,
                                                   ": no candidate plan fits memory:\n  ",
                                                   absl::StrJoin(reasons, "\n  ")));
}

}  // namespace

int PlannerThreads(const v1::JobConfig& config) {
  if (config.planner().threads() > 0) return static_cast<int>(config.planner().threads());
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
}

absl::StatusOr<Planner> Planner::Create(const v1::JobConfig& config) {
  absl::StatusOr<CostModel> model = CostModelForJob(config);
  if (!model.ok()) return model.status();
  // A listed layout whose stage cannot hold its own model state is the
  // config's error, named before any planning.
  if (EffectiveLayoutMode(config.parallelism().stage_layout()) == v1::LISTED) {
    absl::StatusOr<StageLayout> layout = JobStageLayout(config);
    if (!layout.ok()) return layout.status();
    const absl::StatusOr<std::vector<double>> room = AvailableActivationBytesPerDevice(
        *model, *layout, static_cast<ZeroStage>(std::min(config.training().zero_stage(), 3u)),
        std::max(1u, config.parallelism().data()) * std::max(1u, config.parallelism().context()),
        static_cast<double>(config.cluster().device_memory_limit_mib()) * (1 << 20));
    if (!room.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallelism.stage_layout ", layout->layers.ToString(), ": ", room.status().message()));
    }
  }
  return Planner(config, *std::move(model), PlannerOptions{.threads = PlannerThreads(config)});
}

Planner::Planner(v1::JobConfig config, CostModel model, PlannerOptions options)
    : config_(std::move(config)),
      model_(std::move(model)),
      profiled_(std::make_shared<const CostModel>(model_)),
      options_(options) {}

Planner Planner::WithCalibration(const v1::CalibrationState& state) const {
  Planner out = *this;
  out.calibration_ = state;
  const absl::StatusOr<StageLayout> layout = JobStageLayout(config_);
  out.scales_ = layout.ok()
                    ? ScalesOf(state, *layout, std::max(1u, config_.parallelism().virtual_chunks()))
                    : CalibrationScales();
  out.model_ = profiled_->ScaledTimes(out.scales_.forward, out.scales_.backward);
  return out;
}

Planner Planner::WithStageLayout(const LayerLayout& layers) const {
  Planner out = *this;
  *out.config_.mutable_parallelism()->mutable_stage_layout() = LayerLayoutToConfig(layers);
  return out.WithCalibration(calibration_);
}

absl::StatusOr<PlanningResult> Planner::Plan(const MiniBatch& mini_batch, bool with_trace,
                                             PlanReport* failure_report) const {
  Search search(config_, model_, *profiled_, scales_, calibration_.version(), options_, mini_batch);
  if (absl::Status s = search.Init(); !s.ok()) return s;
  search.MicroBatch();
  search.EnumerateCandidates();
  std::vector<size_t> all(search.candidates().size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  search.Schedule(all);
  int chosen = search.Choose();
  if (chosen < 0) chosen = search.SolvePrunedAndChoose();
  if (chosen < 0) {
    if (failure_report != nullptr) *failure_report = search.Report(nullptr, false);
    return search.Failure();
  }
  const Candidate& best = search.candidates()[chosen];
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans = search.Lower(best);
  if (!plans.ok()) return plans.status();
  if (absl::Status s = search.Validate(best, *plans); !s.ok()) return s;
  return PlanningResult{*std::move(plans), search.Report(&best, with_trace)};
}

}  // namespace varipipe::planner
