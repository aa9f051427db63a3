// Runs one rank's ExecutionPlan of one iteration: its instructions strictly
// in order (docs/plan_format.md). Start instructions launch transfers without
// blocking; Wait instructions block on them under the watchdog's deadline;
// buffers are addressed by the plan's ids and dropped at FreeBuffer; forward
// passes keep what their backward passes need (only each layer's inputs
// under full recomputation, which re-runs one layer at a time inside the
// backward); a backward with weight_grad_deferred computes only input
// gradients and keeps each linear layer's input and output gradient, from
// which its WeightGradPass later accumulates the weight gradients
// (weight_grad_store.h); AllReduceGradients averages gradients over the data-parallel
// group and OptimizerStep clips by the global norm over the pipeline and
// applies the optimizer (AdamW or SGD). Under ZeRO stage 1 the gradients
// are reduce-scattered instead, the optimizer updates this rank's shard,
// and OptimizerStep all-gathers the parameters (optimizer_sharding.h).
//
// The host runs ahead of the device: inputs are built ahead on a thread and
// copied without waiting, losses are summed on the device, transfers are
// ordered after the compute stream by the transport, pass times are device
// events read at the end, and the iteration reads the device once, for the
// gradient norm and the loss sum together (host_reads.h; docs/executor.md,
// "Where the host waits").
//
// Nothing is exchanged at run time except the tensors: receive buffers are
// allocated from the shapes in the plan, and every tensor a rank produces is
// checked against the shape the plan promised its peer.
//
// LibTorch exceptions are caught here and returned as Internal errors naming
// the instruction.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_INTERPRETER_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_INTERPRETER_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/comm/transport.h"
#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_stage.h"
#include "executor/model/weight_grad_store.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/gradient_buckets.h"
#include "executor/runtime/instruction_progress.h"
#include "executor/runtime/optimizer_sharding.h"
#include "executor/runtime/plan_check.h"
#include "executor/runtime/training_optimizer.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

struct IterationStats;

struct InterpreterOptions {
  // A Wait blocking longer than this aborts the iteration with a diagnostic
  // naming the rank, instruction index, peer and micro-batch (the watchdog).
  absl::Duration wait_timeout = absl::Seconds(300);
  torch::Device device = torch::kCPU;
  // Dtype of activations handed to a stage (fp32; parameters stay fp32, the
  // master weights).
  torch::ScalarType compute_dtype = torch::kFloat32;
  // GPUs: when set (kBFloat16 or kHalf), forward passes (and recomputations)
  // run under LibTorch's CUDA autocast to this dtype: mixed precision with
  // fp32 master weights and fp32 loss.
  std::optional<torch::ScalarType> cuda_autocast_dtype;
  // Ranks of this rank's pipeline replica, ascending, as the transport
  // numbers them (pipeline ranks under tensor parallelism,
  // tensor_rank_transport.h): the global gradient norm for clipping sums
  // over them.
  std::vector<int> pipeline_group;
  // The rank's tensor group (not owned; null or of size one without tensor
  // parallelism): the gradient norm also sums over it, counting a
  // tensor-replicated parameter once (ModelStage::IsReplica). Its
  // collectives the device orders are waited for (TensorGroup::Drain, under
  // the watchdog) before the iteration's device read.
  TensorGroup* tensor_group = nullptr;
  // The rank's context group (not owned; null or of size one without
  // context parallelism): split micro-batches gather keys and values over
  // it; its collectives the device orders are waited for like the tensor
  // group's.
  TensorGroup* context_group = nullptr;
  // The shared parameters this rank holds with other ranks of its pipeline
  // replica (SharedParameterGroups: a tied embedding, T5V11's shared
  // embedding and relative bias tables), in the order every rank sums them.
  // Before the iteration's first gradient all-reduce (or its optimizer step)
  // each one's gradient is summed over its group.
  std::vector<SharedParameterGroup> shared_parameter_groups;
  // Transport for small host-side reductions (the gradient norm over the
  // pipeline): a Gloo transport next to NCCL on GPUs. Null: the main one.
  Transport* host_transport = nullptr;
  // GPUs: each timed compute pass (forward, backward, weight gradient,
  // optimizer step) is bracketed by CUDA events on the compute stream, read
  // once at the iteration's end (device_timeline.h), so that MicroBatchTime
  // and compute_seconds hold the passes' device times rather than their
  // launch times, without draining the device between passes (one more
  // host wait per iteration). CPUs ignore it (their times are exact).
  bool device_timing = false;
  // Inputs built ahead (input_prefetcher.h): how many LoadInput buffers and
  // forward lengths a background thread prepares before the passes that
  // take them. 0: built when taken, on the interpreter's thread.
  size_t prefetch_inputs = 16;
  // Data-parallel gradients (without ZeRO sharding) live in buckets of at
  // most this many bytes whose all-reduces start during the stage's last
  // backward pass (gradient_buckets.h). 0: one all-reduce per stage after
  // all its backward passes, at the AllReduceGradients instruction. Under
  // ZeRO stage 1 the sharding's buckets (OptimizerSharding::bucket_bytes,
  // fixed when it was made) are reduce-scattered the same way.
  int64_t gradient_bucket_bytes = int64_t{25} << 20;
  // Updated before every instruction when set.
  InstructionProgress* progress = nullptr;
  // CPU memory measurement (counting_allocator.h): when set, the iteration
  // records this account's bytes per instruction. The executor passes the
  // process's account; threaded tests pass each rank's own.
  MemoryAccount* memory = nullptr;
  // ZeRO stage 1 (optimizer_sharding.h): when set, AllReduceGradients
  // reduce-scatters each stage's gradients into this rank's shard, the
  // optimizer (built over the shards) steps them, and OptimizerStep
  // all-gathers the parameters after. Null: stage 0 (all-reduce).
  OptimizerSharding* sharding = nullptr;
  // Called by OptimizerStep once the gradients are final (data-parallel
  // all-reduce done, the global norm in `grad_norm`) and before clipping and
  // the update, on the interpreter's thread: equivalence tests read the
  // gradients the optimizer is about to apply (under ZeRO stage 1 the
  // shards' gradients; the model's hold only this rank's chunks of them,
  // the rest zero). Empty: nothing is called.
  std::function<void(const IterationStats&)> before_optimizer_step;
};

// Measured memory around one instruction: live bytes after it and the
// highest level while it ran.
struct InstructionMemory {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

// Compute time of one micro-batch on one stage: the forward pass, the
// backward pass including its recomputation, and for a split backward
// (weight_grad_deferred) its weight_grad apart (backward_seconds is then B
// alone). Host-side wall time: exact on CPUs; on GPUs the kernel launches,
// or the device's time with InterpreterOptions::device_timing.
struct MicroBatchTime {
  uint32_t micro_batch = 0;
  uint32_t stage = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double weight_seconds = 0;
  // The plan's profiled predictions of the passes (0: none).
  double profiled_forward_ms = 0;
  double profiled_backward_ms = 0;
  double profiled_weight_ms = 0;
};

struct IterationStats {
  uint64_t iteration = 0;
  bool has_loss = false;       // this rank holds the last stage
  double loss = 0;             // sum of its micro-batches' scaled losses
  // Input + target tokens of the micro-batches this rank runs, and the
  // same padded (a context lane: its whole micro-batches, and its local
  // tokens of the split ones, padded to all_gather_count).
  uint64_t real_tokens = 0;
  uint64_t padded_tokens = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  int instructions = 0;
  // Times the host waited for the device (host_reads.h): the one read of
  // the gradient norm and loss, and with device timing the wait for the
  // last pass's event. The same count on CPUs, where nothing waits.
  int host_reads = 0;
  // Time inside forward/backward compute and the optimizer, inside Waits and
  // all-reduce, waiting for samples and lengths from the dataset (built
  // ahead, input_prefetcher.h), and everything else (the interpreter's own
  // overhead).
  double compute_seconds = 0;
  double communication_seconds = 0;
  double data_seconds = 0;
  double overhead_seconds = 0;
  double total_seconds = 0;
  // Parts of the above: the data-parallel gradient all-reduce (waiting for
  // the other replicas included; ZeRO stage 1: the reduce-scatter and the
  // parameters' all-gather) and the optimizer's local work (gradient norm
  // and step).
  double all_reduce_seconds = 0;
  double optimizer_seconds = 0;
  // The AllReduceGradients instructions alone (part of all_reduce_seconds):
  // between the last backward pass and the optimizer step, the wait for the
  // gradient reductions (all-reduces, or ZeRO stage 1's reduce-scatters)
  // the backward did not overlap.
  double reduce_gradients_seconds = 0;
  // Gradient buckets whose all-reduce (ZeRO stage 1: reduce-scatter)
  // started inside a backward pass, and all buckets reduced
  // (gradient_buckets.h).
  int buckets_started_in_backward = 0;
  int buckets = 0;
  // In the order of the first forward of each (stage, micro-batch).
  std::vector<MicroBatchTime> micro_batch_times;
  // With InterpreterOptions::memory: live bytes when the iteration started
  // (parameters, optimizer state, gradients after the first iteration), the
  // peak during it, and per instruction. The activation peak is the
  // difference of the first two. -1 / empty without measurement.
  int64_t memory_start_bytes = -1;
  int64_t memory_peak_bytes = -1;
  std::vector<InstructionMemory> instruction_memory;
  // Split backwards: the most bytes that backwards kept for their
  // weight_grads at once (the linear layers' inputs and output gradients,
  // each storage once per store; WeightGradStore::stored_bytes). 0 without.
  int64_t weight_grad_peak_bytes = 0;
};

class PlanInterpreter {
 public:
  // `stages` maps the plan's stage ids to this rank's model stages. All
  // pointers must outlive the interpreter.
  PlanInterpreter(std::map<uint32_t, ModelStage*> stages, Transport* transport,
                  const MicroBatchLoader* loader, TrainingOptimizer* optimizer,
                  InterpreterOptions options);

  // Runs one iteration's plan. Only checked plans run (CheckPlan): the
  // interpreter relies on what the check guarantees and checks none of it
  // again; what remains are run-time failures (transfers, the model, the
  // data).
  absl::StatusOr<IterationStats> Run(const CheckedPlan& plan);

 private:
  friend class IterationRun;
  std::map<uint32_t, ModelStage*> stages_;
  Transport* transport_;
  const MicroBatchLoader* loader_;
  TrainingOptimizer* optimizer_;
  InterpreterOptions options_;
  // Each data-parallel stage's gradient buckets, made at its first
  // reduction and kept (the gradients live in them).
  std::map<uint32_t, std::unique_ptr<GradientBuckets>> buckets_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_INTERPRETER_H_
