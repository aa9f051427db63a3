#include "executor/model/weight_cast_cache.h"

#include <map>
#include <mutex>
#include <utility>

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// One parameter's copy in one dtype. The weak reference keeps the
// parameter's TensorImpl address from being reused while the entry exists.
struct Entry {
  WeakImpl owner;
  int64_t version;
  const void* data;
  torch::Tensor copy;
};

struct Cache {
  std::mutex mutex;
  std::map<std::pair<const c10::TensorImpl*, int>, Entry> entries;  // guarded by mutex
  int64_t casts = 0;                                                // guarded by mutex
};

Cache& TheCache() {
  static Cache* const kCache = new Cache();
  return *kCache;
}

// Forward: the cached copy (a fresh tensor sharing its storage, so that
// autograd records its history on that tensor and not on the cache's).
// Backward: the gradient in the parameter's dtype.
class CastParameter : public torch::autograd::Function<CastParameter> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& parameter,
                               int64_t dtype) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(parameter.scalar_type());
    return CachedCast(parameter, static_cast<torch::ScalarType>(dtype)).detach();
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const torch::Tensor& grad = grad_outputs[0];
    return {grad.defined() ? grad.to(static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt()))
                           : grad,
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CachedCast(const torch::Tensor& parameter, torch::ScalarType dtype) {
  Cache& cache = TheCache();
  const c10::TensorImpl* impl = parameter.unsafeGetTensorImpl();
  const int64_t version = parameter._version();
  const void* data = parameter.data_ptr();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto key = std::make_pair(impl, static_cast<int>(dtype));
  const auto it = cache.entries.find(key);
  if (it != cache.entries.end() && it->second.version == version && it->second.data == data) {
    return it->second.copy;
  }
  // A miss: the parameter changed (or is new). Drop the copies of
  // parameters that died, then make this one's.
  for (auto e = cache.entries.begin(); e != cache.entries.end();) {
    e = e->second.owner.expired() ? cache.entries.erase(e) : std::next(e);
  }
  cache.entries.erase(key);  // the stale copy first: one copy at a time
  torch::Tensor copy;
  {
    torch::NoGradGuard no_grad;
    copy = parameter.detach().to(dtype);
  }
  cache.entries.emplace(key, Entry{.owner = WeakImpl(parameter.getIntrusivePtr()),
                                   .version = version,
                                   .data = data,
                                   .copy = copy});
  ++cache.casts;
  return copy;
}

torch::Tensor ParameterIn(const torch::Tensor& parameter, torch::ScalarType dtype) {
  if (parameter.scalar_type() == dtype) return parameter;
  if (!parameter.is_leaf()) return parameter.to(dtype);
  if (torch::GradMode::is_enabled() && parameter.requires_grad()) {
    return CastParameter::apply(parameter, static_cast<int64_t>(dtype));
  }
  return CachedCast(parameter, dtype);
}

WeightCastStats WeightCastCacheStats() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  WeightCastStats stats{.casts = cache.casts, .held_bytes = 0};
  for (const auto& [key, entry] : cache.entries) {
    if (!entry.owner.expired()) {
      stats.held_bytes += static_cast<int64_t>(entry.copy.storage().nbytes());
    }
  }
  return stats;
}

void ClearWeightCasts() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.entries.clear();
  cache.casts = 0;
}

}  // namespace varipipe::executor
