// Precompiled header of the executor's LibTorch translation units (CMake
// target_precompile_headers; see VARIPIPE_TORCH_PCH). Sources still include
// what they use; this file only makes the heavy LibTorch headers cheap.
#include <torch/torch.h>
