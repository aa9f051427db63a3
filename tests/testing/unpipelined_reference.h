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
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_stage.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

struct ReferenceStep {
  double loss = 0;
  std::map<std::string, torch::Tensor> initial;  // parameters before the step
  std::map<std::string, torch::Tensor> trained;  // and after
};

// Everything one stage holding the whole model needs to run micro-batch `mb`
// in one pass, read through the executor's loader (packed rows included):
// lengths, segments and positions, tokens, decoder tokens (T5) and labels.
executor::StageBatch WholeModelBatch(const executor::MicroBatchLoader& loader,
                                     const v1::MicroBatch& mb, bool t5, double loss_scale);

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
