#include "common/monotone_grid.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe {

int RaiseToRunningMaxima(const std::vector<uint32_t>& b, const std::vector<uint32_t>& e,
                         const std::vector<uint32_t>& s, std::vector<double>& values,
                         std::string* first) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t nb = b.size(), ne = std::max<size_t>(1, e.size()), ns = s.size();
  const auto at = [&](size_t i, size_t j, size_t k) { return (i * ne + j) * ns + k; };
  int raised = 0;
  for (size_t i = 0; i < nb; ++i) {
    for (size_t j = 0; j < ne; ++j) {
      for (size_t k = 0; k < ns; ++k) {
        double floor = 0;
        if (i > 0) floor = std::max(floor, values[at(i - 1, j, k)]);
        if (j > 0) floor = std::max(floor, values[at(i, j - 1, k)]);
        if (k > 0) floor = std::max(floor, values[at(i, j, k - 1)]);
        double& x = values[at(i, j, k)];
        if (x < floor || (floor == kInf && x != kInf)) {
          if (raised == 0 && first != nullptr) {
            *first = absl::StrCat("b=", b[i], e.empty() ? "" : absl::StrCat(" e=", e[j]),
                                  " s=", s[k], ": ", absl::StrFormat("%g below %g", x, floor));
          }
          x = floor;
          ++raised;
        }
      }
    }
  }
  return raised;
}

}  // namespace varipipe
