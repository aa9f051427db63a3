#include "planner/layout/stage_layout_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/model_dims.h"
#include "planner/parallel.h"

namespace varipipe::planner {
namespace {

// Work (forward + backward ms) of one of each component, summed over the
// sampled mini-batches' micro-batches.
struct ComponentWork {
  double encoder_layer = 0;
  double decoder_layer = 0;
  double encoder_embedding = 0;
  double decoder_embedding = 0;
  double postprocess = 0;
};

double Work(const CostValues& v) { return v.forward_ms + v.backward_ms; }

Recompute RecomputeNamed(const std::string& name) {
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (name == RecomputeName(mode)) return mode;
  }
  return Recompute::kNone;
}

// Adds the work of `report`'s micro-batches under its recompute mode.
void AddWork(const CostModel& model, const PlanReport& report, bool t5, uint32_t tensor_parallel,
             ComponentWork* work) {
  const Recompute mode = RecomputeNamed(report.recompute);
  const ProfileGrid* encoder = model.Grid(Component::kEncoderLayer, mode, tensor_parallel);
  const ProfileGrid* decoder = model.Grid(Component::kDecoderLayer, mode, tensor_parallel);
  const ProfileGrid* post = model.Grid(Component::kPostprocess, mode, tensor_parallel);
  const ProfileGrid* embedding = nullptr;
  for (Recompute any : {mode, Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (embedding == nullptr) embedding = model.Grid(Component::kEmbedding, any, tensor_parallel);
  }
  if (encoder == nullptr || post == nullptr || (t5 && decoder == nullptr)) return;
  for (const PlanReport::MicroBatchShape& mb : report.micro_batch_shapes) {
    CostValues v;
    const double rows = mb.rows;
    if (encoder->Lookup(rows, mb.input_len, &v)) work->encoder_layer += Work(v);
    if (t5 && decoder->Lookup(rows, mb.target_len, mb.input_len, &v)) {
      work->decoder_layer += Work(v);
    }
    if (post->Lookup(rows, t5 ? mb.target_len : mb.input_len, &v)) work->postprocess += Work(v);
    if (embedding != nullptr && embedding->Lookup(rows, mb.input_len, &v)) {
      work->encoder_embedding += Work(v);
    }
    if (t5 && embedding != nullptr && embedding->Lookup(rows, mb.target_len, &v)) {
      work->decoder_embedding += Work(v);
    }
  }
}

// The busiest stage's work of `layers` (one model stage each).
double BusiestStageWork(const LayerLayout& layers, const ComponentWork& w) {
  double busiest = 0;
  const uint32_t stages = layers.stages();
  for (uint32_t s = 0; s < stages; ++s) {
    double work = layers.encoder[s] * w.encoder_layer + layers.decoder[s] * w.decoder_layer;
    if (s == 0) work += w.encoder_embedding;
    if (layers.decoder[s] > 0 && (s == 0 || layers.decoder[s - 1] == 0)) {
      work += w.decoder_embedding;
    }
    if (s + 1 == stages) work += w.postprocess;
    busiest = std::max(busiest, work);
  }
  return busiest;
}

// A stack split over `stages` stages with the embedding (`first_ms`) on its
// first stage and `last_ms` on its last (the LM head, or nothing).
std::vector<uint32_t> StackSplit(uint32_t layers, uint32_t stages, double layer_ms, double first_ms,
                                 double last_ms) {
  std::vector<double> extra(stages, 0.0);
  extra.front() += first_ms;
  extra.back() += last_ms;
  return BalancedSplit(layers, std::max(layer_ms, 1e-9), extra);
}

LayerLayout GptLayout(std::vector<uint32_t> layers) {
  LayerLayout l;
  l.decoder.assign(layers.size(), 0);
  l.encoder = std::move(layers);
  return l;
}

LayerLayout T5Layout(const std::vector<uint32_t>& encoder, const std::vector<uint32_t>& decoder) {
  LayerLayout l;
  l.encoder = encoder;
  l.encoder.resize(encoder.size() + decoder.size(), 0);
  l.decoder.assign(encoder.size(), 0);
  l.decoder.insert(l.decoder.end(), decoder.begin(), decoder.end());
  return l;
}

// Layouts one layer away from `base` at the pipeline's ends: the first and
// the last stage each give one layer to, or take one from, their
// neighbour (within the same stack).
std::vector<LayerLayout> EndMoves(const LayerLayout& base) {
  std::vector<LayerLayout> out;
  const uint32_t n = base.stages();
  if (n < 2) return out;
  const auto move = [&](uint32_t from, uint32_t to) {
    LayerLayout l = base;
    std::vector<uint32_t>& stack = l.encoder[from] > 0 ? l.encoder : l.decoder;
    if (stack[from] <= 1 || stack[to] == 0) return;  // keep a layer; stay in the stack
    --stack[from];
    ++stack[to];
    out.push_back(std::move(l));
  };
  move(0, 1);
  move(1, 0);
  move(n - 1, n - 2);
  move(n - 2, n - 1);
  return out;
}

}  // namespace

std::vector<uint32_t> BalancedSplit(uint32_t layers, double layer_ms,
                                    std::span<const double> extra_ms) {
  const size_t stages = extra_ms.size();
  // The smallest bound T on a stage's work that holds every layer: stage s
  // takes at most floor((T - extra_s) / layer_ms) layers. T is one of the
  // values k * layer_ms + extra_s.
  std::vector<double> bounds;
  bounds.reserve(stages * layers);
  for (double e : extra_ms) {
    for (uint32_t k = 1; k <= layers; ++k) bounds.push_back(k * layer_ms + e);
  }
  std::sort(bounds.begin(), bounds.end());
  const auto capacity = [&](double bound, size_t s) -> uint32_t {
    const double room = (bound - extra_ms[s]) / layer_ms;
    if (room < 1 - 1e-9) return 0;
    return static_cast<uint32_t>(std::min<double>(layers, std::floor(room + 1e-9)));
  };
  const auto holds = [&](double bound) {
    uint64_t total = 0;
    for (size_t s = 0; s < stages; ++s) {
      const uint32_t c = capacity(bound, s);
      if (c == 0) return false;
      total += c;
    }
    return total >= layers;
  };
  const auto first = std::partition_point(bounds.begin(), bounds.end(),
                                          [&](double bound) { return !holds(bound); });
  const double bound = first == bounds.end() ? bounds.back() : *first;
  std::vector<uint32_t> split(stages);
  uint64_t total = 0;
  for (size_t s = 0; s < stages; ++s) total += split[s] = std::max<uint32_t>(1, capacity(bound, s));
  // Give back the surplus from the busiest stages, the later first.
  while (total > layers) {
    size_t busiest = stages;
    double most = -1;
    for (size_t s = 0; s < stages; ++s) {
      const double work = split[s] * layer_ms + extra_ms[s];
      if (split[s] > 1 && work >= most) {
        most = work;
        busiest = s;
      }
    }
    if (busiest == stages) break;
    --split[busiest];
    --total;
  }
  return split;
}

std::string LayoutChoice::Summary() const {
  if (chosen == even || even_mean_ms <= 0) {
    return absl::StrFormat(
        "stage layout (AUTO): %s, mean predicted iteration %.2f ms over %d sampled mini-batches%s",
        chosen.ToString(), chosen_mean_ms, sampled_mini_batches,
        chosen == even ? " (the even split; no candidate predicted shorter)"
                       : " (the even split has no plan)");
  }
  return absl::StrFormat(
      "stage layout (AUTO): %s, mean predicted iteration %.2f ms over %d sampled mini-batches, "
      "%.1f%% shorter than the even split %s (%.2f ms)",
      chosen.ToString(), chosen_mean_ms, sampled_mini_batches,
      100.0 * (1.0 - chosen_mean_ms / even_mean_ms), even.ToString(), even_mean_ms);
}

std::string LayoutChoice::Describe() const {
  std::string out = Summary();
  for (const LayoutCandidate& c : candidates) {
    absl::StrAppend(
        &out, "\n  ", c.layers == chosen ? "* " : "  ", c.layers.ToString(), " (", c.origin,
        absl::StrFormat(", busiest stage %.1f ms of sampled work)", c.busiest_stage_work_ms));
    if (c.feasible) {
      absl::StrAppend(&out, absl::StrFormat(": mean %.2f ms", c.mean_iteration_ms));
    } else {
      absl::StrAppend(&out, ": no plan: ", c.reason);
    }
  }
  return out;
}

namespace {

// The search behind ChooseStageLayout (stage_layout_search.h), one method
// per step, over `choice.candidates`.
class LayoutSearch {
 public:
  LayoutSearch(const Planner& planner, std::span<const MiniBatch> sample,
               const LayoutSearchOptions& options, LayoutChoice& choice)
      : planner_(planner),
        sample_(sample),
        options_(options),
        counts_(LayerCountsOf(planner.config().model())),
        t5_(counts_.encoder_decoder),
        candidates_(choice.candidates) {}

  // 1. The even split, and the work its micro-batches give each component.
  void EvaluateEven(const LayerLayout& even) {
    candidates_.push_back(LayoutCandidate{.layers = even, .origin = "even split", .reason = ""});
    std::vector<PlanReport> reports;
    Evaluate(candidates_.front(), &reports);
    if (reports.empty()) reports.push_back(SamplesAlone());
    const v1::ParallelismConfig& p = planner_.config().parallelism();
    for (const PlanReport& r : reports) {
      AddWork(planner_.cost_model(), r, t5_, std::max(1u, p.tensor()), &work_);
    }
    candidates_.front().busiest_stage_work_ms = BusiestStageWork(even, work_);
  }

  // 2. Balanced candidates, the most balanced first, and the best one with
  // one layer moved at either end.
  void ProposeBalanced(uint32_t stages) {
    if (stages <= 1 || work_.encoder_layer <= 0 || (t5_ && work_.decoder_layer <= 0)) return;
    const std::vector<std::pair<double, LayerLayout>> balanced = Balanced(stages);
    std::vector<std::pair<LayerLayout, std::string>> proposed;
    for (size_t i = 0; i < balanced.size() && i < 3; ++i) {
      proposed.emplace_back(balanced[i].second, "balanced");
    }
    if (!balanced.empty()) {
      for (LayerLayout& l : EndMoves(balanced.front().second)) {
        proposed.emplace_back(std::move(l), "balanced, one layer moved");
      }
    }
    for (auto& [layers, origin] : proposed) {
      if (static_cast<int>(candidates_.size()) > options_.max_candidates) break;
      if (!Seen(layers)) {
        candidates_.push_back(LayoutCandidate{
            .layers = std::move(layers), .origin = std::move(origin), .reason = ""});
      }
    }
  }

  // 3. Candidates from `first` on, planned on the planner's threads.
  void EvaluateFrom(size_t first) {
    for (size_t i = first; i < candidates_.size(); ++i) {
      candidates_[i].busiest_stage_work_ms = BusiestStageWork(candidates_[i].layers, work_);
    }
    ParallelFor(candidates_.size() - first, std::max(1, planner_.options().threads),
                [&](size_t k) { Evaluate(candidates_[first + k], nullptr); });
  }

  // 4. One round of local search on the predicted iterations themselves:
  // one layer between neighbouring stages of a stack from the best so far
  // (the busiest-stage work is a proxy: it ignores which stages hold more
  // micro-batches in flight, and so their memory and recomputation). False
  // when it did not shorten the mean or may not go on.
  bool LocalRound() {
    const int from = BestIndex();
    if (from < 0 || static_cast<int>(candidates_.size()) >= options_.max_evaluations) return false;
    const LayerLayout base = candidates_[from].layers;
    const double base_ms = candidates_[from].mean_iteration_ms;
    const size_t first = candidates_.size();
    for (uint32_t s = 0; s + 1 < base.stages(); ++s) {
      for (const auto& [give, take] : {std::pair{s, s + 1}, std::pair{s + 1, s}}) {
        LayerLayout l = base;
        const bool encoder = base.encoder[give] > 0 && base.encoder[take] > 0;
        const bool decoder = base.decoder[give] > 0 && base.decoder[take] > 0;
        if (!encoder && !decoder) continue;  // the two stacks' boundary
        std::vector<uint32_t>& stack = encoder ? l.encoder : l.decoder;
        if (stack[give] <= 1) continue;
        --stack[give];
        ++stack[take];
        if (!Seen(l) && static_cast<int>(candidates_.size()) < options_.max_evaluations) {
          candidates_.push_back(
              LayoutCandidate{.layers = std::move(l), .origin = "local search", .reason = ""});
        }
      }
    }
    EvaluateFrom(first);
    const int improved = BestIndex();
    return improved >= 0 && candidates_[improved].mean_iteration_ms < base_ms;
  }

  // The lowest mean wins, ties to the earlier; -1: none plans.
  int BestIndex() const {
    int best = -1;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const LayoutCandidate& c = candidates_[i];
      if (c.feasible && (best < 0 || c.mean_iteration_ms < candidates_[best].mean_iteration_ms)) {
        best = static_cast<int>(i);
      }
    }
    return best;
  }

 private:
  // Plans every sampled mini-batch under `c.layers`; `reports` (optional)
  // collects the reports.
  void Evaluate(LayoutCandidate& c, std::vector<PlanReport>* reports) const {
    const Planner with = planner_.WithStageLayout(c.layers);
    double total = 0;
    for (const MiniBatch& mb : sample_) {
      absl::StatusOr<PlanningResult> r = with.Plan(mb);
      if (!r.ok()) {
        // The planner's first line and its first candidate's reason.
        c.feasible = false;
        const std::vector<absl::string_view> lines =
            absl::StrSplit(r.status().message(), '\n', absl::SkipWhitespace());
        c.reason =
            absl::StrJoin(lines.begin(), lines.begin() + std::min<size_t>(2, lines.size()), " ");
        return;
      }
      total += r->report.predicted_iteration_ms;
      if (reports != nullptr) reports->push_back(std::move(r->report));
    }
    c.feasible = true;
    c.mean_iteration_ms = total / static_cast<double>(sample_.size());
  }

  // No plan under the even split: the components weighed by each sampled
  // sample alone, under the first recompute mode.
  PlanReport SamplesAlone() const {
    const v1::PlannerConfig& config = planner_.config().planner();
    PlanReport alone;
    alone.recompute = RecomputeName(
        config.recompute_modes().empty()
            ? Recompute::kNone
            : RecomputeFromProto(static_cast<v1::RecomputeMode>(config.recompute_modes(0))));
    for (const MiniBatch& mb : sample_) {
      for (const SampleLengths& l : mb.lengths) {
        PlanReport::MicroBatchShape shape;
        shape.rows = 1;
        shape.input_len = l.input;
        shape.target_len = l.target;
        alone.micro_batch_shapes.push_back(std::move(shape));
      }
    }
    return alone;
  }

  // Layouts whose stages carry equal work, with their busiest stage's work
  // (T5: every encoder / decoder stage count, sorted by it).
  std::vector<std::pair<double, LayerLayout>> Balanced(uint32_t stages) const {
    std::vector<std::pair<double, LayerLayout>> balanced;
    if (!t5_) {
      balanced.emplace_back(
          0, GptLayout(StackSplit(counts_.encoder_layers, stages, work_.encoder_layer,
                                  work_.encoder_embedding, work_.postprocess)));
      return balanced;
    }
    for (uint32_t e = 1; e < stages; ++e) {
      const uint32_t d = stages - e;
      if (counts_.encoder_layers < e || counts_.decoder_layers < d) continue;
      const LayerLayout l = T5Layout(
          StackSplit(counts_.encoder_layers, e, work_.encoder_layer, work_.encoder_embedding, 0),
          StackSplit(counts_.decoder_layers, d, work_.decoder_layer, work_.decoder_embedding,
                     work_.postprocess));
      balanced.emplace_back(BusiestStageWork(l, work_), l);
    }
    std::stable_sort(balanced.begin(), balanced.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return balanced;
  }

  bool Seen(const LayerLayout& layers) const {
    return std::any_of(candidates_.begin(), candidates_.end(),
                       [&](const LayoutCandidate& c) { return c.layers == layers; });
  }

  const Planner& planner_;
  std::span<const MiniBatch> sample_;
  const LayoutSearchOptions& options_;
  const LayerCounts counts_;
  const bool t5_;
  std::vector<LayoutCandidate>& candidates_;
  ComponentWork work_;
};

}  // namespace

absl::StatusOr<LayoutChoice> ChooseStageLayout(const Planner& planner,
                                               std::span<const MiniBatch> sample,
                                               const LayoutSearchOptions& options) {
  if (sample.empty()) {
    return absl::InvalidArgumentError("choosing a stage layout needs sampled mini-batches");
  }
  const v1::ParallelismConfig& p = planner.config().parallelism();
  const uint32_t stages = std::max(1u, p.pipeline()) * std::max(1u, p.virtual_chunks());
  absl::StatusOr<LayerLayout> even =
      EvenLayerLayout(LayerCountsOf(planner.config().model()), stages);
  if (!even.ok()) return even.status();
  LayoutChoice choice;
  choice.even = *even;
  choice.sampled_mini_batches = static_cast<int>(sample.size());
  LayoutSearch search(planner, sample, options, choice);
  search.EvaluateEven(*even);
  search.ProposeBalanced(stages);
  search.EvaluateFrom(1);
  for (int round = 0; round < options.max_local_rounds; ++round) {
    if (!search.LocalRound()) break;
  }
  const std::vector<LayoutCandidate>& candidates = choice.candidates;
  const int best = search.BestIndex();
  if (best < 0) {
    std::vector<std::string> reasons;
    for (const LayoutCandidate& c : candidates) {
      reasons.push_back(absl::StrCat(c.layers.ToString(), ": ", c.reason));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "no stage layout plans every sampled mini-batch: ", absl::StrJoin(reasons, "; ")));
  }
  choice.chosen = candidates[best].layers;
  choice.chosen_mean_ms = candidates[best].mean_iteration_ms;
  choice.even_mean_ms = candidates.front().feasible ? candidates.front().mean_iteration_ms : 0;
  return choice;
}

}  // namespace varipipe::planner
