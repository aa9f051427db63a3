#include "planner/cost/calibration.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace varipipe::planner {
namespace {

double Clamp(double scale) {
  if (!std::isfinite(scale) || scale <= 0) return 1;
  return std::clamp(scale, kMinScale, kMaxScale);
}

// measured / profiled, or 0 when nothing was profiled.
double Ratio(double measured, double profiled) { return profiled > 0 ? measured / profiled : 0; }

v1::StageCalibration* StageOf(v1::CalibrationState* state, uint32_t stage) {
  for (v1::StageCalibration& s : *state->mutable_stages()) {
    if (s.stage() == stage) return &s;
  }
  // Kept sorted by stage: the serialized state is canonical.
  auto* stages = state->mutable_stages();
  v1::StageCalibration* added = stages->Add();
  added->set_stage(stage);
  std::sort(stages->begin(), stages->end(),
            [](const v1::StageCalibration& a, const v1::StageCalibration& b) {
              return a.stage() < b.stage();
            });
  for (v1::StageCalibration& s : *stages) {
    if (s.stage() == stage) return &s;
  }
  return nullptr;  // unreachable
}

struct Sums {
  double measured_forward = 0, profiled_forward = 0;
  double measured_backward = 0, profiled_backward = 0;
  bool any() const { return profiled_forward > 0 || profiled_backward > 0; }
};

}  // namespace

bool FoldReport(const CalibrationReport& report, v1::CalibrationState* state) {
  if (report.iteration == 0) return false;
  // This report's totals per stage.
  std::vector<std::pair<uint32_t, PassTiming>> per_stage;
  for (const PassTiming& p : report.passes) {
    if (!(p.profiled_forward_ms > 0) || !(p.profiled_backward_ms > 0) ||
        !std::isfinite(p.measured_forward_ms) || !std::isfinite(p.measured_backward_ms) ||
        p.measured_forward_ms < 0 || p.measured_backward_ms < 0) {
      continue;
    }
    auto it = std::find_if(per_stage.begin(), per_stage.end(),
                           [&](const auto& s) { return s.first == p.stage; });
    if (it == per_stage.end()) {
      per_stage.push_back({p.stage, PassTiming{.stage = p.stage}});
      it = per_stage.end() - 1;
    }
    it->second.measured_forward_ms += p.measured_forward_ms;
    it->second.measured_backward_ms += p.measured_backward_ms;
    it->second.profiled_forward_ms += p.profiled_forward_ms;
    it->second.profiled_backward_ms += p.profiled_backward_ms;
  }
  const bool update = report.profiled_all_reduce_ms > 0 || report.profiled_optimizer_ms > 0;
  // The residual of the whole iteration: what the plan's pipeline and
  // update did not predict (its own overhead term taken out, so the term
  // converges instead of feeding on itself).
  const bool whole =
      report.plan_calibration_version > 0 && report.measured_iteration_ms > 0 &&
      report.predicted_iteration_ms > 0 && std::isfinite(report.measured_iteration_ms) &&
      std::isfinite(report.predicted_iteration_ms) && std::isfinite(report.predicted_overhead_ms);
  if (per_stage.empty() && !update && !whole) return false;
  for (const auto& [stage, t] : per_stage) {
    v1::StageCalibration* s = StageOf(state, stage);
    s->set_measured_forward_ms(kCalibrationDecay * s->measured_forward_ms() +
                               t.measured_forward_ms);
    s->set_profiled_forward_ms(kCalibrationDecay * s->profiled_forward_ms() +
                               t.profiled_forward_ms);
    s->set_measured_backward_ms(kCalibrationDecay * s->measured_backward_ms() +
                                t.measured_backward_ms);
    s->set_profiled_backward_ms(kCalibrationDecay * s->profiled_backward_ms() +
                                t.profiled_backward_ms);
    s->set_reports(s->reports() + 1);
  }
  if (report.profiled_all_reduce_ms > 0 && std::isfinite(report.measured_all_reduce_ms)) {
    state->set_measured_all_reduce_ms(kCalibrationDecay * state->measured_all_reduce_ms() +
                                      report.measured_all_reduce_ms);
    state->set_profiled_all_reduce_ms(kCalibrationDecay * state->profiled_all_reduce_ms() +
                                      report.profiled_all_reduce_ms);
  }
  if (report.profiled_optimizer_ms > 0 && std::isfinite(report.measured_optimizer_ms)) {
    state->set_measured_optimizer_ms(kCalibrationDecay * state->measured_optimizer_ms() +
                                     report.measured_optimizer_ms);
    state->set_profiled_optimizer_ms(kCalibrationDecay * state->profiled_optimizer_ms() +
                                     report.profiled_optimizer_ms);
  }
  if (whole) {
    const double residual = report.measured_iteration_ms -
                            (report.predicted_iteration_ms - report.predicted_overhead_ms);
    state->set_overhead_ms(kCalibrationDecay * state->overhead_ms() + residual);
    state->set_overhead_weight(kCalibrationDecay * state->overhead_weight() + 1);
  }
  if (report.iteration > state->last_iteration() || state->iterations() == 0) {
    state->set_iterations(state->iterations() + 1);
    state->set_last_iteration(std::max(state->last_iteration(), report.iteration));
  }
  state->set_version(state->version() + 1);
  return true;
}

CalibrationScales ScalesOf(const v1::CalibrationState& state, const StageLayout& layout,
                           uint32_t chunks) {
  const uint32_t stages = layout.devices * std::max(1u, chunks);
  const bool t5 = layout.encoder_decoder;
  const uint32_t encoder_stages = t5 ? layout.encoder_devices : stages;
  // Sums per kind: [0] encoder (GPT: every stage), [1] decoder.
  std::array<Sums, 2> kind;
  for (const v1::StageCalibration& s : state.stages()) {
    if (s.stage() >= stages) continue;  // another layout's stage
    const bool shared = t5 && layout.devices == 1;
    for (int k = 0; k < 2; ++k) {
      const bool holds =
          shared || (k == 0 ? s.stage() < encoder_stages : t5 && s.stage() >= encoder_stages);
      if (!holds) continue;
      kind[k].measured_forward += s.measured_forward_ms();
      kind[k].profiled_forward += s.profiled_forward_ms();
      kind[k].measured_backward += s.measured_backward_ms();
      kind[k].profiled_backward += s.profiled_backward_ms();
    }
  }
  if (!kind[1].any()) kind[1] = kind[0];
  if (!kind[0].any()) kind[0] = kind[1];
  std::array<double, 2> forward{}, backward{};
  for (int k = 0; k < 2; ++k) {
    forward[k] = Clamp(Ratio(kind[k].measured_forward, kind[k].profiled_forward));
    backward[k] = Clamp(Ratio(kind[k].measured_backward, kind[k].profiled_backward));
  }
  CalibrationScales out;
  const auto set = [&](Component c, int k) {
    out.forward[static_cast<int>(c)] = forward[k];
    out.backward[static_cast<int>(c)] = backward[k];
  };
  set(Component::kEncoderLayer, 0);
  set(Component::kEmbedding, 0);  // one grid for both T5 embeddings
  set(Component::kDecoderLayer, t5 ? 1 : 0);
  set(Component::kPostprocess, t5 ? 1 : 0);
  set(Component::kAttentionCore, 0);  // inside the layers it prices
  out.optimizer = Clamp(Ratio(state.measured_optimizer_ms(), state.profiled_optimizer_ms()));
  if (state.overhead_weight() > 0) {
    const double overhead = state.overhead_ms() / state.overhead_weight();
    out.overhead_ms = std::isfinite(overhead) ? overhead : 0;
  }
  return out;
}

std::string CalibrationScales::Describe(bool encoder_decoder) const {
  const int enc = static_cast<int>(Component::kEncoderLayer);
  const int dec = static_cast<int>(Component::kDecoderLayer);
  std::string layers =
      encoder_decoder
          ? absl::StrFormat(
                "encoder forward x%.3g backward x%.3g, decoder forward x%.3g "
                "backward x%.3g",
                forward[enc], backward[enc], forward[dec], backward[dec])
          : absl::StrFormat("forward x%.3g, backward x%.3g", forward[enc], backward[enc]);
  return absl::StrFormat("%s, optimizer x%.3g, overhead %+.1f ms", layers, optimizer, overhead_ms);
}

}  // namespace varipipe::planner
