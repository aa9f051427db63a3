#include "executor/data/input_prefetcher.h"

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace varipipe::executor {
namespace {

const v1::MicroBatch* FindMicroBatch(const v1::ExecutionPlan& plan, uint32_t id) {
  if (id >= static_cast<uint32_t>(plan.micro_batches_size()) ||
      plan.micro_batches(static_cast<int>(id)).id() != id) {
    return nullptr;
  }
  return &plan.micro_batches(static_cast<int>(id));
}

// Host tensors in pinned memory, when the device copies from them.
torch::Tensor Pinned(const torch::Tensor& t, bool pin) {
  return pin && t.defined() ? t.pin_memory() : t;
}

}  // namespace

InputPrefetcher::InputPrefetcher(const MicroBatchLoader* loader, const v1::ExecutionPlan& plan,
                                 torch::Device device, size_t ahead, MemoryAccount* memory)
    : loader_(loader), plan_(plan), pin_(device.is_cuda()), ahead_(ahead), memory_(memory) {
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const v1::Instruction& in = plan.instructions(i);
    if (in.has_load_input()) {
      for (int k = 0; k < in.load_input().buffer_ids_size(); ++k) {
        Item item;
        item.index = i;
        item.k = k;
        items_.push_back(std::move(item));
      }
    } else if (in.has_forward()) {
      Item item;
      item.index = i;
      items_.push_back(std::move(item));
    }
  }
  if (ahead_ > 0 && !items_.empty()) thread_ = std::thread([this] { Build(); });
}

InputPrefetcher::~InputPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void InputPrefetcher::BuildItem(Item& item) const {
  const v1::Instruction& in = plan_.instructions(item.index);
  const v1::MicroBatch* mb = FindMicroBatch(plan_, in.micro_batch());
  absl::Status failed;
  try {
    if (mb == nullptr) {
      failed = absl::InvalidArgumentError(absl::StrCat("unknown micro-batch ", in.micro_batch()));
    } else if (item.k >= 0) {
      const v1::LoadInput& load = in.load_input();
      absl::StatusOr<torch::Tensor> t =
          loader_->Load(*mb, load.contents(item.k), load.tensors(item.k), ContextLane::Of(plan_));
      if (t.ok()) *t = Pinned(*t, pin_);
      item.tensor = std::move(t);
    } else {
      absl::StatusOr<RowLengths> lengths = loader_->Lengths(*mb, ContextLane::Of(plan_));
      if (lengths.ok()) {
        for (torch::Tensor* t :
             {&lengths->input, &lengths->target, &lengths->input_segments,
              &lengths->input_positions, &lengths->target_segments, &lengths->target_positions,
              &lengths->labelled_positions}) {
          *t = Pinned(*t, pin_);
        }
      }
      item.lengths = std::move(lengths);
    }
  } catch (const std::exception& e) {
    failed = absl::InternalError(e.what());
  }
  if (failed.ok()) return;
  if (item.k >= 0) {
    item.tensor = failed;
  } else {
    item.lengths = failed;
  }
}

void InputPrefetcher::Build() {
  std::optional<ScopedAccount> account;
  if (memory_ != nullptr) account.emplace(memory_);
  for (size_t i = 0; i < items_.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // At most `ahead_` items built and not yet taken.
      if (!stop_ && i >= next_ + ahead_) {
        builder_waiting_ = true;
        changed_.wait(lock, [&] { return stop_ || i < next_ + ahead_; });
        builder_waiting_ = false;
      }
      if (stop_) return;
    }
    BuildItem(items_[i]);  // only this thread touches it until built_ > i
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      built_ = i + 1;
      wake = taker_waiting_;
    }
    if (wake) changed_.notify_all();
  }
}

absl::Status InputPrefetcher::Await(int index, int k) {
  std::unique_lock<std::mutex> lock(mu_);
  if (next_ >= items_.size() || items_[next_].index != index || items_[next_].k != k) {
    return absl::FailedPreconditionError(
        absl::StrCat("input of instruction #", index, " taken out of the plan's order"));
  }
  if (ahead_ == 0) {  // no thread: built here, when taken
    const auto start = std::chrono::steady_clock::now();
    BuildItem(items_[next_]);
    built_ = next_ + 1;
    waited_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } else if (built_ <= next_) {
    const auto start = std::chrono::steady_clock::now();
    taker_waiting_ = true;
    changed_.wait(lock, [&] { return built_ > next_; });
    taker_waiting_ = false;
    waited_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return absl::OkStatus();
}

void InputPrefetcher::Advance() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++next_;
    // A waiting builder is woken once half its look-ahead was taken, not at
    // every take (each wake-up costs the taker a system call).
    wake = builder_waiting_ && built_ <= next_ + ahead_ / 2;
  }
  if (wake) changed_.notify_all();
}

absl::StatusOr<torch::Tensor> InputPrefetcher::TakeLoad(int index, int k) {
  if (absl::Status s = Await(index, k); !s.ok()) return s;
  absl::StatusOr<torch::Tensor> t = std::move(*items_[next_].tensor);
  Advance();
  return t;
}

absl::StatusOr<RowLengths> InputPrefetcher::TakeLengths(int index) {
  if (absl::Status s = Await(index, -1); !s.ok()) return s;
  absl::StatusOr<RowLengths> lengths = std::move(*items_[next_].lengths);
  Advance();
  return lengths;
}

}  // namespace varipipe::executor
