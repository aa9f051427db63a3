// The analytic cost model: component costs computed from the model
// dimensions and a hardware description, tabulated on the same kind of grid
// a profiler would measure (powers of two). Used by tests, benchmarks and the
// demo when no profile exists. docs/cost-model.md derives every formula.
//
// Time of one pass = matrix FLOPs / (peak * efficiency(b * s))
//                  + elementwise bytes / memory bandwidth + fixed overhead.
// Backward = 2 x forward; recomputation adds forward work to the backward.
// Activation memory follows Korthikanti et al., "Reducing Activation
// Recomputation in Large Transformer Models" (2022), section 4, generalised to
// attention width heads*kv_channels != hidden and ffn != 4*hidden, to the
// LLAMA architecture (grouped-query K/V width, SwiGLU's three matrices, no
// biases, dropout or position table; docs/cost-model.md, "LLAMA") and to
// T5V11 (gated-GELU MLP, no biases, dropout or position table, a relative
// position bias kept once per stage and stack; docs/cost-model.md, "T5V11").
#ifndef VARIPIPE_PLANNER_COST_ANALYTIC_MODEL_H_
#define VARIPIPE_PLANNER_COST_ANALYTIC_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/model_dims.h"

namespace varipipe::planner {

// How a tensor group talks (docs/cost-model.md, "Tensor parallelism"): its
// link, which carries the layers' all-reduces (ring: 2 (t - 1) / t of the
// bytes each way, 2 (t - 1) steps of latency; sequence parallelism's
// all-gather and reduce-scatter move the same bytes), and whether the norms
// and residual stream hold 1/t of the sequence. The executor's collectives
// run in fp32 whatever the model dtype.
struct TensorLink {
  double gbps = 0;  // 0: communication is free (tensor_parallel 1 never communicates)
  bool sequence_parallel = false;
};

struct AnalyticGridOptions {
  // The grid covers micro-batch sizes up to this (rounded up to a power of
  // two) and sequence lengths up to max_seq_len (likewise; at least 8).
  uint32_t max_micro_batch_size = 8192;
  uint32_t max_seq_len = 2048;
  // Tensor-parallel degrees to tabulate, and the tensor group's link.
  std::vector<uint32_t> tensor_parallel_degrees = {1};
  TensorLink tensor_link;
};

// Exact analytic costs of one component for one micro-batch (no grid).
// `s` is the component's own sequence; `encoder_s` is used by decoder layers
// (cross-attention) only.
CostValues AnalyticComponentCost(const ModelDims& dims, const Hardware& hw, Component component,
                                 Recompute recompute, uint32_t tensor_parallel, double b, double s,
                                 double encoder_s, const TensorLink& link = {});

// The postprocess (final norm, LM head and loss) of `b` rows of `s`
// positions of which `labelled` carry a label: AnalyticComponentCost's
// kPostprocess is this with labelled = b * s. Time and transient depend on
// `labelled` only; stored = (B h + 8) b s + HeadLabelledTokenBytes * labelled.
CostValues AnalyticHeadCost(const ModelDims& dims, const Hardware& hw, uint32_t tensor_parallel,
                            double b, double s, double labelled, const TensorLink& link = {});

// Bytes the head stores per labelled token: its gathered rows (the norm's
// input and the head's), 2 B h, and the token's position, label, column,
// log-sum-exp and masks.
double HeadLabelledTokenBytes(const ModelDims& dims);

// The head's token chunk on one tensor rank: LossChunkTokens
// (common/loss_head_chunk.h) of dims.loss_chunk_tokens and the rank's
// vocabulary rows V_r.
double HeadLossChunkTokens(const ModelDims& dims, uint32_t tensor_parallel);
// The head's transient while `tokens` labelled tokens' logits are alive
// (one chunk: min(n, chunk)): tokens * V_r * (4 + 2 B below fp32) bytes
// (fp32 logits; below fp32 also the GEMM's output and the gradient cast
// back).
double HeadChunkTransientBytes(const ModelDims& dims, uint32_t tensor_parallel, double tokens);

// Milliseconds of one ring all-reduce of `bytes` over `t` ranks on `link`
// (0 for one rank or a free link).
double TensorAllReduceMs(const TensorLink& link, uint32_t t, double bytes);

// Forward matrix FLOPs of one layer (no recomputation).
double EncoderLayerForwardFlops(const ModelDims& dims, double b, double s, uint32_t tp);
double DecoderLayerForwardFlops(const ModelDims& dims, double b, double s, double encoder_s,
                                uint32_t tp);
// Activation bytes one layer keeps for its backward pass; with
// `sequence_parallel` (and tp > 1) the norms' inputs, the dropout masks and a
// fully recomputed layer's input hold 1/tp of the sequence (Korthikanti et
// al. 2022, section 4.2.2). The column-parallel projections' gathered inputs
// stay whole: the executor keeps them for the weight gradients.
double EncoderLayerStoredBytes(const ModelDims& dims, Recompute recompute, double b, double s,
                               uint32_t tp, bool sequence_parallel = false);
double DecoderLayerStoredBytes(const ModelDims& dims, Recompute recompute, double b, double s,
                               double encoder_s, uint32_t tp, bool sequence_parallel = false);
// Parameters of one instance of a component at tensor-parallel degree tp,
// as the executor's model holds them (executor/model/): the embedding has
// `positions` learned position rows besides the vocabulary's (MEGATRON; LLAMA
// and T5V11 have no position table and ignore `positions`). The LM head
// (postprocess) is counted on the last stage; a tied LLAMA head is the
// embedding's tensor and adds only its final norm. T5V11's relative bias
// tables and final encoder norm belong to stages, not components
// (StageLayout, memory_model.h).
double ComponentParameters(const ModelDims& dims, Component component, uint32_t tp,
                           uint32_t positions);

// The weights and biases of the component's linear layers at degree tp:
// what the executor keeps one compute-dtype copy of under mixed precision
// (memory_model.h, StageLayout::compute_copy_bytes). A layer's parameters
// less its norms; the LM head's weight [V_r, h], tied or not (postprocess);
// none for the embedding (a lookup) and the attention core.
double LinearParameters(const ModelDims& dims, Component component, uint32_t tp);

// The tabulated model: grids for every component the model kind needs, all
// three recompute modes, each requested tensor-parallel degree, and the
// attention core (RECOMPUTE_NONE) that prices packed rows per sample.
absl::StatusOr<CostModel> BuildAnalyticCostModel(const ModelDims& dims, const Hardware& hw,
                                                 const AnalyticGridOptions& options);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_ANALYTIC_MODEL_H_
