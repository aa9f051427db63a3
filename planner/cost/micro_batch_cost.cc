#include "planner/cost/micro_batch_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "planner/cost/analytic_model.h"

namespace varipipe::planner {
namespace {

// Accumulates one device's components.
class DeviceSum {
 public:
  DeviceSum() = default;
  explicit DeviceSum(const MicroBatchCostModel::PendingDevice& p)
      : forward_ms_(p.forward_ms),
        backward_ms_(p.backward_ms),
        stored_(p.stored),
        transient_(p.transient),
        bias_gradient_(p.bias_gradient) {}
  // REQUIRES: no postprocess added.
  MicroBatchCostModel::PendingDevice Pending(double scale, double depth, int slot) const {
    return {.forward_ms = forward_ms_,
            .backward_ms = backward_ms_,
            .stored = stored_,
            .transient = transient_,
            .bias_gradient = bias_gradient_,
            .scale = scale,
            .depth = depth,
            .slot = slot};
  }
  void Add(const CostValues& v, double count) {
    if (count == 0) return;
    forward_ms_ += count * v.forward_ms;
    backward_ms_ += count * v.backward_ms;
    stored_ += count * v.stored_bytes;
    transient_ = std::max(transient_, v.peak_bytes - v.stored_bytes);
  }
  // The postprocess (final norm, LM head, loss): the backward runs it first,
  // with everything stored; the other components run after it, once its
  // stored bytes are freed.
  void AddPostprocess(const CostValues& v) {
    forward_ms_ += v.forward_ms;
    backward_ms_ += v.backward_ms;
    stored_ += v.stored_bytes;
    postprocess_stored_ = v.stored_bytes;
    postprocess_transient_ = v.peak_bytes - v.stored_bytes;
  }
  // What the device keeps besides its components, and a gradient alive
  // beside their transients (a stack's position bias).
  void AddBias(const MicroBatchCostModel::StackBias& bias) {
    stored_ += bias.stored;
    bias_gradient_ += bias.gradient;
  }
  // Bytes kept per micro-batch that no component is charged for (a T5
  // decoder stage's encoder output).
  void AddKept(double bytes) { stored_ += bytes; }
  // One stage's times, stored bytes and peak (its backward's highest point).
  void Into(StageOpCost* out) const {
    out->forward_ms = forward_ms_;
    out->backward_ms = backward_ms_;
    out->stored_bytes = stored_;
    out->peak_bytes = postprocess_transient_ < 0
                          ? stored_ + transient_ + bias_gradient_
                          : std::max(stored_ + postprocess_transient_,
                                     stored_ - postprocess_stored_ + transient_) +
                                bias_gradient_;
  }
  // `scale`: reference bytes per byte of this device (its room's share);
  // `depth`: micro-batches the class holds at once; `slot`: its class.
  void MergeInto(MicroBatchCost* out, double scale, double depth, int slot) const {
    const double time = forward_ms_ + backward_ms_;
    if (time > out->time_ms) {
      out->time_ms = time;
      out->forward_ms = forward_ms_;
      out->backward_ms = backward_ms_;
    }
    // Beyond the stored bytes at the backward's peak.
    const double transient =
        (postprocess_transient_ < 0
             ? transient_
             : std::max(postprocess_transient_, transient_ - postprocess_stored_)) +
        bias_gradient_;
    out->stored_bytes = std::max(out->stored_bytes, scale * stored_);
    out->peak_bytes = std::max(out->peak_bytes, scale * (stored_ + transient));
    out->transient_bytes = std::max(out->transient_bytes, scale * transient);
    out->depth_stored_bytes = std::max(out->depth_stored_bytes, depth * scale * stored_);
    out->class_stored_bytes[slot] = std::max(out->class_stored_bytes[slot], scale * stored_);
    out->class_transient_bytes[slot] =
        std::max(out->class_transient_bytes[slot], scale * transient);
    out->class_time_ms[slot] = std::max(out->class_time_ms[slot], time);
  }

 private:
  double forward_ms_ = 0;
  double backward_ms_ = 0;
  double stored_ = 0;
  double transient_ = 0;
  double postprocess_stored_ = 0;
  double postprocess_transient_ = -1;  // < 0: no postprocess
  double bias_gradient_ = 0;
};

}  // namespace

absl::StatusOr<MicroBatchCostModel> MicroBatchCostModel::Create(const CostModel& model,
                                                                const StageLayout& layout,
                                                                Recompute recompute,
                                                                uint32_t tensor_parallel) {
  MicroBatchCostModel m;
  m.layout_ = layout;
  m.total_encoder_layers_ = layout.encoder_layers;
  m.total_decoder_layers_ = layout.decoder_layers;
  m.recompute_ = recompute;
  m.tensor_parallel_ = std::max<uint32_t>(1, tensor_parallel);
  // Each device class covers a range of devices and takes the most layers
  // any of them holds (and, with SetDeviceRoom, the least room): an upper
  // bound for every device of the class.
  const uint32_t c = layout.devices;
  const auto most = [&](uint32_t begin, uint32_t end, bool decoder) {
    uint32_t n = 0;
    for (uint32_t d = begin; d < end; ++d) {
      n = std::max(n, decoder ? layout.DeviceDecoderLayers(d) : layout.DeviceEncoderLayers(d));
    }
    return n;
  };
  if (c == 1) {
    m.class_devices_ = {{{0, 1}, {0, 1}, {0, 1}}};
    m.class_layers_ = {layout.encoder_layers, layout.decoder_layers, layout.encoder_layers};
  } else if (!layout.encoder_decoder) {
    m.class_devices_ = {{{0, c - 1}, {c - 1, c}, {c - 1, c}}};
    m.class_layers_ = {most(0, c - 1, false), 0, most(c - 1, c, false)};
  } else {
    const uint32_t e = layout.encoder_devices;
    const uint32_t decoder_end = e + 1 == c ? c : c - 1;
    m.class_devices_ = {{{0, e}, {e, decoder_end}, {c - 1, c}}};
    m.class_layers_ = {most(0, e, false), most(e, decoder_end, true), most(c - 1, c, true)};
  }
  if (!layout.shared_device() && layout.devices > 1) {
    m.depth_ = {
        static_cast<double>(layout.devices),
        layout.encoder_decoder ? static_cast<double>(layout.devices - layout.encoder_devices) : 1.0,
        1.0};
  }
  m.encoder_ = model.Grid(Component::kEncoderLayer, recompute, tensor_parallel);
  m.postprocess_ = model.Grid(Component::kPostprocess, recompute, tensor_parallel);
  m.embedding_ = model.Grid(Component::kEmbedding, recompute, tensor_parallel);
  if (m.embedding_ == nullptr) {
    // Recompute does not change the embedding; any mode's grid will do.
    for (Recompute other : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      if (m.embedding_ == nullptr) {
        m.embedding_ = model.Grid(Component::kEmbedding, other, tensor_parallel);
      }
    }
  }
  if (layout.encoder_decoder) {
    m.decoder_ = model.Grid(Component::kDecoderLayer, recompute, tensor_parallel);
  }
  m.attention_core_ = model.Grid(Component::kAttentionCore, Recompute::kNone, tensor_parallel);
  m.encoder_none_ = model.Grid(Component::kEncoderLayer, Recompute::kNone, tensor_parallel);
  if (layout.encoder_decoder) {
    m.decoder_none_ = model.Grid(Component::kDecoderLayer, Recompute::kNone, tensor_parallel);
  }
  if (model.profiled_dims().has_value()) {
    const ModelDims& dims = *model.profiled_dims();
    m.head_token_bytes_ = HeadLabelledTokenBytes(dims);
    // The grid's head ran with the chunk of its dims (a profile: the
    // default; the analytic model: the job's it was built for).
    m.grid_chunk_tokens_ = HeadLossChunkTokens(dims, m.tensor_parallel_);
    if (layout.loss_chunk_tokens > 0) {
      ModelDims job = dims;
      job.loss_chunk_tokens = layout.loss_chunk_tokens;
      m.job_chunk_tokens_ = HeadLossChunkTokens(job, m.tensor_parallel_);
    }
    m.chunk_token_bytes_ = HeadChunkTransientBytes(dims, m.tensor_parallel_, 1);
  }
  if (m.postprocess_ != nullptr && !m.postprocess_->three_d()) {
    // Prefix minima over the length axis of each b-axis point (kLeastHead).
    const ProfileGrid& g = *m.postprocess_;
    const size_t lengths = g.seq_lens().size();
    const double inf = std::numeric_limits<double>::infinity();
    m.least_head_.assign(g.micro_batch_sizes().size() * lengths, {inf, inf, inf});
    for (size_t kb = 0; kb < g.micro_batch_sizes().size(); ++kb) {
      std::array<double, 3> least{inf, inf, inf};
      for (size_t ks = 0; ks < lengths; ++ks) {
        const CostValues& v = g.At(kb, 0, ks);
        if (std::isfinite(v.forward_ms) && std::isfinite(v.backward_ms) &&
            std::isfinite(v.peak_bytes) && std::isfinite(v.stored_bytes)) {
          least = {std::min(least[0], v.forward_ms), std::min(least[1], v.backward_ms),
                   std::min(least[2], v.peak_bytes - v.stored_bytes)};
        }
        m.least_head_[kb * lengths + ks] = least;
      }
    }
  }
  m.fused_attention_ = model.profiled_dims().has_value() &&
                       model.profiled_dims()->attention_kernel == AttentionKernel::kFused;
  if (model.profiled_dims().has_value()) {
    // One token of the core's output on this tensor rank: its heads' width
    // in the compute dtype.
    const ModelDims& dims = *model.profiled_dims();
    m.core_output_token_bytes_ = static_cast<double>(dims.heads / m.tensor_parallel_) *
                                 dims.kv_channels * dims.dtype_bytes;
  }
  m.variable_length_kernel_ = m.fused_attention_ && model.profiled_dims()->dtype_bytes == 2;
  m.biased_self_attention_ = model.profiled_dims().has_value() && model.profiled_dims()->t5v11();
  m.shared_b_axis_ = true;
  for (const ProfileGrid* g : {m.decoder_, m.embedding_, m.postprocess_}) {
    if (g != nullptr && m.encoder_ != nullptr &&
        g->micro_batch_sizes() != m.encoder_->micro_batch_sizes()) {
      m.shared_b_axis_ = false;
    }
  }
  if (m.encoder_ == nullptr || m.postprocess_ == nullptr ||
      (layout.encoder_decoder && m.decoder_ == nullptr)) {
    return absl::NotFoundError(absl::StrCat("the cost model has no ",
                                            m.encoder_ == nullptr ? "encoder-layer"
                                            : m.decoder_ == nullptr && layout.encoder_decoder
                                                ? "decoder-layer"
                                                : "postprocess",
                                            " grid for recompute mode ", RecomputeName(recompute),
                                            " at tensor-parallel degree ", tensor_parallel));
  }
  return m;
}

void MicroBatchCostModel::SetDeviceRoom(const std::vector<double>& room, double reference) {
  const uint32_t c = layout_.devices;
  if (room.size() != c || c == 0) return;
  // The least room of each class's devices.
  const auto scale = [&](const std::pair<uint32_t, uint32_t>& devices) {
    const double least = *std::min_element(
        room.begin() + devices.first, room.begin() + std::max(devices.first + 1, devices.second));
    return reference / least;
  };
  first_scale_ = scale(class_devices_[kFirstDevice]);
  last_scale_ = scale(class_devices_[kLastDevice]);
  first_decoder_scale_ =
      layout_.encoder_decoder && c > 1 ? scale(class_devices_[kFirstDecoderDevice]) : last_scale_;
}

void MicroBatchCostModel::CombineBesidesHead(const CostValues& encoder, const CostValues& decoder,
                                             const CostValues& encoder_embedding,
                                             const CostValues& decoder_embedding,
                                             const StackBias& encoder_bias,
                                             const StackBias& decoder_bias, MicroBatchCost* others,
                                             PendingDevice* pending) const {
  const StageLayout& l = layout_;
  *others = MicroBatchCost();
  if (!l.encoder_decoder) {
    if (l.devices == 1) {
      DeviceSum only;
      only.Add(encoder, l.encoder_layers);
      only.Add(encoder_embedding, 1);
      only.AddBias(encoder_bias);
      *pending = only.Pending(first_scale_, 1, kFirstDevice);
      return;
    }
    DeviceSum first;
    first.Add(encoder, class_layers_[kFirstDevice]);
    first.Add(encoder_embedding, 1);
    first.AddBias(encoder_bias);
    first.MergeInto(others, first_scale_, depth_[kFirstDevice], kFirstDevice);
    DeviceSum last;
    last.Add(encoder, class_layers_[kLastDevice]);
    last.AddBias(encoder_bias);
    *pending = last.Pending(last_scale_, depth_[kLastDevice], kLastDevice);
    return;
  }
  if (l.shared_device()) {
    DeviceSum only;
    only.Add(encoder, l.encoder_layers);
    only.Add(encoder_embedding, 1);
    only.Add(decoder, l.decoder_layers);
    only.Add(decoder_embedding, 1);
    only.AddBias(encoder_bias);
    only.AddBias(decoder_bias);
    *pending = only.Pending(first_scale_, 1, kFirstDevice);
    return;
  }
  DeviceSum first_encoder;
  first_encoder.Add(encoder, class_layers_[kFirstDevice]);
  first_encoder.Add(encoder_embedding, 1);
  first_encoder.AddBias(encoder_bias);
  first_encoder.MergeInto(others, first_scale_, depth_[kFirstDevice], kFirstDevice);
  const bool one_decoder_device = l.devices - l.encoder_devices == 1;
  DeviceSum first_decoder;
  first_decoder.Add(decoder, class_layers_[kFirstDecoderDevice]);
  first_decoder.Add(decoder_embedding, 1);
  first_decoder.AddBias(decoder_bias);
  if (one_decoder_device) {
    *pending = first_decoder.Pending(first_decoder_scale_, depth_[kFirstDecoderDevice],
                                     kFirstDecoderDevice);
    return;
  }
  first_decoder.MergeInto(others, first_decoder_scale_, depth_[kFirstDecoderDevice],
                          kFirstDecoderDevice);
  DeviceSum last;
  last.Add(decoder, class_layers_[kLastDevice]);
  last.AddBias(decoder_bias);
  *pending = last.Pending(last_scale_, depth_[kLastDevice], kLastDevice);
}

void MicroBatchCostModel::FinishWithHead(const MicroBatchCost& others,
                                         const PendingDevice& pending,
                                         const CostValues& postprocess, MicroBatchCost* out) {
  *out = others;
  DeviceSum device(pending);
  device.AddPostprocess(postprocess);
  device.MergeInto(out, pending.scale, pending.depth, pending.slot);
}

bool MicroBatchCostModel::Combine(const CostValues& encoder, const CostValues& decoder,
                                  const CostValues& encoder_embedding,
                                  const CostValues& decoder_embedding,
                                  const CostValues& postprocess, const StackBias& encoder_bias,
                                  const StackBias& decoder_bias, MicroBatchCost* out) const {
  MicroBatchCost others;
  PendingDevice pending;
  CombineBesidesHead(encoder, decoder, encoder_embedding, decoder_embedding, encoder_bias,
                     decoder_bias, &others, &pending);
  FinishWithHead(others, pending, postprocess, out);
  return true;
}

bool MicroBatchCostModel::Evaluate(uint32_t b, uint32_t input_len, uint32_t target_len,
                                   MicroBatchCost* out) const {
  Row row;
  return PrepareRow(input_len, target_len, &row) && Evaluate(row, b, out);
}

double MicroBatchCostModel::CoreTransient(const CostValues& core, double rows, double side,
                                          bool whole_rows) const {
  // The grid's peak also holds the core's output and the gradient it
  // receives, [rows, side, width] each, which belong to the layer around it
  // (its output projection keeps the one, its backward makes the other).
  const double own = std::max(
      0.0, core.peak_bytes - core.stored_bytes - 2 * rows * side * core_output_token_bytes_);
  // The rows' core recomputed by selective recomputation (explicit kernel)
  // holds its stored bytes again while it runs backward; a sample's is
  // re-made once the layer's backward has freed more than that (measured:
  // component_memory_test).
  return whole_rows && recompute_ == Recompute::kSelective && !fused_attention_
             ? own + core.stored_bytes
             : own;
}

bool MicroBatchCostModel::CoreDifference(uint32_t rows, double full,
                                         const std::vector<double>& lengths, bool one_launch,
                                         CoreChange* change) const {
  CostValues whole;
  if (!attention_core_->Lookup(rows, full, &whole)) return false;
  CostValues sum;
  double area = 0;     // sum of l_i^2
  double largest = 0;  // the largest sample core's transient
  for (double l : lengths) {
    CostValues one;
    if (!attention_core_->Lookup(1, l, &one)) return false;
    sum.forward_ms += one.forward_ms;
    sum.backward_ms += one.backward_ms;
    sum.stored_bytes += one.stored_bytes;
    largest = std::max(largest, CoreTransient(one, 1, l, false));
    area += l * l;
  }
  CostValues launch;
  if (one_launch && rows > 0 &&
      attention_core_->Lookup(rows, std::sqrt(area / rows), &launch)) {
    sum.forward_ms = launch.forward_ms;
    sum.backward_ms = launch.backward_ms;
    largest = CoreTransient(launch, rows, std::sqrt(area / rows), false);
  }
  change->forward_ms = sum.forward_ms - whole.forward_ms;
  change->backward_ms = sum.backward_ms - whole.backward_ms;
  // Recomputation drops what the core stores and runs its forward again.
  if (RecomputesCore()) change->backward_ms += sum.forward_ms - whole.forward_ms;
  change->stored = sum.stored_bytes - whole.stored_bytes;
  change->whole_transient = CoreTransient(whole, rows, full, true);
  change->sample_transient = largest;
  return true;
}

void MicroBatchCostModel::Fold(const CoreChange& core, LayerChange* layer) {
  layer->cost.forward_ms += core.forward_ms;
  layer->cost.backward_ms += core.backward_ms;
  layer->stored += core.stored;
  layer->whole_transient = std::max(layer->whole_transient, core.whole_transient);
  layer->sample_transient = std::max(layer->sample_transient, core.sample_transient);
}

void MicroBatchCostModel::Finish(LayerChange* layer) const {
  // Without recomputation the layer keeps the samples' cores instead of
  // the rows'; with it, their stored bytes exist only while the backward
  // re-runs them (PricePerSample).
  if (!RecomputesCore()) layer->cost.stored_bytes += layer->stored;
  // The rows' core's part of the layer's transient becomes the largest
  // sample's (their backwards run one after another).
  layer->transient = layer->sample_transient - layer->whole_transient;
}

bool MicroBatchCostModel::PerSampleDeltas(const PackedSamples& packed, uint32_t input_len,
                                          uint32_t target_len, LayerChange* encoder,
                                          LayerChange* decoder) const {
  if (attention_core_ == nullptr || packed.rows == 0) return false;
  std::vector<double> lengths;
  for (const PackedSamples::Lengths& s : packed.samples) lengths.push_back(s.input);
  const bool one_launch_self = variable_length_kernel_ && !biased_self_attention_;
  // Under recomputation with the explicit kernel the layer's grid keeps
  // the dense masks of unpacked rows (the profiler builds them in the
  // layer's forward, as a stage does; its recomputed cores or its
  // checkpoint keep them): bool [r, 1, s, s] for causal self-attention,
  // the keys' [r, s] (expanded) otherwise. Packed rows' samples keep none.
  const bool masks_kept = RecomputesCore() && !fused_attention_;
  const double rows = packed.rows;
  CoreChange core;
  if (!CoreDifference(packed.rows, input_len, lengths, one_launch_self, &core)) return false;
  Fold(core, encoder);
  Finish(encoder);
  if (masks_kept) {
    encoder->cost.stored_bytes -=
        layout_.encoder_decoder ? rows * input_len : rows * input_len * input_len;
  }
  if (layout_.encoder_decoder) {
    lengths.clear();
    for (const PackedSamples::Lengths& s : packed.samples) lengths.push_back(s.target);
    if (!CoreDifference(packed.rows, target_len, lengths, one_launch_self, &core)) return false;
    Fold(core, decoder);
    // Cross-attention: t_i x s_i scores, priced as a square of that area.
    lengths.clear();
    for (const PackedSamples::Lengths& s : packed.samples) {
      lengths.push_back(std::sqrt(static_cast<double>(s.input) * s.target));
    }
    if (!CoreDifference(packed.rows, std::sqrt(static_cast<double>(input_len) * target_len),
                        lengths, variable_length_kernel_, &core)) {
      return false;
    }
    Fold(core, decoder);
    Finish(decoder);
    if (masks_kept) {
      decoder->cost.stored_bytes -= rows * target_len * target_len + rows * input_len;
    }
  }
  return true;
}

bool MicroBatchCostModel::Faster(const LayerChange& encoder, const LayerChange& decoder) const {
  // The whole model's change: every layer of each stack.
  const double change =
      total_encoder_layers_ * (encoder.cost.forward_ms + encoder.cost.backward_ms) +
      total_decoder_layers_ * (decoder.cost.forward_ms + decoder.cost.backward_ms);
  return change <= 0;
}

bool MicroBatchCostModel::PerSampleIsFaster(const PackedSamples& packed, uint32_t input_len,
                                            uint32_t target_len) const {
  LayerChange encoder;
  LayerChange decoder;
  return PerSampleDeltas(packed, input_len, target_len, &encoder, &decoder) &&
         Faster(encoder, decoder);
}

bool MicroBatchCostModel::PricePerSample(const PackedSamples& packed, uint32_t input_len,
                                         uint32_t target_len, CostValues* encoder,
                                         CostValues* decoder) const {
  LayerChange encoder_change;
  LayerChange decoder_change;
  if (!PerSampleDeltas(packed, input_len, target_len, &encoder_change, &decoder_change)) {
    return false;
  }
  if (packed.only_if_faster && !Faster(encoder_change, decoder_change)) return false;
  // The layer's transient as without recomputation: the rows' core's share
  // replaced by the largest sample's, and never below that sample's (the
  // layer's transient need not lie in its attention: the difference is
  // then too large).
  const auto transient_without_recompute = [](const LayerChange& change, double transient) {
    return std::max(change.sample_transient, transient + change.transient);
  };
  const auto apply = [&](const LayerChange& change, const ProfileGrid* none_grid, uint32_t s,
                         uint32_t e, CostValues* v) {
    // Never below zero: the layer's other work is still done.
    v->forward_ms = std::max(0.0, v->forward_ms + change.cost.forward_ms);
    v->backward_ms = std::max(0.0, v->backward_ms + change.cost.backward_ms);
    const double transient = v->peak_bytes - v->stored_bytes;
    double changed = transient_without_recompute(change, transient);
    if (recompute_ == Recompute::kFull) {
      // The backward re-runs the layer as without recomputation: every
      // sample's core alive at once (the stored difference), then the
      // backward's transient of that mode, from its grid where the cost
      // model has it.
      CostValues none;
      const bool found = none_grid != nullptr && none_grid->Lookup(packed.rows, s, e, &none);
      const double none_transient = none.peak_bytes - none.stored_bytes;
      changed = found ? transient - none_transient +
                            transient_without_recompute(change, none_transient) + change.stored
                      : std::max(change.sample_transient,
                                 transient + change.transient + change.stored);
    }
    v->stored_bytes = std::max(0.0, v->stored_bytes + change.cost.stored_bytes);
    v->peak_bytes = v->stored_bytes + std::max(0.0, changed);
  };
  apply(encoder_change, encoder_none_, input_len, 0, encoder);
  if (layout_.encoder_decoder) apply(decoder_change, decoder_none_, target_len, input_len, decoder);
  return true;
}

bool MicroBatchCostModel::Evaluate(uint32_t b, uint32_t input_len, uint32_t target_len,
                                   const PackedSamples* packed, double labelled_tokens,
                                   MicroBatchCost* out) const {
  Row row;
  if (!PrepareRow(input_len, target_len, &row)) return false;
  if (packed == nullptr || attention_core_ == nullptr) {
    return Evaluate(row, b, labelled_tokens, out);
  }
  Components c;
  if (!LookupComponents(row, b, &c)) return false;
  PricePerSample(*packed, input_len, target_len, &c.encoder, &c.decoder);
  PriceLabelled(b, row.head_len_, labelled_tokens, &c.postprocess);
  return Combine(c.encoder, c.decoder, c.encoder_embedding, c.decoder_embedding, c.postprocess,
                 row.encoder_bias_, row.decoder_bias_, out);
}

MicroBatchCostModel::StackBias MicroBatchCostModel::BiasOf(uint32_t s) const {
  return {.stored = layout_.PositionBiasBytes(s, tensor_parallel_, recompute_),
          .gradient = layout_.PositionBiasGradientBytes(s, tensor_parallel_)};
}

bool MicroBatchCostModel::PrepareRow(uint32_t input_len, uint32_t target_len, Row* row) const {
  row->model_ = this;
  row->head_len_ = layout_.encoder_decoder ? target_len : input_len;
  row->encoder_bias_ = BiasOf(input_len);
  row->decoder_bias_ = layout_.encoder_decoder ? BiasOf(target_len) : StackBias();
  if (!encoder_->Row(input_len, 0, &row->encoder_)) return false;
  if (embedding_ != nullptr && !embedding_->Row(input_len, 0, &row->encoder_embedding_)) {
    return false;
  }
  if (layout_.encoder_decoder) {
    if (!decoder_->Row(target_len, input_len, &row->decoder_)) return false;
    if (embedding_ != nullptr && !embedding_->Row(target_len, 0, &row->decoder_embedding_)) {
      return false;
    }
    return postprocess_->Row(target_len, 0, &row->postprocess_);
  }
  return postprocess_->Row(input_len, 0, &row->postprocess_);
}

bool MicroBatchCostModel::LookupComponents(const Row& row, uint32_t b, Components* c) const {
  if (shared_b_axis_) {
    ProfileGrid::BatchPosition p;
    if (!encoder_->LocateBatch(b, &p) || !row.encoder_.Lookup(p, &c->encoder) ||
        !row.postprocess_.Lookup(p, &c->postprocess)) {
      return false;
    }
    if (embedding_ != nullptr && !row.encoder_embedding_.Lookup(p, &c->encoder_embedding)) {
      return false;
    }
    if (layout_.encoder_decoder) {
      if (!row.decoder_.Lookup(p, &c->decoder)) return false;
      if (embedding_ != nullptr && !row.decoder_embedding_.Lookup(p, &c->decoder_embedding)) {
        return false;
      }
    }
    return true;
  }
  if (!row.encoder_.Lookup(b, &c->encoder) || !row.postprocess_.Lookup(b, &c->postprocess)) {
    return false;
  }
  if (embedding_ != nullptr && !row.encoder_embedding_.Lookup(b, &c->encoder_embedding)) {
    return false;
  }
  if (layout_.encoder_decoder) {
    if (!row.decoder_.Lookup(b, &c->decoder)) return false;
    if (embedding_ != nullptr && !row.decoder_embedding_.Lookup(b, &c->decoder_embedding)) {
      return false;
    }
  }
  return true;
}

void MicroBatchCostModel::PriceLabelled(uint32_t b, uint32_t head_len, double labelled,
                                        CostValues* head) const {
  PriceLabelledAtGridChunk(b, head_len, labelled, head);
  if (job_chunk_tokens_ <= 0 || job_chunk_tokens_ == grid_chunk_tokens_) return;
  // The logits of min(n, chunk) tokens are alive at the head's peak: the
  // job's chunk instead of the grid's.
  const double positions = static_cast<double>(b) * head_len;
  const auto change = [&](double n) {
    return std::min(n, job_chunk_tokens_) - std::min(n, grid_chunk_tokens_);
  };
  // kLeastHead: the change is monotone in n, so its least over [0, b s]
  // lies at 0 or at b s.
  const double tokens =
      labelled == kLeastHead ? std::min(0.0, change(positions))
                             : change(labelled < 0 || labelled >= positions ? positions : labelled);
  const double transient =
      std::max(0.0, head->peak_bytes - head->stored_bytes + tokens * chunk_token_bytes_);
  head->peak_bytes = head->stored_bytes + transient;
}

void MicroBatchCostModel::PriceLabelledAtGridChunk(uint32_t b, uint32_t head_len, double labelled,
                                                   CostValues* head) const {
  const double positions = static_cast<double>(b) * head_len;
  if (labelled != kLeastHead && (labelled < 0 || labelled >= positions)) return;
  ProfileGrid::BatchPosition at;
  if (!postprocess_->LocateBatch(b, &at)) return;  // beyond the grid: no cost at all
  if (labelled == kLeastHead) {
    // Between grid points the equivalent point is linear in its length, so
    // the least over [0, head_len] lies at a length point below head_len or
    // at head_len itself (*head); below the first point it is clamped.
    const std::vector<uint32_t>& lengths = postprocess_->seq_lens();
    const int below =
        static_cast<int>(std::lower_bound(lengths.begin(), lengths.end(), head_len) -
                         lengths.begin()) -
        1;
    double transient = head->peak_bytes - head->stored_bytes;
    if (below >= 0 && !least_head_.empty()) {
      const std::array<double, 3>& lo = least_head_[at.lo * lengths.size() + below];
      const std::array<double, 3>& hi = least_head_[at.hi * lengths.size() + below];
      const auto mix = [&](int k) { return at.w == 0 ? lo[k] : (1 - at.w) * lo[k] + at.w * hi[k]; };
      head->forward_ms = std::min(head->forward_ms, mix(0));
      head->backward_ms = std::min(head->backward_ms, mix(1));
      transient = std::min(transient, mix(2));
    }
    head->stored_bytes = std::max(0.0, head->stored_bytes - head_token_bytes_ * positions);
    head->peak_bytes = head->stored_bytes + transient;
    return;
  }
  // Every position of (b, n / b) is labelled: n tokens through the head.
  CostValues equivalent;
  if (!postprocess_->Lookup(at, labelled / b, &equivalent)) return;
  head->forward_ms = std::min(head->forward_ms, equivalent.forward_ms);
  head->backward_ms = std::min(head->backward_ms, equivalent.backward_ms);
  const double transient = std::min(head->peak_bytes - head->stored_bytes,
                                    equivalent.peak_bytes - equivalent.stored_bytes);
  // stored(b, s, n) = stored(b, s, b s) - bytes per labelled token * (b s - n).
  head->stored_bytes =
      std::max(0.0, head->stored_bytes - head_token_bytes_ * (positions - labelled));
  head->peak_bytes = head->stored_bytes + transient;
}

bool MicroBatchCostModel::Evaluate(const Row& row, uint32_t b, double labelled_tokens,
                                   MicroBatchCost* out) const {
  Components c;
  if (!LookupComponents(row, b, &c)) return false;
  PriceLabelled(b, row.head_len_, labelled_tokens, &c.postprocess);
  return Combine(c.encoder, c.decoder, c.encoder_embedding, c.decoder_embedding, c.postprocess,
                 row.encoder_bias_, row.decoder_bias_, out);
}

bool MicroBatchCostModel::PrepareBatch(const Row& row, uint32_t b, Batch* batch) const {
  Components c;
  if (!LookupComponents(row, b, &c)) return false;
  CombineBesidesHead(c.encoder, c.decoder, c.encoder_embedding, c.decoder_embedding,
                     row.encoder_bias_, row.decoder_bias_, &batch->others_, &batch->pending_);
  batch->postprocess_ = c.postprocess;
  batch->b_ = b;
  batch->head_len_ = row.head_len_;
  return true;
}

bool MicroBatchCostModel::Evaluate(const Batch& batch, double labelled_tokens,
                                   MicroBatchCost* out) const {
  CostValues head = batch.postprocess_;
  PriceLabelled(batch.b_, batch.head_len_, labelled_tokens, &head);
  FinishWithHead(batch.others_, batch.pending_, head, out);
  return true;
}

bool MicroBatchCostModel::EvaluateStages(uint32_t b, uint32_t input_len, uint32_t target_len,
                                         const PackedSamples* packed, double labelled_tokens,
                                         uint32_t chunks, uint32_t hidden, uint32_t dtype_bytes,
                                         std::vector<StageOpCost>* out) const {
  CostValues encoder;
  CostValues decoder;
  CostValues encoder_embedding;
  CostValues decoder_embedding;
  CostValues postprocess;
  const bool t5 = layout_.encoder_decoder;
  if (!encoder_->Lookup(b, input_len, &encoder)) return false;
  if (!postprocess_->Lookup(b, t5 ? target_len : input_len, &postprocess)) return false;
  if (embedding_ != nullptr && !embedding_->Lookup(b, input_len, &encoder_embedding)) return false;
  if (t5) {
    if (!decoder_->Lookup(b, target_len, input_len, &decoder)) return false;
    if (embedding_ != nullptr && !embedding_->Lookup(b, target_len, &decoder_embedding)) {
      return false;
    }
  }
  if (packed != nullptr) PricePerSample(*packed, input_len, target_len, &encoder, &decoder);
  PriceLabelled(b, t5 ? target_len : input_len, labelled_tokens, &postprocess);
  const uint32_t stages = layout_.devices * chunks;
  out->assign(stages, StageOpCost());
  const double encoder_act = static_cast<double>(b) * input_len * hidden * dtype_bytes;
  const double decoder_act = static_cast<double>(b) * target_len * hidden * dtype_bytes;
  // Kept once per stage and stack, its gradient beside the layers'
  // transients (StackBias).
  const StackBias encoder_bias = BiasOf(input_len);
  const StackBias decoder_bias = t5 ? BiasOf(target_len) : StackBias();
  const uint32_t encoder_stages =
      t5 ? (layout_.devices == 1 ? 1 : layout_.encoder_devices) : stages;
  for (uint32_t st = 0; st < stages; ++st) {
    StageOpCost& c = (*out)[st];
    DeviceSum sum;
    const bool decoder_stage = t5 && layout_.devices != 1 && st >= encoder_stages;
    if (!decoder_stage) {
      sum.Add(encoder, layout_.StageEncoderLayers(st, stages));
      if (st == 0) sum.Add(encoder_embedding, 1);
      sum.AddBias(encoder_bias);
      if (t5 && layout_.devices == 1) {
        // The decoder layers read the encoder output, which no component
        // is charged for: the stage keeps it per micro-batch.
        sum.AddKept(encoder_act);
        sum.Add(decoder, total_decoder_layers_);
        sum.Add(decoder_embedding, 1);
        sum.AddPostprocess(postprocess);
        sum.AddBias(decoder_bias);
      } else if (!t5 && st + 1 == stages) {
        sum.AddPostprocess(postprocess);
      }
      c.activation_bytes = encoder_act;
      c.gradient_bytes = st == 0 ? 0 : encoder_act;
    } else {
      const uint32_t index = st - encoder_stages;
      sum.Add(decoder, layout_.StageDecoderLayers(st, stages));
      if (index == 0) sum.Add(decoder_embedding, 1);
      if (st + 1 == stages) sum.AddPostprocess(postprocess);
      sum.AddBias(decoder_bias);
      // The encoder output the stage's layers read (received with its
      // input; no component is charged for it), kept per micro-batch.
      sum.AddKept(encoder_act);
      // Decoder stages pass on their activations and the encoder output.
      c.activation_bytes = decoder_act + encoder_act;
      c.gradient_bytes = index == 0 ? encoder_act : decoder_act + encoder_act;
    }
    sum.Into(&c);
    if (st + 1 == stages) c.activation_bytes = 0;
  }
  return true;
}

}  // namespace varipipe::planner
