#include "executor/model/variable_length_layout.h"

#include <algorithm>
#include <limits>

namespace varipipe::executor {
namespace {

// One sample's contiguous run of positions in a row.
struct Run {
  int64_t segment = -1;
  int64_t begin = 0;
  int64_t length = 0;
};

// The runs of one row's segment ids (-1 ends the real positions), checked
// to be contiguous and to follow each other from position 0.
std::vector<Run> RunsOf(const int64_t* ids, int64_t n, int64_t row, const char* side) {
  std::vector<Run> runs;
  int64_t i = 0;
  for (; i < n && ids[i] >= 0; ++i) {
    if (runs.empty() || runs.back().segment != ids[i]) {
      for (const Run& r : runs) {
        TORCH_CHECK(r.segment != ids[i], "packed row ", row, " (", side, "): sample ", ids[i],
                    " is not one contiguous run of positions");
      }
      runs.push_back({ids[i], i, 0});
    }
    ++runs.back().length;
  }
  for (; i < n; ++i) {
    TORCH_CHECK(ids[i] < 0, "packed row ", row, " (", side, "): sample ", ids[i],
                " follows padding at position ", i);
  }
  return runs;
}

torch::Tensor HostInt64(const std::vector<int64_t>& values, bool pinned) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(values.size())},
                                 torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pinned));
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return t;
}

// The flat positions [row * length + position] of the packed tokens of one
// side, in sample order; empty when they are 0, 1, 2, ... rows * length - 1.
std::vector<int64_t> GatherIndex(const std::vector<VariableLengthLayout::Sample>& samples,
                                 int64_t rows, int64_t length, bool keys) {
  std::vector<int64_t> index;
  bool identity = true;
  for (const VariableLengthLayout::Sample& s : samples) {
    const int64_t begin = keys ? s.key_begin : s.query_begin;
    const int64_t count = keys ? s.key_length : s.query_length;
    for (int64_t p = 0; p < count; ++p) {
      const int64_t flat = s.row * length + begin + p;
      identity = identity && flat == static_cast<int64_t>(index.size());
      index.push_back(flat);
    }
  }
  if (identity && static_cast<int64_t>(index.size()) == rows * length) index.clear();
  return index;
}

}  // namespace

c10::intrusive_ptr<VariableLengthLayout> VariableLengthLayout::FromSegments(
    const torch::Tensor& query_segments, const torch::Tensor& key_segments, bool causal) {
  TORCH_CHECK(query_segments.dim() == 2 && key_segments.dim() == 2 &&
                  query_segments.size(0) == key_segments.size(0),
              "packed rows: segment ids must be [rows, positions] on both sides");
  const torch::Tensor q_ids = query_segments.to(torch::kCPU, torch::kInt64).contiguous();
  const torch::Tensor k_ids = key_segments.to(torch::kCPU, torch::kInt64).contiguous();
  auto layout = c10::intrusive_ptr<VariableLengthLayout>::reclaim(new VariableLengthLayout());
  layout->rows_ = q_ids.size(0);
  layout->query_length_ = q_ids.size(1);
  layout->key_length_ = k_ids.size(1);
  layout->causal_ = causal;
  for (int64_t row = 0; row < layout->rows_; ++row) {
    const std::vector<Run> queries =
        RunsOf(q_ids.data_ptr<int64_t>() + row * layout->query_length_, layout->query_length_,
               row, "queries");
    const std::vector<Run> keys = RunsOf(k_ids.data_ptr<int64_t>() + row * layout->key_length_,
                                         layout->key_length_, row, "keys");
    for (const Run& query : queries) {
      const auto key = std::find_if(keys.begin(), keys.end(),
                                    [&](const Run& k) { return k.segment == query.segment; });
      TORCH_CHECK(key != keys.end(), "packed row ", row, ": sample ", query.segment,
                  " has queries but no keys");
      TORCH_CHECK(!causal || key->length == query.length, "packed row ", row, ": sample ",
                  query.segment, " attends causally to keys of another length");
      layout->samples_.push_back({row, query.begin, query.length, key->begin, key->length});
      layout->query_offsets_.push_back(layout->query_offsets_.back() + query.length);
      layout->key_offsets_.push_back(layout->key_offsets_.back() + key->length);
      layout->max_query_length_ = std::max(layout->max_query_length_, query.length);
      layout->max_key_length_ = std::max(layout->max_key_length_, key->length);
    }
  }
  // The kernels take int32 offsets.
  TORCH_CHECK(layout->total_keys() <= std::numeric_limits<int32_t>::max() &&
                  layout->total_queries() <= std::numeric_limits<int32_t>::max(),
              "packed rows: more tokens than 32-bit sequence offsets hold");
  return layout;
}

c10::intrusive_ptr<VariableLengthLayout> VariableLengthLayout::FromOffsets(
    const std::vector<int64_t>& query_offsets, const std::vector<int64_t>& key_offsets,
    bool causal) {
  TORCH_CHECK(!query_offsets.empty() && query_offsets.size() == key_offsets.size() &&
                  query_offsets.front() == 0 && key_offsets.front() == 0,
              "variable-length offsets: query and key offsets of one count, from 0");
  auto layout = c10::intrusive_ptr<VariableLengthLayout>::reclaim(new VariableLengthLayout());
  layout->rows_ = 1;
  layout->causal_ = causal;
  for (size_t i = 0; i + 1 < query_offsets.size(); ++i) {
    const int64_t lq = query_offsets[i + 1] - query_offsets[i];
    const int64_t lk = key_offsets[i + 1] - key_offsets[i];
    TORCH_CHECK(lq >= 0 && lk >= 0 && (!causal || lk >= lq), "variable-length sample ", i, ": ", lq,
                " queries and ", lk, " keys");
    layout->samples_.push_back({0, query_offsets[i], lq, key_offsets[i], lk});
    layout->max_query_length_ = std::max(layout->max_query_length_, lq);
    layout->max_key_length_ = std::max(layout->max_key_length_, lk);
  }
  layout->query_offsets_ = query_offsets;
  layout->key_offsets_ = key_offsets;
  layout->query_length_ = query_offsets.back();
  layout->key_length_ = key_offsets.back();
  TORCH_CHECK(layout->total_keys() <= std::numeric_limits<int32_t>::max() &&
                  layout->total_queries() <= std::numeric_limits<int32_t>::max(),
              "variable-length attention: more tokens than 32-bit sequence offsets hold");
  return layout;
}

const VariableLengthLayout::DeviceTensors& VariableLengthLayout::OnDevice(
    torch::Device device) const {
  std::call_once(device_once_, [&] {
    const bool cuda = device.is_cuda();
    auto copy = [&](const std::vector<int64_t>& values, torch::ScalarType type) {
      torch::Tensor host = HostInt64(values, cuda);
      if (!cuda) return host.to(type);
      if (type != torch::kInt64) host = host.to(type).pin_memory();
      return host.to(torch::TensorOptions().device(device).dtype(type), /*non_blocking=*/true);
    };
    device_.query_offsets = copy(query_offsets_, torch::kInt32);
    device_.key_offsets = copy(key_offsets_, torch::kInt32);
    const std::vector<int64_t> q_index = GatherIndex(samples_, rows_, query_length_, false);
    const std::vector<int64_t> k_index = GatherIndex(samples_, rows_, key_length_, true);
    if (!q_index.empty() || total_queries() != rows_ * query_length_) {
      device_.query_index = copy(q_index, torch::kInt64);
    }
    if (!k_index.empty() || total_keys() != rows_ * key_length_) {
      device_.key_index = copy(k_index, torch::kInt64);
    }
    device_of_tensors_ = device;
  });
  TORCH_CHECK(device_of_tensors_ == device, "a packed layout's offsets are on ",
              device_of_tensors_, ", asked for on ", device);
  return device_;
}

}  // namespace varipipe::executor
