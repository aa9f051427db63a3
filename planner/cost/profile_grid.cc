#include "planner/cost/profile_grid.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace varipipe::planner {
namespace {

// Where x falls on an axis: value = (1 - w) * at(lo) + w * at(hi).
struct AxisPosition {
  int lo = 0;
  int hi = 0;
  double w = 0;
};

// False when x lies beyond the last point. Below the first point clamps.
bool Locate(const std::vector<uint32_t>& axis, double x, AxisPosition* p) {
  if (x > axis.back()) return false;
  if (x <= axis.front()) {
    *p = {0, 0, 0};
    return true;
  }
  const auto it =
      std::lower_bound(axis.begin(), axis.end(), x, [](uint32_t a, double v) { return a < v; });
  const int hi = static_cast<int>(it - axis.begin());
  if (*it == x) {
    *p = {hi, hi, 0};
    return true;
  }
  const int lo = hi - 1;
  *p = {lo, hi, (x - axis[lo]) / (static_cast<double>(axis[hi]) - axis[lo])};
  return true;
}

bool IsFinite(const CostValues& v) {
  return std::isfinite(v.forward_ms) && std::isfinite(v.backward_ms) &&
         std::isfinite(v.stored_bytes) && std::isfinite(v.peak_bytes);
}

// Accumulates weight * v into sum; false when v is infeasible and weight > 0.
bool Accumulate(const CostValues& v, double weight, CostValues* sum) {
  if (weight == 0) return true;
  if (!IsFinite(v)) return false;
  sum->forward_ms += weight * v.forward_ms;
  sum->backward_ms += weight * v.backward_ms;
  sum->stored_bytes += weight * v.stored_bytes;
  sum->peak_bytes += weight * v.peak_bytes;
  return true;
}

absl::Status CheckAxis(const std::vector<uint32_t>& axis, absl::string_view name,
                       const std::string& what) {
  if (axis.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " is empty"));
  if (axis.size() > static_cast<size_t>(ProfileGrid::kMaxAxisPoints)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " has ", axis.size(),
                                                   " points (at most ", ProfileGrid::kMaxAxisPoints,
                                                   ")"));
  }
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] == 0 || (i > 0 && axis[i] <= axis[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", name, " must be positive and strictly increasing (got ",
                       absl::StrJoin(axis, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProfileGrid> ProfileGrid::Create(std::vector<uint32_t> micro_batch_sizes,
                                                std::vector<uint32_t> seq_lens,
                                                std::vector<uint32_t> encoder_seq_lens,
                                                std::vector<CostValues> values,
                                                const std::string& what) {
  if (auto s = CheckAxis(micro_batch_sizes, "micro_batch_sizes", what); !s.ok()) return s;
  if (auto s = CheckAxis(seq_lens, "seq_lens", what); !s.ok()) return s;
  if (!encoder_seq_lens.empty()) {
    if (auto s = CheckAxis(encoder_seq_lens, "encoder_seq_lens", what); !s.ok()) return s;
  }
  const size_t expected =
      micro_batch_sizes.size() * seq_lens.size() * std::max<size_t>(1, encoder_seq_lens.size());
  if (values.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", values.size(), " values for a grid of ", expected, " points"));
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < values.size(); ++i) {
    const CostValues& v = values[i];
    for (double x : {v.forward_ms, v.backward_ms, v.stored_bytes, v.peak_bytes}) {
      if (std::isnan(x) || x < 0 || x == -inf) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": value ", x, " at point ", i,
                         " (costs must be zero or positive, or Infinity for an infeasible point)"));
      }
    }
    if (IsFinite(v) && v.stored_bytes > v.peak_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": at point ", i, " stored activation (",
                                                     v.stored_bytes, " bytes) exceeds peak (",
                                                     v.peak_bytes, " bytes)"));
    }
  }
  ProfileGrid grid;
  // The O(1) table for integer micro-batch sizes (bounded: larger axes fall
  // back to binary search).
  if (micro_batch_sizes.back() <= (1u << 20)) {
    grid.b_interval_.resize(micro_batch_sizes.back() + 1);
    size_t k = 0;
    for (uint32_t b = 0; b <= micro_batch_sizes.back(); ++b) {
      while (k + 1 < micro_batch_sizes.size() && micro_batch_sizes[k + 1] <= b) ++k;
      grid.b_interval_[b] = static_cast<uint8_t>(k);
    }
  }
  grid.b_ = std::move(micro_batch_sizes);
  grid.s_ = std::move(seq_lens);
  grid.encoder_seq_lens_ = std::move(encoder_seq_lens);
  grid.values_ = std::move(values);
  return grid;
}

const CostValues& ProfileGrid::At(size_t b_index, size_t encoder_index, size_t s_index) const {
  const size_t encoder_points = std::max<size_t>(1, encoder_seq_lens_.size());
  return values_[(b_index * encoder_points + encoder_index) * s_.size() + s_index];
}

bool ProfileGrid::Row(double s, double encoder_s, BatchRow* row) const {
  AxisPosition ps;
  AxisPosition pe;
  if (!Locate(s_, s, &ps)) return false;
  if (three_d() && !Locate(encoder_seq_lens_, encoder_s, &pe)) return false;
  row->b_ = &b_;
  row->size_ = static_cast<int>(b_.size());
  for (int k = 0; k < row->size_; ++k) {
    CostValues sum;
    bool ok = Accumulate(At(k, pe.lo, ps.lo), (1 - pe.w) * (1 - ps.w), &sum) &&
              Accumulate(At(k, pe.lo, ps.hi), (1 - pe.w) * ps.w, &sum);
    if (three_d()) {
      ok = ok && Accumulate(At(k, pe.hi, ps.lo), pe.w * (1 - ps.w), &sum) &&
           Accumulate(At(k, pe.hi, ps.hi), pe.w * ps.w, &sum);
    }
    row->values_[k] = sum;
    row->feasible_[k] = ok;
  }
  return true;
}

bool ProfileGrid::LocateBatch(uint32_t b, BatchPosition* p) const {
  if (b > b_.back()) return false;
  if (b_interval_.empty()) {
    AxisPosition a;
    Locate(b_, b, &a);
    *p = {a.lo, a.hi, a.w};
    return true;
  }
  if (b <= b_.front()) {
    *p = {0, 0, 0};
    return true;
  }
  const int lo = b_interval_[b];
  if (b_[lo] == b) {
    *p = {lo, lo, 0};
    return true;
  }
  *p = {lo, lo + 1, (b - static_cast<double>(b_[lo])) / (static_cast<double>(b_[lo + 1]) - b_[lo])};
  return true;
}

bool ProfileGrid::Lookup(const BatchPosition& b, double s, CostValues* out) const {
  AxisPosition ps;
  if (three_d() || !Locate(s_, s, &ps)) return false;
  CostValues sum;
  if (!Accumulate(At(b.lo, 0, ps.lo), (1 - b.w) * (1 - ps.w), &sum) ||
      !Accumulate(At(b.lo, 0, ps.hi), (1 - b.w) * ps.w, &sum) ||
      !Accumulate(At(b.hi, 0, ps.lo), b.w * (1 - ps.w), &sum) ||
      !Accumulate(At(b.hi, 0, ps.hi), b.w * ps.w, &sum)) {
    return false;
  }
  *out = sum;
  return true;
}

bool ProfileGrid::BatchRow::Lookup(double b, CostValues* out) const {
  AxisPosition pb;
  if (!Locate(*b_, b, &pb)) return false;
  CostValues sum;
  if (!feasible_[pb.lo] && 1 - pb.w > 0) return false;
  if (!feasible_[pb.hi] && pb.w > 0) return false;
  Accumulate(values_[pb.lo], 1 - pb.w, &sum);
  Accumulate(values_[pb.hi], pb.w, &sum);
  *out = sum;
  return true;
}

bool ProfileGrid::Lookup(double b, double s, double encoder_s, CostValues* out) const {
  AxisPosition pb;
  AxisPosition ps;
  AxisPosition pe;
  if (!Locate(b_, b, &pb) || !Locate(s_, s, &ps)) return false;
  if (three_d() && !Locate(encoder_seq_lens_, encoder_s, &pe)) return false;
  CostValues sum;
  for (int ib = 0; ib < 2; ++ib) {
    const double wb = ib == 0 ? 1 - pb.w : pb.w;
    const int kb = ib == 0 ? pb.lo : pb.hi;
    for (int ie = 0; ie < (three_d() ? 2 : 1); ++ie) {
      const double we = three_d() ? (ie == 0 ? 1 - pe.w : pe.w) : 1.0;
      const int ke = ie == 0 ? pe.lo : pe.hi;
      if (!Accumulate(At(kb, ke, ps.lo), wb * we * (1 - ps.w), &sum) ||
          !Accumulate(At(kb, ke, ps.hi), wb * we * ps.w, &sum)) {
        return false;
      }
    }
  }
  *out = sum;
  return true;
}

}  // namespace varipipe::planner
