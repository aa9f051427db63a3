#include "executor/runtime/foreach_step.h"

#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace varipipe::executor {
namespace {

// The key under which the optimizer keeps a parameter's state: the address
// of its TensorImpl, as a string (LibTorch 1.x, printed as
// c10::guts::to_string prints it) or as the pointer itself (later versions).
template <typename Map>
typename Map::key_type StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<typename Map::key_type>(p.unsafeGetTensorImpl());
  }
}

// One group's parameters (with gradients) that share a step count, and
// their gradients and moments.
struct AdamWLists {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

}  // namespace

void ForeachAdamWStep(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  auto& states = optimizer.state();
  using StateMap = std::remove_reference_t<decltype(states)>;
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "the multi-tensor AdamW step does not support amsgrad");
    // Step counts after this step -> lists (one entry unless parameters
    // joined at different times).
    std::map<int64_t, AdamWLists> by_step;
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "AdamW does not support sparse gradients");
      const auto key = StateKey<StateMap>(p);
      auto found = states.find(key);
      if (found == states.end()) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        found = states.emplace(key, std::move(state)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      state.step(state.step() + 1);
      AdamWLists& lists = by_step[state.step()];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.exp_avgs.push_back(state.exp_avg());
      lists.exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    const double lr = options.lr();
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    for (auto& [step, l] : by_step) {
      if (options.weight_decay() != 0) {
        torch::_foreach_mul_(l.params, 1 - lr * options.weight_decay());
      }
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      torch::_foreach_mul_(l.exp_avgs, beta1);
      torch::_foreach_add_(l.exp_avgs, l.grads, 1 - beta1);
      torch::_foreach_mul_(l.exp_avg_sqs, beta2);
      torch::_foreach_addcmul_(l.exp_avg_sqs, l.grads, l.grads, 1 - beta2);
      std::vector<torch::Tensor> denom = torch::_foreach_sqrt(l.exp_avg_sqs);
      torch::_foreach_div_(denom, std::sqrt(bias_correction2));
      torch::_foreach_add_(denom, options.eps());
      torch::_foreach_addcdiv_(l.params, l.exp_avgs, denom, -lr / bias_correction1);
    }
  }
}

void ForeachSgdStep(torch::optim::SGD& optimizer) {
  torch::NoGradGuard no_grad;
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    TORCH_CHECK(options.momentum() == 0, "the multi-tensor SGD step supports momentum 0 only");
    std::vector<torch::Tensor> params, grads;
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (params.empty()) continue;
    if (options.weight_decay() != 0) {
      grads = torch::_foreach_add(grads, params, options.weight_decay());
    }
    torch::_foreach_add_(params, grads, -options.lr());
  }
}

}  // namespace varipipe::executor
