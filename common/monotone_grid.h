// Monotone cost grids. The planner's micro-batching DP relies on a
// component's time and memory never decreasing with the micro-batch size or
// any length; measured grids can dip by noise. varipipe-profile and the
// planner's cost-model readers repair them by one rule (docs/cost-model.md,
// "Monotone grids").
#ifndef VARIPIPE_COMMON_MONOTONE_GRID_H_
#define VARIPIPE_COMMON_MONOTONE_GRID_H_

#include <cstdint>
#include <string>
#include <vector>

namespace varipipe {

// Repair rule: each value of `values` (row-major over the axes b,
// e, s; `e` empty for a 2-D grid) is raised to the largest value at any
// point with no larger coordinate on any axis (running maxima along each
// axis; Infinity stays). Returns how many values were raised; `first` (when
// given and something was raised) describes the first raised cell, e.g.
// "b=4 s=128: 2.1 below 2.3".
int RaiseToRunningMaxima(const std::vector<uint32_t>& b, const std::vector<uint32_t>& e,
                         const std::vector<uint32_t>& s, std::vector<double>& values,
                         std::string* first = nullptr);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_MONOTONE_GRID_H_
