#include "planner/microbatch/baselines.h"

#include <algorithm>
#include <numeric>

namespace varipipe::planner {
namespace {

std::vector<MicroBatchGroup> ChunkOrder(std::span<const SampleLengths> samples,
                                        const LengthPolicy& policy,
                                        const std::vector<uint32_t>& order,
                                        uint32_t micro_batch_size) {
  std::vector<MicroBatchGroup> groups;
  for (size_t begin = 0; begin < order.size(); begin += micro_batch_size) {
    const size_t end = std::min(order.size(), begin + micro_batch_size);
    MicroBatchGroup group;
    group.samples.assign(order.begin() + begin, order.begin() + end);
    PadToLongest(samples, policy, group);
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace

std::vector<uint32_t> SortedByLength(std::span<const SampleLengths> samples,
                                     const LengthPolicy& policy) {
  std::vector<uint32_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const uint32_t la = SequenceLength(samples[a], policy);
    const uint32_t lb = SequenceLength(samples[b], policy);
    if (la != lb) return la > lb;
    if (samples[a].target != samples[b].target) return samples[a].target > samples[b].target;
    return a < b;
  });
  return order;
}

std::vector<MicroBatchGroup> PartitionPadding(std::span<const SampleLengths> samples,
                                              const LengthPolicy& policy,
                                              uint32_t micro_batch_size) {
  std::vector<uint32_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0u);
  return ChunkOrder(samples, policy, order, micro_batch_size);
}

std::vector<MicroBatchGroup> PartitionFixedSize(std::span<const SampleLengths> samples,
                                                const LengthPolicy& policy,
                                                uint32_t micro_batch_size) {
  return ChunkOrder(samples, policy, SortedByLength(samples, policy), micro_batch_size);
}

std::vector<MicroBatchGroup> PartitionTokenBased(std::span<const SampleLengths> samples,
                                                 const LengthPolicy& policy,
                                                 uint64_t token_budget) {
  std::vector<MicroBatchGroup> groups;
  MicroBatchGroup current;  // input_len/target_len hold the running padded maxima
  for (uint32_t index : SortedByLength(samples, policy)) {
    const uint32_t own_input = PaddedInputLength(SequenceLength(samples[index], policy), policy);
    const uint32_t own_target = PaddedTargetLength(samples[index].target, policy);
    uint32_t input = std::max(current.input_len, own_input);
    uint32_t target = std::max(current.target_len, own_target);
    if (!current.samples.empty() &&
        (current.size() + 1) * (uint64_t{input} + target) > token_budget) {
      groups.push_back(std::move(current));
      current = MicroBatchGroup();
      input = own_input;
      target = own_target;
    }
    current.samples.push_back(index);
    current.input_len = input;
    current.target_len = target;
  }
  if (!current.samples.empty()) groups.push_back(std::move(current));
  return groups;
}

std::vector<std::vector<uint32_t>> PackRows(std::span<const SampleLengths> samples,
                                            const LengthPolicy& policy, uint32_t max_input,
                                            uint32_t max_target) {
  struct Bin {
    std::vector<uint32_t> samples;
    uint64_t input = 0;
    uint64_t target = 0;
  };
  std::vector<Bin> bins;
  for (uint32_t index : SortedByLength(samples, policy)) {
    const uint32_t input = SequenceLength(samples[index], policy);
    const uint32_t target = policy.encoder_decoder ? samples[index].target : 0;
    auto fits = [&](const Bin& bin) {
      return bin.input + input <= max_input &&
             (!policy.encoder_decoder || bin.target + target <= max_target);
    };
    auto it = std::find_if(bins.begin(), bins.end(), fits);
    if (it == bins.end()) it = bins.insert(bins.end(), Bin());
    it->samples.push_back(index);
    it->input += input;
    it->target += target;
  }
  std::vector<std::vector<uint32_t>> rows;
  rows.reserve(bins.size());
  for (Bin& bin : bins) rows.push_back(std::move(bin.samples));
  return rows;
}

std::vector<MicroBatchGroup> PartitionPacking(std::span<const SampleLengths> samples,
                                              const LengthPolicy& policy, uint32_t max_input,
                                              uint32_t max_target,
                                              uint32_t sequences_per_micro_batch) {
  const std::vector<std::vector<uint32_t>> bins = PackRows(samples, policy, max_input, max_target);
  std::vector<MicroBatchGroup> groups;
  for (size_t begin = 0; begin < bins.size(); begin += sequences_per_micro_batch) {
    const size_t end = std::min(bins.size(), begin + sequences_per_micro_batch);
    MicroBatchGroup group;
    for (size_t b = begin; b < end; ++b) {
      group.row_starts.push_back(static_cast<uint32_t>(group.samples.size()));
      group.samples.insert(group.samples.end(), bins[b].begin(), bins[b].end());
    }
    group.input_len = PaddedInputLength(max_input, policy);
    group.target_len = PaddedTargetLength(max_target, policy);
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace varipipe::planner
