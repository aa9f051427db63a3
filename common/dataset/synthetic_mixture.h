// A deterministic FLAN-like multi-task length mixture.
//
// Instruction-tuning mixtures combine tasks whose inputs range from a few
// tokens to thousands and whose targets are mostly short (DynaPipe section 2,
// Fig. 1). This generator draws (input, target) lengths from a weighted
// mixture of per-task log-normal distributions. Sample i's lengths are a pure
// function of (seed, i): any process computes them independently, in any
// order, without storing the dataset.
//
// The default mixture (docs/datasets.md documents it):
//
//   task             weight  input median/sigma  target median/sigma
//   classification   0.35    80  / 0.6           2   / 0.3
//   qa               0.25    150 / 0.7           8   / 0.6
//   translation      0.15    40  / 0.5           45  / 0.5
//   summarization    0.15    600 / 0.8           60  / 0.5
//   long_context     0.10    1500 / 0.9          120 / 0.6
//
// The documents-like mixture (Documents()): text documents, mostly short
// with a long tail up to the maximum length (about 350 samples per 65,536
// tokens at a maximum length of 2,048; 330 at 8,192):
//
//   task             weight  input median/sigma  target median/sigma
//   short            0.61    38  / 0.7           3   / 0.5
//   medium           0.30    160 / 0.8           10  / 0.6
//   long             0.09    720 / 1.15          30  / 0.7
//
// The long-tail mixture (LongTail()): long-context documents whose median
// sequence (input + target) is about 1,500 tokens, with a tail to 64k
// (about 11% of samples above 8k, 4.5% above 16k, 1.5% above 32k, 0.1% at
// 64k or more; a mean of about 3,800 tokens at a maximum length of 65,536),
// where context parallelism pays only for the longest samples:
//
//   task             weight  input median/sigma  target median/sigma
//   short            0.62    700   / 0.9         120 / 0.7
//   medium           0.28    3000  / 0.7         250 / 0.6
//   long             0.08    12000 / 0.5         400 / 0.5
//   very_long        0.02    36000 / 0.35        600 / 0.5
//
// Lengths are at least 1. The generator does not truncate: callers apply the
// job's maximum lengths.
#ifndef VARIPIPE_COMMON_DATASET_SYNTHETIC_MIXTURE_H_
#define VARIPIPE_COMMON_DATASET_SYNTHETIC_MIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace varipipe {

// Input and target length of one sample, in tokens. Decoder-only (GPT)
// training uses input + target as the sequence.
struct SampleLengths {
  uint32_t input = 0;
  uint32_t target = 0;
  friend bool operator==(const SampleLengths&, const SampleLengths&) = default;
};

struct SyntheticTask {
  std::string name;
  double weight = 0;  // relative; need not sum to 1
  double input_median = 0;
  double input_sigma = 0;  // of log(length)
  double target_median = 0;
  double target_sigma = 0;
};

class SyntheticMixture {
 public:
  // The default FLAN-like mixture above.
  static SyntheticMixture Flan(uint64_t seed);
  // The documents-like mixture above.
  static SyntheticMixture Documents(uint64_t seed);
  // The long-tail mixture above.
  static SyntheticMixture LongTail(uint64_t seed);
  // By name: "flan", "documents" or "long_tail" (anything else: flan).
  static SyntheticMixture Named(const std::string& name, uint64_t seed);

  // REQUIRES: tasks non-empty, weights non-negative with a positive sum,
  // medians positive, sigmas non-negative.
  SyntheticMixture(std::vector<SyntheticTask> tasks, uint64_t seed);

  // Lengths of sample `index`. Thread-safe (const, no state).
  SampleLengths Sample(uint64_t index) const;
  // Task index that sample `index` belongs to.
  int TaskOf(uint64_t index) const;

  const std::vector<SyntheticTask>& tasks() const { return tasks_; }
  uint64_t seed() const { return seed_; }

 private:
  std::vector<SyntheticTask> tasks_;
  std::vector<double> cumulative_weight_;  // normalised, last == 1
  uint64_t seed_;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_SYNTHETIC_MIXTURE_H_
