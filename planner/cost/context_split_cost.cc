#include "planner/cost/context_split_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/plan_contract/context_parallel_split.h"
#include "planner/cost/analytic_model.h"

namespace varipipe::planner {
namespace {

// Causal pairs of the query chunk [a, b): sum_{p = a}^{b - 1} (p + 1).
int64_t ChunkPairs(int64_t a, int64_t b) { return (b * (b + 1) - a * (a + 1)) / 2; }

// The side of a square of the chunk's score area: a causal sequence of
// length s does s^2 / 2 pairs, so 2 * pairs = side^2.
double PseudoSide(int64_t pairs) { return std::sqrt(2.0 * static_cast<double>(pairs)); }

}  // namespace

absl::StatusOr<ContextSplitCostModel> ContextSplitCostModel::Create(
    const MicroBatchCostModel& whole, const CostModel& model, const ModelDims& dims,
    uint32_t context, const ContextSplitOptions& options) {
  if (context < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a split micro-batch needs a context group of at least 2 lanes (got ", context, ")"));
  }
  if (dims.encoder_decoder() || whole.layout().encoder_decoder) {
    return absl::InvalidArgumentError(
        "context-parallel costs cover decoder-only models (GPT, Llama); T5's encoder and "
        "cross-attention keys are not split (parallelism.context)");
  }
  ContextSplitCostModel m;
  m.whole_ = &whole;
  m.dims_ = dims;
  m.context_ = context;
  m.gather_step_ = m.reduce_scatter_step_ = options.link;
  if (const std::optional<CommunicationCosts>& measured = model.communication();
      measured.has_value() && !options.spans_nodes) {
    m.gather_step_ = measured->all_gather_step.value_or(measured->p2p);
    m.reduce_scatter_step_ = measured->reduce_scatter_step.value_or(measured->p2p);
  }
  m.core_grid_ = whole.prices_per_sample_attention();
  m.ideal_ = options.ideal;
  if (options.hardware.has_value()) {
    m.hardware_ = *options.hardware;
  } else {
    absl::StatusOr<Hardware> preset = HardwarePreset("a100-40gb");
    if (!preset.ok()) return preset.status();
    m.hardware_ = *preset;
  }
  // K and V heads on one tensor rank (a group with fewer key/value heads
  // than ranks replicates them: at least one head each).
  const uint32_t t = std::max<uint32_t>(1, whole.layout().tensor_parallel);
  const uint32_t kv_heads = std::max<uint32_t>(1, (dims.key_value_heads() + t - 1) / t);
  m.kv_bytes_per_token_ = 2.0 * kv_heads * dims.kv_channels * dims.dtype_bytes;
  m.kv_gradient_bytes_per_token_ = 2.0 * kv_heads * dims.kv_channels * sizeof(float);
  return m;
}

ContextLane ContextSplitCostModel::SlowestLane(const std::vector<uint32_t>& lengths,
                                               uint32_t context) {
  const int c = static_cast<int>(std::max<uint32_t>(1, context));
  ContextLane slowest;
  bool first = true;
  int64_t most_local = 0;
  for (int r = 0; r < c; ++r) {
    ContextLane lane;
    lane.lane = static_cast<uint32_t>(r);
    for (const uint32_t length : lengths) {
      for (const int j : {r, 2 * c - 1 - r}) {
        const int64_t a = ContextParallelSplit::ChunkBegin(length, c, j);
        const int64_t b = ContextParallelSplit::ChunkBegin(length, c, j + 1);
        if (b <= a) continue;
        lane.local_tokens += b - a;
        const int64_t pairs = ChunkPairs(a, b);
        lane.causal_pairs += pairs;
        lane.key_prefix_tokens += b;
        lane.chunk_pairs.push_back(pairs);
      }
    }
    most_local = std::max(most_local, lane.local_tokens);
    if (first || lane.causal_pairs > slowest.causal_pairs) {
      slowest = std::move(lane);
      first = false;
    }
  }
  slowest.padded_tokens = most_local;
  return slowest;
}

double ContextSplitCostModel::GatherMs(double padded_tokens) const {
  // Two rings (K, V) of c - 1 steps, each passing one lane's A tokens on.
  const double steps = 2.0 * (context_ - 1);
  return steps * gather_step_.TransferMs(padded_tokens * kv_bytes_per_token_ / 2);
}

double ContextSplitCostModel::ReduceScatterMs(double padded_tokens) const {
  const double steps = 2.0 * (context_ - 1);
  return steps * reduce_scatter_step_.TransferMs(padded_tokens * kv_gradient_bytes_per_token_ / 2);
}

// The most rows a lane's tokens are cut into to stay within the grids.
constexpr uint32_t kMaxLaneRows = 64;

bool ContextSplitCostModel::EvaluateStages(const std::vector<uint32_t>& lengths,
                                           double labelled_tokens, uint32_t chunks, uint32_t hidden,
                                           uint32_t dtype_bytes,
                                           std::vector<StageOpCost>* out) const {
  if (lengths.empty()) return false;
  double total = 0;
  for (const uint32_t l : lengths) {
    if (l == 0) return false;
    total += l;
  }
  const ContextLane lane = SlowestLane(lengths, context_);
  const double a_tokens = static_cast<double>(lane.padded_tokens);
  if (lane.padded_tokens > UINT32_MAX) return false;
  const uint32_t padded = static_cast<uint32_t>(lane.padded_tokens);
  // The lane's labelled tokens: its share of the group's, at most A (its
  // padding carries none).
  double labelled = labelled_tokens;
  if (labelled_tokens == MicroBatchCostModel::kEveryPosition) {
    labelled = static_cast<double>(lane.local_tokens);
  } else if (labelled_tokens >= 0) {
    labelled = std::min(a_tokens, labelled_tokens * a_tokens / total);
  }
  const Recompute recompute = whole_->recompute();
  const bool fused = dims_.attention_kernel == AttentionKernel::kFused;
  const bool full = recompute == Recompute::kFull;
  const bool core_recomputed = full || (recompute == Recompute::kSelective && !fused);

  // The lane's A tokens as one row; where A is longer than the cost
  // model's grids reach (the job's longest sequence), as the fewest rows of
  // at most a grid length each: the layers' work per token is the same, and
  // attention is priced per query chunk either way.
  PackedSamples packed;
  if (core_grid_) {
    // One pseudo-sample per query chunk, of the chunk's score area.
    packed.samples.reserve(lane.chunk_pairs.size());
    for (const int64_t pairs : lane.chunk_pairs) {
      packed.samples.push_back(
          {.input = static_cast<uint32_t>(std::max(1.0, std::round(PseudoSide(pairs))))});
    }
  }
  bool priced = false;
  for (uint32_t rows = 1; rows <= kMaxLaneRows && !priced; ++rows) {
    const uint32_t length = (padded + rows - 1) / rows;
    packed.rows = rows;
    priced = whole_->EvaluateStages(rows, length, 0, core_grid_ ? &packed : nullptr, labelled,
                                    chunks, hidden, dtype_bytes, out);
  }
  if (!priced) return false;
  const uint32_t t = std::max<uint32_t>(1, whole_->layout().tensor_parallel);
  // Without a core grid: each layer's core over the A-token row replaced by
  // the analytic core of the lane's chunks (the difference, as
  // MicroBatchCostModel::CoreDifference makes it).
  CostValues core_delta;
  if (!core_grid_) {
    const auto core = [&](double s) {
      return AnalyticComponentCost(dims_, hardware_, Component::kAttentionCore, Recompute::kNone, t,
                                   1, s, 0);
    };
    const CostValues row = core(a_tokens);
    CostValues sum;
    double area = 0;
    for (const int64_t pairs : lane.chunk_pairs) {
      const CostValues one = core(PseudoSide(pairs));
      sum.forward_ms += one.forward_ms;
      sum.backward_ms += one.backward_ms;
      sum.stored_bytes += one.stored_bytes;
      area += 2.0 * static_cast<double>(pairs);
    }
    if (fused && dims_.dtype_bytes == 2) {
      // One variable-length launch over every chunk.
      const CostValues launch = core(std::sqrt(area));
      sum.forward_ms = launch.forward_ms;
      sum.backward_ms = launch.backward_ms;
    }
    core_delta.forward_ms = sum.forward_ms - row.forward_ms;
    core_delta.backward_ms = sum.backward_ms - row.backward_ms;
    if (core_recomputed) {
      core_delta.backward_ms += core_delta.forward_ms;
    } else {
      core_delta.stored_bytes = sum.stored_bytes - row.stored_bytes;
    }
  }
  // Per layer: the all-gathers forward, the reduce-scatters backward (and
  // the gathers again under full recomputation); the key prefixes kept.
  const double gather_ms = ideal_ ? 0 : GatherMs(a_tokens);
  const double scatter_ms = ideal_ ? 0 : ReduceScatterMs(a_tokens);
  const double prefix_bytes = static_cast<double>(lane.key_prefix_tokens) * kv_bytes_per_token_;
  // The gathered buffer's gradients, summed in fp32.
  const double gathered_bytes = context_ * a_tokens * kv_gradient_bytes_per_token_;
  const double kept_bytes = full ? 0 : prefix_bytes;
  const double transient_bytes = prefix_bytes + gathered_bytes + (full ? prefix_bytes : 0);
  const uint32_t stages = static_cast<uint32_t>(out->size());
  for (uint32_t st = 0; st < stages; ++st) {
    StageOpCost& c = (*out)[st];
    const double layers = whole_->layout().StageEncoderLayers(st, stages);
    if (layers == 0) continue;
    c.forward_ms = std::max(0.0, c.forward_ms + layers * (core_delta.forward_ms + gather_ms));
    c.backward_ms = std::max(0.0, c.backward_ms + layers * (core_delta.backward_ms + scatter_ms +
                                                            (full ? gather_ms : 0)));
    const double stored = layers * (core_delta.stored_bytes + kept_bytes);
    c.stored_bytes = std::max(0.0, c.stored_bytes + stored);
    // The gradients of one layer's keys and values live beside its other
    // transients (an upper bound).
    c.peak_bytes = std::max(c.stored_bytes, c.peak_bytes + stored + transient_bytes);
  }
  return !ideal_ || IdealTimes(lengths, labelled_tokens, chunks, hidden, dtype_bytes, out);
}

bool ContextSplitCostModel::IdealTimes(const std::vector<uint32_t>& lengths, double labelled_tokens,
                                       uint32_t chunks, uint32_t hidden, uint32_t dtype_bytes,
                                       std::vector<StageOpCost>* out) const {
  // The micro-batch on one device: its samples packed into the fewest rows
  // the grids reach, each sample's attention its own.
  PackedSamples packed;
  int64_t total = 0;
  for (const uint32_t l : lengths) {
    packed.samples.push_back({.input = l});
    total += l;
  }
  std::vector<StageOpCost> whole;
  bool priced = false;
  for (uint32_t rows = 1; rows <= static_cast<uint32_t>(lengths.size()) && !priced; ++rows) {
    packed.rows = rows;
    const uint32_t length = static_cast<uint32_t>((total + rows - 1) / rows);
    priced = whole_->EvaluateStages(
        rows, std::max(length, *std::max_element(lengths.begin(), lengths.end())), 0, &packed,
        labelled_tokens, chunks, hidden, dtype_bytes, &whole);
  }
  if (!priced || whole.size() != out->size()) return false;
  for (size_t st = 0; st < out->size(); ++st) {
    (*out)[st].forward_ms = whole[st].forward_ms / context_;
    (*out)[st].backward_ms = whole[st].backward_ms / context_;
    (*out)[st].weight_ms = whole[st].weight_ms / context_;
  }
  return true;
}

}  // namespace varipipe::planner
