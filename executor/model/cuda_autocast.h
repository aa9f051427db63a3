// The calling thread's CUDA autocast state, the same calls for every LibTorch
// the executor builds against: LibTorch 2.4 made the device an argument
// (is_autocast_enabled(at::kCUDA), get_autocast_dtype(at::kCUDA)) and
// deprecated the CUDA-only calls (is_enabled(), get_autocast_gpu_dtype()),
// which since also warn at run time; LibTorch 1.x has only the latter.
#ifndef VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_
#define VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_

#include <ATen/autocast_mode.h>
#include <torch/version.h>

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

// The dtype a matrix product (torch::linear, the attention kernels) runs in
// for `x`: the CUDA autocast dtype when autocast is on and x is on a GPU,
// else x's own.
inline at::ScalarType ComputeDtype(const at::Tensor& x) {
  if (x.is_cuda() && CudaAutocastEnabled()) return CudaAutocastDtype();
  return x.scalar_type();
}

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_CUDA_AUTOCAST_H_
