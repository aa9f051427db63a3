// The reference the equivalence tests compare against: the whole mini-batch
// of a set of plans as one micro-batch on one stage holding the whole model,
// one optimizer step.
#ifndef VARIPIPE_TESTS_TESTING_UNPIPELINED_REFERENCE_H_
#define VARIPIPE_TESTS_TESTING_UNPIPELINED_REFERENCE_H_

#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/dataset/sample_dataset.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

struct ReferenceStep {
  double loss = 0;
  std::map<std::string, torch::Tensor> initial;  // parameters before the step
  std::map<std::string, torch::Tensor> trained;  // and after
};

// `config` with defaults applied; `plans` one per rank of one iteration.
ReferenceStep UnpipelinedStep(const v1::JobConfig& config,
                              const std::vector<v1::ExecutionPlan>& plans,
                              const SampleDataset& dataset);

// max over tensors of ||a - b|| / ||b|| (normwise, per tensor), and the
// same for the updates (a - initial vs b - initial).
struct Differences {
  double parameters = 0;
  double updates = 0;
  int compared = 0;
};
Differences Compare(const std::map<std::string, torch::Tensor>& actual,
                    const ReferenceStep& reference);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_UNPIPELINED_REFERENCE_H_
