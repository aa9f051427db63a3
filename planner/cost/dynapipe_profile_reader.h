// Importer for DynaPipe's published profile directories, so its users can
// bring their measurements.
//
// One text file per profiled configuration, named
//   microbench_tp{tp}_hs{h}_ah{heads}_kv{kv}_ffhs{ffn}_encsl{S}_decsl{T}_mbs{b}[_rc_...].txt
//   microbench_tp{tp}_hs{h}_ah{heads}_kv{kv}_ffhs{ffn}_sl{S}_mbs{b}[_rc_...].txt   (GPT)
// where the optional suffix is _rc_selective, _rc_full or _rc_full_uniform
// (none: no recomputation), holding lines "name: value unit":
//   forward_encoder, backward_encoder, forward_decoder, backward_decoder,
//   forward_postprocess, backward_postprocess                  (ms, per layer)
//   encoder_activation, decoder_activation                     (MB, per layer)
//   peak_encoder_activation, peak_decoder_activation           (MB)
//   model_embedding..., model_encoder..., model_decoder...     (MB of 16-bit
//                                                              parameters)
// Other names are ignored. Comment lines (starting with '#', such as the
// configuration header DynaPipe writes first) and lines that are not
// 'name: value unit' are skipped and counted (DynaPipeProfileSummary, and
// the cost model's description, which varipipe-plan logs). A GPT profile's
// "encoder" is its decoder-only
// layer. MB is taken as 2^20 bytes. Configurations missing from the sweep
// (skipped after running out of memory) become infeasible grid points.
// Peak values are used as one layer's peak, as DynaPipe's planner does; the
// postprocess has no memory entries and counts as zero memory; its
// parameters are taken as a copy of the (tied) embedding.
//
// Malformed file names, a known name with a wrong unit or value, or
// inconsistent model dimensions fail with the file name (and line).
#ifndef VARIPIPE_PLANNER_COST_DYNAPIPE_PROFILE_READER_H_
#define VARIPIPE_PLANNER_COST_DYNAPIPE_PROFILE_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"

namespace varipipe::planner {

struct DynaPipeProfileSummary {
  int files = 0;
  int skipped_lines = 0;  // comment and unknown lines
  bool encoder_decoder = false;
  uint32_t hidden = 0, heads = 0, kv_channels = 0, ffn = 0;
};

absl::StatusOr<CostModel> ReadDynaPipeProfileDirectory(const std::string& directory,
                                                       DynaPipeProfileSummary* summary = nullptr);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_DYNAPIPE_PROFILE_READER_H_
