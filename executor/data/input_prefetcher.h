// Builds an iteration's micro-batch inputs on a background thread while the
// passes before them run: in the plan's order, the tensor of every
// LoadInput buffer and the row lengths of every forward pass, each `ahead`
// items before the interpreter takes it. On a GPU the tensors come in pinned
// host memory, so that their copies to the device do not wait for the host
// (non-blocking copies from pageable memory are staged synchronously).
//
//   InputPrefetcher inputs(&loader, plan, device, /*ahead=*/4);  // 0: no thread
//   absl::StatusOr<torch::Tensor> tokens = inputs.TakeLoad(index, k);
//   absl::StatusOr<RowLengths> lengths = inputs.TakeLengths(index);
//
// Items are taken in the order they were queued (the plan's instruction
// order); taking another is a FailedPrecondition. The loader's errors are
// returned by the Take of their item. Destruction stops the thread.
#ifndef VARIPIPE_EXECUTOR_DATA_INPUT_PREFETCHER_H_
#define VARIPIPE_EXECUTOR_DATA_INPUT_PREFETCHER_H_

#include <torch/torch.h>

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/runtime/counting_allocator.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

class InputPrefetcher {
 public:
  // `loader` and `plan` must outlive the prefetcher. `memory`: the account
  // the thread's CPU allocations are charged to (the rank's), or null.
  InputPrefetcher(const MicroBatchLoader* loader, const v1::ExecutionPlan& plan,
                  torch::Device device, size_t ahead, MemoryAccount* memory = nullptr);
  ~InputPrefetcher();
  InputPrefetcher(const InputPrefetcher&) = delete;
  InputPrefetcher& operator=(const InputPrefetcher&) = delete;

  // Buffer `k` of the LoadInput at instruction `index`.
  absl::StatusOr<torch::Tensor> TakeLoad(int index, int k);
  // The row lengths of the forward pass at instruction `index`.
  absl::StatusOr<RowLengths> TakeLengths(int index);

  // Seconds the takers waited for items not yet built (with ahead 0: the
  // loading itself).
  double waited_seconds() const { return waited_seconds_; }

 private:
  struct Item {
    int index = 0;
    int k = -1;  // LoadInput buffer; -1: a forward's lengths
    std::optional<absl::StatusOr<torch::Tensor>> tensor;
    std::optional<absl::StatusOr<RowLengths>> lengths;
  };
  void Build();
  // Loads one item (the loader's error, or an exception's, into it).
  void BuildItem(Item& item) const;
  // Blocks until item `next_` is built; checks that it is (index, k).
  absl::Status Await(int index, int k);
  // The item was taken: the next one is due.
  void Advance();

  const MicroBatchLoader* loader_;
  const v1::ExecutionPlan& plan_;
  const bool pin_;
  const size_t ahead_;
  MemoryAccount* memory_;
  std::vector<Item> items_;
  std::mutex mu_;
  std::condition_variable changed_;
  size_t built_ = 0;   // guarded by mu_: items [0, built_) are ready
  size_t next_ = 0;    // guarded by mu_: the next item to take
  bool stop_ = false;  // guarded by mu_
  // Who waits on changed_ (each side wakes the other only then).
  bool builder_waiting_ = false;  // guarded by mu_
  bool taker_waiting_ = false;    // guarded by mu_
  double waited_seconds_ = 0;
  std::thread thread_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_DATA_INPUT_PREFETCHER_H_
