// Model stages chained in one process, as a pipeline chains them across
// ranks: each stage after the first takes the previous stage's outputs as
// detached leaves (what a transfer hands over), so gradients stop at every
// boundary and are passed back by hand.
#ifndef VARIPIPE_TESTS_TESTING_STAGE_CHAIN_H_
#define VARIPIPE_TESTS_TESTING_STAGE_CHAIN_H_

#include <torch/torch.h>

#include <vector>

#include "executor/model/model_stage.h"

namespace varipipe::testing {

// Backward of the chain: the last stage's loss, then each earlier stage's
// outputs (hidden, and the encoder output where it travels) with the
// gradients the next stage's inputs received. `inputs[i]` are stage i's
// inputs, `outputs[i]` its outputs.
inline void BackwardAcrossStages(const std::vector<executor::StageActivations>& inputs,
                                 const std::vector<executor::StageActivations>& outputs) {
  outputs.back().loss.backward();
  for (size_t i = outputs.size() - 1; i-- > 0;) {
    std::vector<torch::Tensor> tensors{outputs[i].hidden};
    std::vector<torch::Tensor> grads{inputs[i + 1].hidden.grad()};
    if (outputs[i].memory.defined()) {
      tensors.push_back(outputs[i].memory);
      grads.push_back(inputs[i + 1].memory.grad());
    }
    torch::autograd::backward(tensors, grads);
  }
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_STAGE_CHAIN_H_
