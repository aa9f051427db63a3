#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dataset/loss_tokens.h"
#include "planner/comm/comm_planner.h"
#include "planner/cost/cost_model_io.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/microbatch/micro_batching.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/validator.h"
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
    default:
      return "unknown";
  }
}

Link MakeLink(double latency_us, double gbps) { return {latency_us / 1e3, gbps * 1e6}; }

// One simulated candidate.
struct Candidate {
  CandidateReport report;
  const MicroBatchingResult* micro_batching = nullptr;
  v1::ScheduleKind schedule = v1::SCHEDULE_KIND_UNSPECIFIED;
  Recompute recompute = Recompute::kNone;
  PartitionMethod method = PartitionMethod::kDynamicProgramming;
  std::vector<PipelineShape> shapes;   // per replica
  std::vector<DeviceOrder> orders;     // per replica
  std::vector<SimulationResult> sims;  // per replica
  std::vector<double> peak_per_rank;
};

}  // namespace

absl::StatusOr<Planner> Planner::Create(const v1::JobConfig& config) {
  absl::StatusOr<CostModel> model = CostModelForJob(config);
  if (!model.ok()) return model.status();
  return Planner(config, *std::move(model));
}

Planner::Planner(v1::JobConfig config, CostModel model)
    : config_(std::move(config)), model_(std::move(model)) {}

absl::StatusOr<PlanningResult> Planner::Plan(const MiniBatch& mini_batch, bool with_trace) const {
  const Clock::time_point start = Clock::now();
  if (mini_batch.sample_ids.size() != mini_batch.lengths.size()) {
    return absl::InvalidArgumentError("mini-batch: sample ids and lengths differ in number");
  }
  const v1::JobConfig& c = config_;
  const uint32_t p = c.parallelism().pipeline();
  const uint32_t dp = c.parallelism().data();
  const uint32_t v = c.parallelism().virtual_chunks();
  const ModelDims dims = ModelDimsFromConfig(c.model());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, p, 1);
  if (!layout.ok()) return layout.status();
  const LengthPolicy policy{.encoder_decoder = dims.encoder_decoder(),
                            .multiple = c.planner().length_multiple()};

  PlanReport report;
  // Micro-batching per (method, recompute mode, budget), computed once.
  std::map<std::tuple<int, int, int>, std::unique_ptr<absl::StatusOr<MicroBatchingResult>>> splits;
  std::map<int, std::unique_ptr<absl::StatusOr<MicroBatchCostModel>>> cost_models;
  std::vector<Candidate> candidates;
  double micro_batching_ms = 0;
  double scheduling_ms = 0;

  for (int method_value : c.planner().partition_methods()) {
    const PartitionMethod method =
        PartitionMethodFromProto(static_cast<v1::PartitionMethod>(method_value));
    for (int mode_value : c.planner().recompute_modes()) {
      const Recompute mode = RecomputeFromProto(static_cast<v1::RecomputeMode>(mode_value));
      auto& cost = cost_models[mode_value];
      if (!cost) {
        cost = std::make_unique<absl::StatusOr<MicroBatchCostModel>>(
            MicroBatchCostModel::Create(model_, *layout, mode, c.parallelism().tensor()));
      }
      for (int schedule_value : c.planner().schedules()) {
        const auto schedule = static_cast<v1::ScheduleKind>(schedule_value);
        const MemoryBudget budget =
            schedule == v1::ADAPTIVE ? MemoryBudget::kWholeDevice : MemoryBudget::kPipelineDepth;
        Candidate cand;
        cand.schedule = schedule;
        cand.recompute = mode;
        cand.method = method;
        cand.report.partition_method = PartitionMethodName(method);
        cand.report.schedule = ScheduleName(schedule);
        cand.report.recompute = RecomputeName(mode);
        auto& split = splits[{method_value, mode_value, static_cast<int>(budget)}];
        if (!split) {
          const Clock::time_point t = Clock::now();
          MicroBatchingOptions options = MicroBatchingOptionsFromConfig(c, method);
          options.recompute_modes = {mode};
          options.budgets = {budget};
          split = std::make_unique<absl::StatusOr<MicroBatchingResult>>(
              PlanMicroBatches(mini_batch.lengths, model_, options));
          micro_batching_ms += MsSince(t);
        }
        if (!split->ok()) {
          cand.report.reason = std::string(split->status().message());
          candidates.push_back(std::move(cand));
          continue;
        }
        if (!cost->ok()) {
          cand.report.reason = std::string(cost->status().message());
          candidates.push_back(std::move(cand));
          continue;
        }
        const MicroBatchingResult& mbr = **split;
        cand.micro_batching = &mbr;
        const MicroBatchingCandidate& best = mbr.best();
        cand.report.micro_batches = static_cast<int>(best.groups.size());
        cand.report.padding_efficiency = mbr.padding.Efficiency();
        const uint32_t chunks = schedule == v1::INTERLEAVED_1F1B ? v : 1;
        if (dims.encoder_decoder() && chunks > 1) {
          cand.report.reason = "the interleaved schedule is not supported for T5 models";
          candidates.push_back(std::move(cand));
          continue;
        }
        if (chunks > 1 && dims.encoder_layers < p * chunks) {
          cand.report.reason = "too few layers for the virtual chunks";
          candidates.push_back(std::move(cand));
          continue;
        }
        const Clock::time_point t = Clock::now();
        bool ok = true;
        cand.peak_per_rank.assign(static_cast<size_t>(p) * dp, 0);
        const double available = mbr.available_activation_bytes;
        for (uint32_t r = 0; r < dp && ok; ++r) {
          const std::vector<uint32_t>& mine = mbr.replicas.replicas[r];
          if (mine.empty()) {
            cand.report.reason =
                absl::StrCat("data-parallel replica ", r, " gets no micro-batch (",
                             best.groups.size(), " micro-batches for ", dp, " replicas)");
            ok = false;
            break;
          }
          const PipelineShape shape{p, chunks, static_cast<uint32_t>(mine.size())};
          StageCostTable costs(shape.stages(), std::vector<StageOpCost>(mine.size()));
          std::vector<double> times(mine.size());
          for (size_t k = 0; k < mine.size(); ++k) {
            const MicroBatchGroup& g = best.groups[mine[k]];
            std::vector<StageCost> stage_costs;
            if (!(*cost)->EvaluateStages(static_cast<uint32_t>(g.size()), g.input_len, g.target_len,
                                         chunks, dims.hidden, dims.dtype_bytes, &stage_costs)) {
              cand.report.reason = "a micro-batch lies beyond the cost model";
              ok = false;
              break;
            }
            for (uint32_t s = 0; s < shape.stages(); ++s) {
              const StageCost& sc = stage_costs[s];
              costs[s][k] = {sc.forward_ms, sc.backward_ms,      sc.stored_bytes,
                             sc.peak_bytes, sc.activation_bytes, sc.gradient_bytes};
            }
            times[k] = best.costs[mine[k]].time_ms;
          }
          if (!ok) break;
          const ClusterNetwork network{
              .devices_per_node = c.cluster().devices_per_node(),
              .first_device = r * p,
              .intra_node = MakeLink(c.cluster().intra_node_latency_us(),
                                     c.cluster().intra_node_bandwidth_gbps()),
              .inter_node = MakeLink(c.cluster().inter_node_latency_us(),
                                     c.cluster().inter_node_bandwidth_gbps())};
          absl::StatusOr<DeviceOrder> order;
          SimulationResult sim;
          switch (schedule) {
            case v1::GPIPE:
              order = GpipeSchedule(shape);
              break;
            case v1::ONE_F_ONE_B:
              order = OneFOneBSchedule(shape);
              break;
            case v1::INTERLEAVED_1F1B:
              order = InterleavedOneFOneBSchedule(shape);
              break;
            case v1::KFKB:
              order = KfkbSchedule(shape, c.planner().kfkb_k());
              break;
            case v1::ADAPTIVE: {
              absl::StatusOr<AdaptiveSearchResult> searched =
                  SearchAdaptiveOrder(shape, costs, times, available, network);
              if (searched.ok()) {
                order = std::move(searched->order);
                sim = std::move(searched->simulation);
              } else {
                order = searched.status();
              }
              break;
            }
            default:
              order = absl::InvalidArgumentError("unknown schedule");
          }
          if (!order.ok()) {
            cand.report.reason = std::string(order.status().message());
            ok = false;
            break;
          }
          if (!sim.completed) sim = Simulate(shape, *order, costs, network);
          if (!sim.completed) {
            cand.report.reason = absl::StrCat("schedule does not complete: ", sim.deadlock);
            ok = false;
            break;
          }
          for (uint32_t d = 0; d < p; ++d) cand.peak_per_rank[r * p + d] = sim.peak_bytes[d];
          cand.shapes.push_back(shape);
          cand.orders.push_back(*std::move(order));
          cand.sims.push_back(std::move(sim));
        }
        scheduling_ms += MsSince(t);
        if (ok) {
          double makespan = 0;
          double bubble = 0;
          for (const SimulationResult& s : cand.sims) {
            makespan = std::max(makespan, s.makespan_ms);
            bubble += s.MeanBubbleFraction();
          }
          cand.report.makespan_ms = makespan;
          cand.report.bubble_fraction = bubble / cand.sims.size();
          cand.report.peak_bytes =
              *std::max_element(cand.peak_per_rank.begin(), cand.peak_per_rank.end());
          if (cand.report.peak_bytes > available) {
            cand.report.reason = absl::StrFormat(
                "simulated peak %.1f MiB exceeds the %.1f MiB available for activations",
                cand.report.peak_bytes / (1 << 20), available / (1 << 20));
          } else {
            cand.report.feasible = true;
          }
        }
        candidates.push_back(std::move(cand));
      }
    }
  }

  int chosen = -1;
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (candidates[k].report.feasible &&
        (chosen < 0 || candidates[k].report.makespan_ms < candidates[chosen].report.makespan_ms)) {
      chosen = static_cast<int>(k);
    }
  }
  for (const Candidate& cand : candidates) report.candidates.push_back(cand.report);
  if (chosen < 0) {
    std::vector<std::string> reasons;
    for (const Candidate& cand : candidates) {
      reasons.push_back(absl::StrCat(cand.report.partition_method, "/", cand.report.schedule, "/",
                                     cand.report.recompute, ": ", cand.report.reason));
    }
    return absl::ResourceExhaustedError(absl::StrCat("iteration ", mini_batch.iteration,
                                                     ": no candidate plan fits memory:\n  ",
                                                     absl::StrJoin(reasons, "\n  ")));
  }

  // Lower the chosen candidate to plans.
  const Clock::time_point build_start = Clock::now();
  const Candidate& best = candidates[chosen];
  const MicroBatchingResult& mbr = *best.micro_batching;
  const MicroBatchingCandidate& split = mbr.best();
  std::vector<ReplicaPlan> replicas;
  uint64_t global_target_tokens = 0;
  // The loss normaliser (common/dataset/loss_tokens.h).
  for (const SampleLengths& s : mbr.samples) {
    global_target_tokens += LossTokens(s, dims.encoder_decoder());
  }
  for (uint32_t r = 0; r < dp; ++r) {
    ReplicaPlan replica;
    replica.shape = best.shapes[r];
    for (uint32_t g : mbr.replicas.replicas[r]) {
      const MicroBatchGroup& group = split.groups[g];
      PlannedMicroBatch planned;
      for (uint32_t position : group.samples) {
        planned.sample_ids.push_back(mini_batch.sample_ids[position]);
        const SampleLengths& s = mbr.samples[position];
        // GPT: the whole sequence is input (target_len is 0).
        planned.real_input_tokens += SequenceLength(s, policy);
        if (policy.encoder_decoder) planned.real_target_tokens += s.target;
      }
      planned.input_len = group.input_len;
      planned.target_len = group.target_len;
      planned.rows = static_cast<uint32_t>(group.size());
      planned.row_starts = group.row_starts;
      replica.micro_batches.push_back(std::move(planned));
      report.micro_batch_shapes.push_back({r, replica.micro_batches.back().sample_ids,
                                           replica.micro_batches.back().rows, group.input_len,
                                           group.target_len, split.costs[g].time_ms});
    }
    absl::StatusOr<CommPlan> comm = PlanCommunication(best.shapes[r], best.orders[r], best.sims[r]);
    if (!comm.ok()) return comm.status();
    replica.comm = *std::move(comm);
    replicas.push_back(std::move(replica));
  }
  PlanBuildOptions options;
  options.job_id = c.job_id();
  options.iteration = mini_batch.iteration;
  options.pipeline = p;
  options.data_parallel = dp;
  options.encoder_decoder = dims.encoder_decoder();
  options.encoder_stages = dims.encoder_decoder() ? (p == 1 ? 1 : layout->encoder_devices) : p;
  options.hidden = dims.hidden;
  options.dtype = c.model().dtype();
  options.recompute = RecomputeName(best.recompute);
  options.schedule = best.report.schedule;
  options.partition_method = best.report.partition_method;
  options.global_target_tokens = global_target_tokens;
  options.predicted_iteration_ms = best.report.makespan_ms;
  absl::StatusOr<std::vector<v1::ExecutionPlan>> plans = BuildExecutionPlans(options, replicas);
  if (!plans.ok()) return plans.status();
  report.plan_building_ms = MsSince(build_start);

  const Clock::time_point validate_start = Clock::now();
  if (absl::Status s = ValidatePlans(*plans, best.peak_per_rank, mbr.available_activation_bytes);
      !s.ok()) {
    return absl::InternalError(
        absl::StrCat("planner bug: iteration ", mini_batch.iteration, ": ", s.message()));
  }
  report.validation_ms = MsSince(validate_start);

  report.partition_method = best.report.partition_method;
  report.schedule = best.report.schedule;
  report.recompute = best.report.recompute;
  report.predicted_iteration_ms = best.report.makespan_ms;
  report.bubble_fraction = best.report.bubble_fraction;
  report.peak_bytes = best.peak_per_rank;
  report.memory_limit_bytes = mbr.available_activation_bytes;
  report.padding_efficiency = mbr.padding.Efficiency();
  report.input_padding_efficiency = mbr.padding.InputEfficiency();
  report.target_padding_efficiency = mbr.padding.TargetEfficiency();
  report.micro_batches = static_cast<int>(split.groups.size());
  for (const SampleLengths& s : mbr.samples) report.real_tokens += uint64_t{s.input} + s.target;
  report.micro_batching_ms = micro_batching_ms;
  report.scheduling_ms = scheduling_ms;
  if (with_trace) {
    report.chrome_trace = ChromeTraceJson(
        best.sims[0],
        absl::StrCat(c.job_id(), " iteration ", mini_batch.iteration, ": ", best.report.schedule,
                     ", ", best.report.partition_method, ", recompute ", best.report.recompute));
  }
  report.total_ms = MsSince(start);
  return PlanningResult{*std::move(plans), std::move(report)};
}

}  // namespace varipipe::planner
