// ProfileGrid: the costs of one model component (a layer, the embedding or
// the LM head) measured on a grid of micro-batch sizes and padded sequence
// lengths, with multilinear interpolation between grid points (DynaPipe
// section 3, "Cost models": profiled at power-of-two points, linear
// interpolation in between).
//
// Axes: micro-batch size `b` and sequence length `s`; a T5 decoder layer has
// a third axis, the encoder length, so its grid is [b][encoder_s][s].
//
// Policy outside the grid (per axis):
//   - beyond the largest point: infeasible. Lookups return false; nothing is
//     ever extrapolated upwards.
//   - below the smallest point: the value at the smallest point (costs of
//     tiny micro-batches are dominated by fixed overheads, so this errs on
//     the expensive side).
// A grid point may itself be infeasible (+infinity, e.g. a configuration
// that ran out of memory while profiling); an interpolation that gives such
// a point a non-zero weight is infeasible.
//
// Invariants (checked by Create): axes non-empty, strictly increasing,
// positive, at most kMaxAxisPoints points; values finite and >= 0 or
// +infinity; stored <= peak where both are finite.
//
// Thread safety: immutable after Create; lookups are const, allocation-free
// and may run concurrently.
#ifndef VARIPIPE_PLANNER_COST_PROFILE_GRID_H_
#define VARIPIPE_PLANNER_COST_PROFILE_GRID_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/monotone_grid.h"

namespace varipipe::planner {

// Costs of one component for one micro-batch.
struct CostValues {
  double forward_ms = 0;
  double backward_ms = 0;
  // Activation memory kept from forward until backward.
  double stored_bytes = 0;
  // Highest memory while the component runs (stored included).
  double peak_bytes = 0;

  CostValues& operator+=(const CostValues& o) {
    forward_ms += o.forward_ms;
    backward_ms += o.backward_ms;
    stored_bytes += o.stored_bytes;
    peak_bytes += o.peak_bytes;
    return *this;
  }
  friend bool operator==(const CostValues&, const CostValues&) = default;
};

class ProfileGrid {
 public:
  static constexpr int kMaxAxisPoints = 48;

  // `values` is row-major over [b][encoder_s][s] (encoder_s empty for a 2-D
  // grid). `what` names the grid in errors ("GPT layer, recompute none").
  static absl::StatusOr<ProfileGrid> Create(std::vector<uint32_t> micro_batch_sizes,
                                            std::vector<uint32_t> seq_lens,
                                            std::vector<uint32_t> encoder_seq_lens,
                                            std::vector<CostValues> values,
                                            const std::string& what);

  bool three_d() const { return !encoder_seq_lens_.empty(); }
  const std::vector<uint32_t>& micro_batch_sizes() const { return b_; }
  const std::vector<uint32_t>& seq_lens() const { return s_; }
  const std::vector<uint32_t>& encoder_seq_lens() const { return encoder_seq_lens_; }
  const std::vector<CostValues>& values() const { return values_; }
  // The value stored at a grid point (indices into the axes).
  const CostValues& At(size_t b_index, size_t encoder_index, size_t s_index) const;

  // Interpolated costs of a micro-batch of `b` samples padded to `s`
  // (`encoder_s` for 3-D grids; ignored otherwise). False when infeasible.
  bool Lookup(double b, double s, double encoder_s, CostValues* out) const;
  bool Lookup(double b, double s, CostValues* out) const { return Lookup(b, s, 0, out); }

  // Where an integer micro-batch size falls on the b axis: the value is
  // (1 - w) * point[lo] + w * point[hi]. False beyond the last point. O(1)
  // (a table built at creation), for the DP's inner loop.
  struct BatchPosition {
    int lo = 0;
    int hi = 0;
    double w = 0;
  };
  bool LocateBatch(uint32_t b, BatchPosition* p) const;
  // Lookup(b, s) for the b of a LocateBatch position (2-D grids): the
  // same result without locating b again.
  bool Lookup(const BatchPosition& b, double s, CostValues* out) const;

  // The grid interpolated at fixed sequence length(s), for many lookups over
  // b: DP inner loops evaluate one row per distinct length.
  class BatchRow {
   public:
    // Same result as ProfileGrid::Lookup(b, s, encoder_s).
    bool Lookup(double b, CostValues* out) const;
    // The same at a position from LocateBatch of a grid with this row's b
    // axis.
    bool Lookup(const BatchPosition& p, CostValues* out) const {
      if ((!feasible_[p.lo] && p.w < 1) || (!feasible_[p.hi] && p.w > 0)) return false;
      const CostValues& lo = values_[p.lo];
      const CostValues& hi = values_[p.hi];
      const double u = 1 - p.w;
      out->forward_ms = u * lo.forward_ms + p.w * hi.forward_ms;
      out->backward_ms = u * lo.backward_ms + p.w * hi.backward_ms;
      out->stored_bytes = u * lo.stored_bytes + p.w * hi.stored_bytes;
      out->peak_bytes = u * lo.peak_bytes + p.w * hi.peak_bytes;
      return true;
    }

   private:
    friend class ProfileGrid;
    const std::vector<uint32_t>* b_ = nullptr;
    // Number of b-axis points; values_[k] is the grid interpolated at
    // (b_[k], s, encoder_s), usable only where feasible_[k].
    int size_ = 0;
    std::array<CostValues, kMaxAxisPoints> values_{};
    std::array<bool, kMaxAxisPoints> feasible_{};
  };
  // False when s or encoder_s lies beyond its axis.
  bool Row(double s, double encoder_s, BatchRow* row) const;

 private:
  ProfileGrid() = default;

  std::vector<uint32_t> b_;
  // b_interval_[b] = index of the last axis point <= b, for b <= b_.back().
  std::vector<uint8_t> b_interval_;
  std::vector<uint32_t> s_;
  std::vector<uint32_t> encoder_seq_lens_;
  std::vector<CostValues> values_;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_PROFILE_GRID_H_
