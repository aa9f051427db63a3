// The median of a sample: the middle value, or the mean of the two middle
// values of an even count; 0 for an empty sample. Used for measurements
// (profiles, calibration) and for benchmark reports.
#ifndef VARIPIPE_COMMON_MEDIAN_H_
#define VARIPIPE_COMMON_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace varipipe {

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_MEDIAN_H_
