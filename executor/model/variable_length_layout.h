// Where the samples of packed rows lie, as attention over them needs it:
// one entry per sample with its row and its query and key positions, and the
// cumulative sequence lengths of the real tokens of all rows back to back
// (the variable-length kernels' cu_seqlens). Built on the host from the
// rows' segment ids, which the plan and the loader give, so nothing is read
// back from the device; the device copies (offsets and the gather index of
// the real tokens) are made once per layout, not per layer.
//
// Invariants: within a row every sample is one contiguous run of positions,
// the runs follow each other from position 0, padding (segment -1) comes
// last. Sample i's queries are the packed tokens [query_offsets[i],
// query_offsets[i+1]) and its keys [key_offsets[i], key_offsets[i+1]), in
// the order of the samples' queries (keys are gathered in that order, so the
// two sides may order a row's samples differently). Causal attention is
// bottom-right aligned: a sample's query t of lq sees its keys 0 .. lk - lq
// + t (FlashAttention 2's rule), which for the packed rows' layouts, with as
// many keys as queries per sample, is plain causality; a context-parallel
// lane's layout (FromOffsets) has query chunks shorter than their key
// prefixes.
#ifndef VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_LAYOUT_H_
#define VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_LAYOUT_H_

#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace varipipe::executor {

class VariableLengthLayout : public torch::CustomClassHolder {
 public:
  struct Sample {
    int64_t row = 0;
    int64_t query_begin = 0;  // position in the row
    int64_t query_length = 0;
    int64_t key_begin = 0;
    int64_t key_length = 0;
  };

  // The packed tokens' positions on one device.
  struct DeviceTensors {
    torch::Tensor query_offsets;  // int32 [samples + 1]
    torch::Tensor key_offsets;    // int32 [samples + 1]
    // int64 [total]: each packed token's position in the flattened rows
    // [rows * length]; undefined when the packed tokens are all positions
    // in order (no padding, no reordering), so no gather is needed.
    torch::Tensor query_index;
    torch::Tensor key_index;
  };

  // `query_segments` [b, sq], `key_segments` [b, sk]: int64 segment ids
  // (StageBatch's), on any device (read on the host). Self-attention passes
  // the same tensor twice. Throws c10::Error naming the row and sample when
  // the invariants above do not hold.
  static c10::intrusive_ptr<VariableLengthLayout> FromSegments(const torch::Tensor& query_segments,
                                                               const torch::Tensor& key_segments,
                                                               bool causal);

  // One row whose sample i has the queries [query_offsets[i],
  // query_offsets[i + 1]) and the keys [key_offsets[i], key_offsets[i + 1])
  // (both start at 0 and rise; causal: each sample at least as many keys
  // as queries), every position a token.
  static c10::intrusive_ptr<VariableLengthLayout> FromOffsets(
      const std::vector<int64_t>& query_offsets, const std::vector<int64_t>& key_offsets,
      bool causal);

  int64_t rows() const { return rows_; }
  int64_t query_length() const { return query_length_; }  // sq, padded
  int64_t key_length() const { return key_length_; }      // sk, padded
  bool causal() const { return causal_; }
  const std::vector<Sample>& samples() const { return samples_; }
  const std::vector<int64_t>& query_offsets() const { return query_offsets_; }
  const std::vector<int64_t>& key_offsets() const { return key_offsets_; }
  int64_t total_queries() const { return query_offsets_.back(); }
  int64_t total_keys() const { return key_offsets_.back(); }
  int64_t max_query_length() const { return max_query_length_; }
  int64_t max_key_length() const { return max_key_length_; }

  // The device tensors on `device`, built on first use (pinned host memory
  // and non-blocking copies on CUDA). Thread-safe; later calls for another
  // device are refused.
  const DeviceTensors& OnDevice(torch::Device device) const;

 private:
  VariableLengthLayout() = default;

  int64_t rows_ = 0;
  int64_t query_length_ = 0;
  int64_t key_length_ = 0;
  bool causal_ = false;
  std::vector<Sample> samples_;
  std::vector<int64_t> query_offsets_{0};
  std::vector<int64_t> key_offsets_{0};
  int64_t max_query_length_ = 0;
  int64_t max_key_length_ = 0;
  mutable std::once_flag device_once_;
  mutable DeviceTensors device_;
  mutable torch::Device device_of_tensors_ = torch::kCPU;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_LAYOUT_H_
