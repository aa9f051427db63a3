#include "executor/model/weight_grad_store.h"

#include <set>
#include <utility>

namespace varipipe::executor {
namespace {

thread_local WeightGradStore* current_store = nullptr;

}  // namespace

void WeightGradStore::Add(const torch::Tensor& weight, const torch::Tensor& input,
                          const torch::Tensor& grad_output) {
  // Detached: the input's grad_fn would keep the forward's graph, and with
  // it the stage's input activations and their gradients, alive until W.
  std::lock_guard<std::mutex> lock(mutex_);
  pairs_.push_back({weight, input.detach(), grad_output.detach()});
}

void WeightGradStore::Apply() {
  std::vector<Pair> pairs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pairs.swap(pairs_);
  }
  torch::NoGradGuard no_grad;
  for (Pair& pair : pairs) {
    const int64_t out = pair.grad_output.size(-1);
    const int64_t in = pair.input.size(-1);
    // [out, tokens] x [tokens, in]: the weight gradient of y = x W^T + b.
    torch::Tensor grad = pair.grad_output.reshape({-1, out})
                             .t()
                             .mm(pair.input.reshape({-1, in}))
                             .to(pair.weight.scalar_type());
    torch::Tensor& accumulated = pair.weight.mutable_grad();
    if (accumulated.defined()) {
      accumulated.add_(grad);
    } else {
      accumulated = std::move(grad);
    }
    // Release this pair's tensors now rather than at the end.
    pair = Pair();
  }
}

size_t WeightGradStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pairs_.size();
}

int64_t WeightGradStore::stored_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const Pair& pair : pairs_) {
    for (const torch::Tensor* t : {&pair.input, &pair.grad_output}) {
      const c10::StorageImpl* storage = t->storage().unsafeGetStorageImpl();
      if (seen.insert(storage).second) bytes += static_cast<int64_t>(t->storage().nbytes());
    }
  }
  return bytes;
}

WeightGradStore* CurrentWeightGradStore() { return current_store; }

WeightGradScope::WeightGradScope(WeightGradStore* store) : previous_(current_store) {
  current_store = store;
}

WeightGradScope::~WeightGradScope() { current_store = previous_; }

}  // namespace varipipe::executor
