// The calling thread's CUDA autocast state, the same calls for every LibTorch
// the executor builds against: LibTorch 2.4 made the device an argument
// (is_autocast_enabled(at::kCUDA), get_autocast_dtype(at::kCUDA)) and
// deprecated the CUDA-only calls (is_enabled(), get_autocast_gpu_dtype()),
// which since also warn at run time; LibTorch 1.x has only the latter.
// Also the one compute-dtype rule of the model code (ComputeDtype) and its
// test override (ScopedComputeDtype).
#ifndef VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_
#define VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <atomic>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VARIPIPE_AUTOCAST_BY_DEVICE 1
#endif

namespace varipipe::executor {

inline bool CudaAutocastEnabled() {
#ifdef VARIPIPE_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

inline void SetCudaAutocastEnabled(bool enabled) {
#ifdef VARIPIPE_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
#else
  at::autocast::set_enabled(enabled);
#endif
}

inline at::ScalarType CudaAutocastDtype() {
#ifdef VARIPIPE_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(at::kCUDA);
#else
  return at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void SetCudaAutocastDtype(at::ScalarType dtype) {
#ifdef VARIPIPE_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

namespace internal {
// ScopedComputeDtype's dtype, or -1: none.
inline std::atomic<int> forced_compute_dtype{-1};
}  // namespace internal

// The dtype a matrix product (torch::linear, the attention kernels) runs in
// for `x`, and the dtype of the residual stream under mixed precision
// (docs/models.md, "Mixed precision"): a ScopedComputeDtype's, else the
// CUDA autocast dtype when autocast is on and x is on a GPU, else x's own.
inline at::ScalarType ComputeDtype(const at::Tensor& x) {
  const int forced = internal::forced_compute_dtype.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<at::ScalarType>(forced);
  if (x.is_cuda() && CudaAutocastEnabled()) return CudaAutocastDtype();
  return x.scalar_type();
}

// While alive, ComputeDtype is `dtype` for every tensor on every device and
// thread: tests run the mixed-precision path (bf16 computation, fp32 master
// weights) on CPUs, where the executor has no autocast. Not nestable.
class ScopedComputeDtype {
 public:
  explicit ScopedComputeDtype(at::ScalarType dtype) {
    int expected = -1;
    TORCH_CHECK(internal::forced_compute_dtype.compare_exchange_strong(
                    expected, static_cast<int>(dtype)),
                "ScopedComputeDtype does not nest");
  }
  ~ScopedComputeDtype() { internal::forced_compute_dtype.store(-1); }
  ScopedComputeDtype(const ScopedComputeDtype&) = delete;
  ScopedComputeDtype& operator=(const ScopedComputeDtype&) = delete;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_
