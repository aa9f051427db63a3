#include "executor/model/tensor_parallel_ops.h"

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

const TensorGroup& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<const TensorGroup*>(ctx->saved_data["group"].toInt());
}

void SaveGroup(AutogradContext* ctx, const TensorGroup* group) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
}

int64_t PartRows(int64_t length, int parts) { return (length + parts - 1) / parts; }

// x [b, s, h] with zero rows appended up to `rows`.
torch::Tensor PadSequence(const torch::Tensor& x, int64_t rows) {
  if (x.size(1) == rows) return x;
  return torch::constant_pad_nd(x, {0, 0, 0, rows - x.size(1)});
}

// This rank's part of x [b, s, h] (padded to a multiple of the group size).
torch::Tensor PartOf(const torch::Tensor& x, const TensorGroup& group) {
  const int64_t part = PartRows(x.size(1), group.size());
  return PadSequence(x, part * group.size()).narrow(1, group.index() * part, part).contiguous();
}

// The parts gathered, without the padding beyond `length`.
torch::Tensor GatherParts(const torch::Tensor& x, const TensorGroup& group, int64_t length) {
  return group.AllGather(x, 1).narrow(1, 0, length).contiguous();
}

// The sum of the ranks' x, this rank's part of it.
torch::Tensor ReduceScatterParts(const torch::Tensor& x, const TensorGroup& group) {
  const int64_t part = PartRows(x.size(1), group.size());
  return group.ReduceScatter(PadSequence(x, part * group.size()), 1);
}

class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup* group) {
    SaveGroup(ctx, group);
    return x.view_as(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    return {GroupOf(ctx).AllReduceSum(grad[0]), torch::Tensor()};
  }
};

class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, const TensorGroup* group) {
    return group->AllReduceSum(x);
  }
  static tensor_list backward(AutogradContext*, tensor_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

class ScatterSequence : public torch::autograd::Function<ScatterSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup* group) {
    SaveGroup(ctx, group);
    ctx->saved_data["length"] = x.size(1);
    return PartOf(x, *group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    return {GatherParts(grad[0], GroupOf(ctx), ctx->saved_data["length"].toInt()), torch::Tensor()};
  }
};

class GatherSequence : public torch::autograd::Function<GatherSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup* group, int64_t length, bool reduce_grad) {
    SaveGroup(ctx, group);
    ctx->saved_data["reduce_grad"] = reduce_grad;
    return GatherParts(x, *group, length);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const TensorGroup& group = GroupOf(ctx);
    const torch::Tensor g = ctx->saved_data["reduce_grad"].toBool()
                                ? ReduceScatterParts(grad[0], group)
                                : PartOf(grad[0], group);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class ReduceScatterSequence : public torch::autograd::Function<ReduceScatterSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup* group) {
    SaveGroup(ctx, group);
    ctx->saved_data["length"] = x.size(1);
    return ReduceScatterParts(x, *group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    return {GatherParts(grad[0], GroupOf(ctx), ctx->saved_data["length"].toInt()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CopyToTensorRegion(const torch::Tensor& x, const TensorGroup& group) {
  if (group.size() == 1) return x;
  return CopyToRegion::apply(x, &group);
}

torch::Tensor ReduceFromTensorRegion(const torch::Tensor& x, const TensorGroup& group) {
  if (group.size() == 1) return x;
  return ReduceFromRegion::apply(x, &group);
}

torch::Tensor ScatterToSequence(const torch::Tensor& x, const TensorGroup& group) {
  if (group.size() == 1) return x;
  return ScatterSequence::apply(x, &group);
}

torch::Tensor GatherFromSequence(const torch::Tensor& x, const TensorGroup& group, int64_t length,
                                 bool reduce_grad) {
  if (group.size() == 1) return x;
  return GatherSequence::apply(x, &group, length, reduce_grad);
}

torch::Tensor ReduceScatterToSequence(const torch::Tensor& x, const TensorGroup& group) {
  if (group.size() == 1) return x;
  return ReduceScatterSequence::apply(x, &group);
}

torch::Tensor EnterTensorRegion(const torch::Tensor& x, const TensorGroup& group, int64_t length) {
  if (group.sequence_parallel()) return GatherFromSequence(x, group, length, /*reduce_grad=*/true);
  return CopyToTensorRegion(x, group);
}

torch::Tensor LeaveTensorRegion(const torch::Tensor& x, const TensorGroup& group) {
  if (group.sequence_parallel()) return ReduceScatterToSequence(x, group);
  return ReduceFromTensorRegion(x, group);
}

torch::Tensor SequenceParallelParameter(const torch::Tensor& p, const TensorGroup& group) {
  if (!group.sequence_parallel()) return p;
  return CopyToTensorRegion(p, group);
}

}  // namespace varipipe::executor
