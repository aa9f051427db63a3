// MicroBatchCostModel: the predicted time and memory of one micro-batch on
// the pipeline's bottleneck device, from the component grids of a CostModel
// and the stage layout (DynaPipe section 4: t(M) = t_f(M) + t_b(M)).
//
// A device's cost is the sum over the components it holds (layers times
// their count, plus embedding and LM head where they sit); its peak memory is
// the sum of everything stored plus the largest transient of one component
// (peak - stored). A stage also keeps, once per stack it holds, the
// layout's PositionBiasBytes (T5V11's position bias; zero otherwise).
// The micro-batch's time is the largest device time: for T5 with encoder and
// decoder on different devices, the slower side.
//
// Packed rows whose samples attend only over themselves (PackedAttention
// PER_SAMPLE) are priced from the attention-core grid when the cost model
// has one: each layer's cost is its cost at the row length, minus the core
// over the whole rows, plus the core of every sample on its own (a T5
// decoder layer: its causal self-attention over the targets and its cross-
// attention, whose core over t_i x s_i queries and keys is priced as a
// square of side sqrt(t_i * s_i)). Stored bytes change by the same
// difference. The samples' backwards run one after another, so the layer's
// transient loses the rows' core's share of it and gains the largest
// sample's (CoreTransient: a core's peak less its stored bytes and its
// output and output gradient, which are the layer's; at least that
// sample's). With recomputation the core's stored part is not kept and its
// forward runs again in the backward: under selective recomputation of the
// explicit kernel a core's transient includes its re-made stored bytes,
// under full recomputation the layer's re-run holds every sample's core at
// once (the stored difference moves into the transient). Without the grid
// a packed row is priced as one sequence of its padded length (an upper
// bound).
//
// The postprocess (final norm, LM head and loss) runs on the labelled
// tokens only (docs/models.md "The loss head"); its grid is measured with
// every position labelled. Given n labelled tokens of b rows padded to s
// (GPT: s the sequence, T5: the target), the head's times and transient
// are read at the equivalent point (b, n / b), whose b * (n / b) = n
// positions are all labelled, and its stored bytes are those at (b, s) less
// HeadLabelledTokenBytes (analytic_model.h) per unlabelled position
// (kept as at (b, s) when the cost model has no profiled dims). For the
// analytic model this is AnalyticHeadCost exactly where n / b is a grid
// length; below the grid's shortest length the point is clamped (an upper
// bound). Callers without per-sample counts pass kEveryPosition (n = b s).
// The head holds one chunk's logits at a time (docs/models.md, "The loss
// head"): where the job's chunk (training.loss_chunk_tokens, carried by the
// StageLayout) differs from the one the grid was measured with (a
// profile's: the default), the transient changes by
// HeadChunkTransientBytes of min(n, job chunk) - min(n, grid chunk) tokens.
//
// Thread safety: immutable; const methods may run concurrently. Rows are
// caller-owned scratch objects.
#ifndef VARIPIPE_PLANNER_COST_MICRO_BATCH_COST_H_
#define VARIPIPE_PLANNER_COST_MICRO_BATCH_COST_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/stage_cost.h"

namespace varipipe::planner {

struct MicroBatchCost {
  double forward_ms = 0;   // bottleneck device
  double backward_ms = 0;  // bottleneck device
  double time_ms = 0;      // forward + backward of the bottleneck device
  // Memory of the device closest to its room. Without SetDeviceRoom: the
  // largest per-device value in bytes. With it: each device's bytes scaled
  // by reference / room(device), so that one limit in reference bytes
  // checks every device against its own room.
  double stored_bytes = 0;     // stored activation
  double peak_bytes = 0;       // stored + largest transient of one component
  double transient_bytes = 0;  // largest transient (peak - stored) of any device
  // Under a 1F1B-like schedule device d holds up to c - d micro-batches at
  // once (DepthOf): the largest depth(d) * stored(d) (reference bytes).
  double depth_stored_bytes = 0;
  // Per device class (kFirstDevice, kFirstDecoderDevice, kLastDevice; 0
  // where the layout has no such class): stored and transient bytes.
  std::array<double, 3> class_stored_bytes{};
  std::array<double, 3> class_transient_bytes{};
  std::array<double, 3> class_time_ms{};  // forward + backward
};

// The device classes of MicroBatchCost: device 0, T5's first decoder
// device, the last device. Every other device holds a subset of one class's
// components, at least as much room and fewer micro-batches in flight.
enum DeviceClass { kFirstDevice = 0, kFirstDecoderDevice = 1, kLastDevice = 2 };

// The samples of a micro-batch's packed rows that compute attention per
// sample: each sample's own token counts, unpadded (GPT: its sequence as
// `input`; T5: input and target).
struct PackedSamples {
  uint32_t rows = 0;
  struct Lengths {
    uint32_t input = 0;
    uint32_t target = 0;
  };
  std::vector<Lengths> samples;
  // Priced per sample only where that is faster for the whole model
  // (PerSampleIsFaster); otherwise as one sequence of the padded length,
  // the block-diagonal mask's cost (PackedAttention FASTEST_PER_MICRO_BATCH).
  bool only_if_faster = false;
};

// How a job's packed rows are priced (config.proto PackedAttention).
enum class PackedAttentionPricing { kBlockDiagonalMask, kPerSample, kFastest };

class MicroBatchCostModel {
 public:
  // A labelled-token count meaning every position carries a label.
  static constexpr double kEveryPosition = -1;
  // A labelled-token count asking for a lower bound of the head over every
  // count n in [0, b s]: its stored bytes at n = 0, and each time and the
  // transient at most their least over the grid's length points below s
  // (and s itself), where the equivalent point's linear interpolation has
  // its minimum; between b-axis points each is bounded by interpolating
  // the two sizes' least values (linear in b). So the micro-batch's cost at
  // kLeastHead is at most its cost at any labelled count (the DP's bounds).
  static constexpr double kLeastHead = -2;

  // REQUIRES: `model` outlives the result. Fails when a grid the layout
  // needs is missing.
  static absl::StatusOr<MicroBatchCostModel> Create(const CostModel& model,
                                                    const StageLayout& layout, Recompute recompute,
                                                    uint32_t tensor_parallel);

  // Cost of `b` samples padded to (input_len, target_len); target_len is
  // ignored for decoder-only models. False when outside the cost model.
  bool Evaluate(uint32_t b, uint32_t input_len, uint32_t target_len, MicroBatchCost* out) const;
  // The same for packed rows (b == packed.rows) computing attention per
  // sample; packed == nullptr is the call above.
  bool Evaluate(uint32_t b, uint32_t input_len, uint32_t target_len, const PackedSamples* packed,
                MicroBatchCost* out) const {
    return Evaluate(b, input_len, target_len, packed, kEveryPosition, out);
  }
  // The same with `labelled_tokens` of the micro-batch's positions carrying
  // a label (LabelledTokens in planner/microbatch/micro_batch.h; the head's
  // pricing above); kEveryPosition: all of them.
  bool Evaluate(uint32_t b, uint32_t input_len, uint32_t target_len, const PackedSamples* packed,
                double labelled_tokens, MicroBatchCost* out) const;
  // Whether packed rows are priced per sample (the cost model has an
  // attention-core grid); otherwise `packed` arguments change nothing.
  bool prices_per_sample_attention() const { return attention_core_ != nullptr; }
  // Whether per-sample attention over `packed` (rows padded to input_len,
  // target_len) takes no longer, summed over every layer of the model, than
  // attention over the whole rows. False without an attention-core grid.
  bool PerSampleIsFaster(const PackedSamples& packed, uint32_t input_len,
                         uint32_t target_len) const;

  // What one stack's position bias (T5V11) adds to a stage holding its
  // layers: stored bytes (StageLayout::PositionBiasBytes) and its gradient,
  // a transient beside the layers' (PositionBiasGradientBytes).
  struct StackBias {
    double stored = 0;
    double gradient = 0;
  };

  // Scratch for many evaluations at fixed lengths (the DP's inner loop).
  class Row {
   private:
    friend class MicroBatchCostModel;
    const MicroBatchCostModel* model_ = nullptr;
    ProfileGrid::BatchRow encoder_;
    ProfileGrid::BatchRow decoder_;
    ProfileGrid::BatchRow encoder_embedding_;
    ProfileGrid::BatchRow decoder_embedding_;
    ProfileGrid::BatchRow postprocess_;
    uint32_t head_len_ = 0;  // the postprocess's length (GPT: input, T5: target)
    // The position bias of the row's encoder (GPT: sequence) and decoder
    // lengths.
    StackBias encoder_bias_;
    StackBias decoder_bias_;
  };
  bool PrepareRow(uint32_t input_len, uint32_t target_len, Row* row) const;
  // Same result as Evaluate(b, input_len, target_len) for the row's lengths.
  bool Evaluate(const Row& row, uint32_t b, MicroBatchCost* out) const {
    return Evaluate(row, b, kEveryPosition, out);
  }
  // The same with `labelled_tokens` labelled positions (see above).
  bool Evaluate(const Row& row, uint32_t b, double labelled_tokens, MicroBatchCost* out) const;

  // The device holding the postprocess, summed without it, and how it
  // merges (its class's memory scale, depth and slot).
  struct PendingDevice {
    double forward_ms = 0;
    double backward_ms = 0;
    double stored = 0;
    double transient = 0;
    double bias_gradient = 0;
    double scale = 1;
    double depth = 1;
    int slot = 0;
  };
  // A row's components at one micro-batch size, looked up and combined
  // once but for the head, for many labelled counts (the DP's runs of one
  // padded length and size differ only in their labelled tokens).
  class Batch {
   private:
    friend class MicroBatchCostModel;
    MicroBatchCost others_;  // the devices without the postprocess
    PendingDevice pending_;
    CostValues postprocess_;
    uint32_t b_ = 0;
    uint32_t head_len_ = 0;
  };
  // False when b lies beyond the grids.
  bool PrepareBatch(const Row& row, uint32_t b, Batch* batch) const;
  // Same result as Evaluate(row, b, labelled_tokens, out).
  bool Evaluate(const Batch& batch, double labelled_tokens, MicroBatchCost* out) const;

  // Per-stage costs of `b` samples padded to (input_len, target_len) when
  // the model is split into `stages` = devices * chunks stages (the
  // layout's layers, StageLayout::StageEncoderLayers; looped placement; T5:
  // encoder stages first). Activation
  // sizes use `hidden` and `dtype_bytes`. False when outside the cost model.
  bool EvaluateStages(uint32_t b, uint32_t input_len, uint32_t target_len, uint32_t chunks,
                      uint32_t hidden, uint32_t dtype_bytes, std::vector<StageOpCost>* out) const {
    return EvaluateStages(b, input_len, target_len, nullptr, chunks, hidden, dtype_bytes, out);
  }
  bool EvaluateStages(uint32_t b, uint32_t input_len, uint32_t target_len,
                      const PackedSamples* packed, uint32_t chunks, uint32_t hidden,
                      uint32_t dtype_bytes, std::vector<StageOpCost>* out) const {
    return EvaluateStages(b, input_len, target_len, packed, kEveryPosition, chunks, hidden,
                          dtype_bytes, out);
  }
  // The same with the head priced at `labelled_tokens` (Evaluate above).
  bool EvaluateStages(uint32_t b, uint32_t input_len, uint32_t target_len,
                      const PackedSamples* packed, double labelled_tokens, uint32_t chunks,
                      uint32_t hidden, uint32_t dtype_bytes, std::vector<StageOpCost>* out) const;

  // Per-device memory (DynaPipe section 4, memory limits): `room[d]` is
  // pipeline device d's activation room (its limit minus its own model
  // state); Evaluate then reports memory in units of `reference` bytes
  // (see MicroBatchCost). Each device class of Combine (first, last, T5's
  // first decoder device) is scaled by its own device's room; devices
  // between them hold a subset of the components and at least as much
  // room, so they never bind first. REQUIRES: room.size() == devices, all
  // positive.
  void SetDeviceRoom(const std::vector<double>& room, double reference);

  // The micro-batch sizes every grid is sampled at (costs are linear in b
  // between them); null when the grids' b axes differ.
  const std::vector<uint32_t>* BatchAxis() const {
    return shared_b_axis_ ? &encoder_->micro_batch_sizes() : nullptr;
  }

  // Micro-batches each device class holds at once under 1F1B (c - d for
  // device d): c, c - encoder devices (T5), 1.
  const std::array<double, 3>& ClassDepths() const { return depth_; }

  const StageLayout& layout() const { return layout_; }
  Recompute recompute() const { return recompute_; }

 private:
  MicroBatchCostModel() = default;
  bool Combine(const CostValues& encoder, const CostValues& decoder,
               const CostValues& encoder_embedding, const CostValues& decoder_embedding,
               const CostValues& postprocess, const StackBias& encoder_bias,
               const StackBias& decoder_bias, MicroBatchCost* out) const;
  // Combine in two steps: every device but the one holding the postprocess
  // merged into *others, that one summed into *pending; then the
  // postprocess added to it and merged (Combine's result, in its order).
  void CombineBesidesHead(const CostValues& encoder, const CostValues& decoder,
                          const CostValues& encoder_embedding, const CostValues& decoder_embedding,
                          const StackBias& encoder_bias, const StackBias& decoder_bias,
                          MicroBatchCost* others, PendingDevice* pending) const;
  static void FinishWithHead(const MicroBatchCost& others, const PendingDevice& pending,
                             const CostValues& postprocess, MicroBatchCost* out);
  // The position bias of a stack of sequence length s.
  StackBias BiasOf(uint32_t s) const;
  // Each component's costs at `row`'s lengths for `b` rows.
  struct Components {
    CostValues encoder;
    CostValues decoder;
    CostValues encoder_embedding;
    CostValues decoder_embedding;
    CostValues postprocess;
  };
  bool LookupComponents(const Row& row, uint32_t b, Components* c) const;
  // Reprices `head`, the postprocess of `b` rows of `head_len` positions,
  // for `labelled` labelled tokens (the header's rule; kLeastHead: its
  // least), and its transient for the job's loss chunk.
  void PriceLabelled(uint32_t b, uint32_t head_len, double labelled, CostValues* head) const;
  // The same at the grid's chunk: unchanged for kEveryPosition, b *
  // head_len or more, or an infeasible equivalent point.
  void PriceLabelledAtGridChunk(uint32_t b, uint32_t head_len, double labelled,
                                CostValues* head) const;
  // What per-sample attention changes in one layer: `cost` its times and
  // stored bytes (peak unused), `transient` its transient (peak - stored);
  // and the parts they are made of (Fold, Finish).
  struct LayerChange {
    CostValues cost;
    double transient = 0;
    double stored = 0;            // the cores' stored bytes, samples' less rows'
    double whole_transient = 0;   // the rows' largest core transient
    double sample_transient = 0;  // the samples' largest core transient
  };
  // One core's part of a LayerChange.
  struct CoreChange {
    double forward_ms = 0;   // with the recomputation's forward
    double backward_ms = 0;
    double stored = 0;       // the samples' cores less the rows'
    double whole_transient = 0;
    double sample_transient = 0;
  };
  // Whether the recompute mode re-runs the core in the backward instead of
  // keeping what it stores (full; selective but for the fused kernel).
  bool RecomputesCore() const {
    return recompute_ == Recompute::kFull ||
           (recompute_ == Recompute::kSelective && !fused_attention_);
  }
  // What one core of the grid, at `rows` rows of `side` tokens, adds to its
  // layer's transient: its peak less its stored bytes and its output and
  // output gradient (the layer's), plus for the rows' core (`whole_rows`)
  // under selective recomputation of the explicit kernel its stored bytes
  // (re-made in the backward).
  double CoreTransient(const CostValues& core, double rows, double side, bool whole_rows) const;
  // The change per-sample attention over `packed` makes to one encoder
  // layer (GPT: layer) and one decoder layer at the padded lengths. False
  // when there is no attention-core grid or a core lookup is infeasible.
  bool PerSampleDeltas(const PackedSamples& packed, uint32_t input_len, uint32_t target_len,
                       LayerChange* encoder, LayerChange* decoder) const;
  static void Fold(const CoreChange& core, LayerChange* layer);
  void Finish(LayerChange* layer) const;
  // Whether the changes shorten the whole model (every layer of each
  // stack); ties count as faster.
  bool Faster(const LayerChange& encoder, const LayerChange& decoder) const;
  // Applies PerSampleDeltas to `encoder` and `decoder`. False (nothing
  // changed) when they are unavailable, or with packed.only_if_faster when
  // per sample is slower.
  bool PricePerSample(const PackedSamples& packed, uint32_t input_len, uint32_t target_len,
                      CostValues* encoder, CostValues* decoder) const;
  // What replacing the core over `rows` rows of `full` tokens by the cores
  // of `lengths` (one per sample) changes in a layer, under recompute_.
  // With `one_launch` the samples' cores are one launch: its time and
  // transient are the core's over `rows` rows of side sqrt(sum l_i^2 /
  // rows) (the same score area, so the same FLOPs, and one launch's
  // overhead); stored bytes are the samples' sum either way.
  bool CoreDifference(uint32_t rows, double full, const std::vector<double>& lengths,
                      bool one_launch, CoreChange* change) const;

  StageLayout layout_;
  uint32_t total_encoder_layers_ = 0;
  uint32_t total_decoder_layers_ = 0;
  Recompute recompute_ = Recompute::kNone;
  uint32_t tensor_parallel_ = 1;
  const ProfileGrid* encoder_ = nullptr;
  const ProfileGrid* decoder_ = nullptr;    // T5 only
  const ProfileGrid* embedding_ = nullptr;  // optional
  const ProfileGrid* postprocess_ = nullptr;
  const ProfileGrid* attention_core_ = nullptr;  // optional, RECOMPUTE_NONE
  // The layers without recomputation (optional): a fully recomputed
  // packed layer's backward re-runs them (PricePerSample).
  const ProfileGrid* encoder_none_ = nullptr;
  const ProfileGrid* decoder_none_ = nullptr;
  // HeadLabelledTokenBytes of the profiled dims; 0 without them.
  double head_token_bytes_ = 0;
  // Bytes of one token of an attention core's output (its heads' width on
  // this tensor rank, compute dtype); 0 without profiled dims.
  double core_output_token_bytes_ = 0;
  // The head's token chunk the postprocess grid was measured or computed
  // with, the job's (StageLayout::loss_chunk_tokens; 0: the grid's), and
  // the transient bytes of one token's logits (HeadChunkTransientBytes).
  double grid_chunk_tokens_ = 0;
  double job_chunk_tokens_ = 0;
  double chunk_token_bytes_ = 0;
  // kLeastHead: at [b index * s points + s index] the least forward,
  // backward and transient of the postprocess grid's points (b, s_0..s_k)
  // (+infinity where all are infeasible).
  std::vector<std::array<double, 3>> least_head_;
  // A fused kernel keeps no scores: selective recomputation changes nothing
  // in its core.
  bool fused_attention_ = false;
  // The executor runs packed rows' attention as one variable-length kernel
  // call per layer (FlashAttention: the FUSED kernel, a 2-byte compute
  // dtype; docs/executor.md), but for attention with a position bias
  // (T5V11's self-attention, biased_self_attention_), which runs one call
  // per sample.
  bool variable_length_kernel_ = false;
  bool biased_self_attention_ = false;
  // All grids share the encoder grid's b axis: one LocateBatch serves every
  // component.
  bool shared_b_axis_ = false;
  // Memory scale of each device class (1: bytes).
  double first_scale_ = 1;          // device 0
  double first_decoder_scale_ = 1;  // T5: first decoder device
  double last_scale_ = 1;           // last device
  std::array<double, 3> depth_{1, 1, 1};
  // Per device class: its devices [first, second) and the most layers of
  // its stack any of them holds (GPT: [0, c - 1) and c - 1; T5: the encoder
  // devices, the decoder devices before the last, the last).
  std::array<std::pair<uint32_t, uint32_t>, 3> class_devices_{};
  std::array<uint32_t, 3> class_layers_{};
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_MICRO_BATCH_COST_H_
