// The format version of cost-model files (varipipe.v1.CostModelFile's
// format_version), shared by varipipe-profile, which writes them, and the
// planner, which reads them (planner/cost/cost_model_io.h).
//
//   1: before packed rows' attention ran as one variable-length kernel per
//      layer and the loss head only on labelled positions, a chunk at a
//      time: the attention-core grid measured the dense core on every
//      device, the head fp32 logits over the whole vocabulary at once.
//   2: the attention-core grid is the kernel packed rows run on the
//      profiling device (one variable-length launch where one serves it),
//      the head the chunked head (docs/cost-model.md, "Profile versions").
//
// The planner refuses any other version and tells the user to re-profile:
// a version-1 grid cannot be converted (its head and core measured kernels
// the executor no longer runs).
#ifndef VARIPIPE_COMMON_COST_MODEL_FORMAT_H_
#define VARIPIPE_COMMON_COST_MODEL_FORMAT_H_

#include <cstdint>

namespace varipipe {

inline constexpr uint32_t kCostModelFormatVersion = 2;

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_COST_MODEL_FORMAT_H_
