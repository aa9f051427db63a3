// Executor ranks as threads of the test process: each rank builds its model
// stages, a Gloo transport over loopback TCP (rendezvous through a real
// redis-server), its optimizer (sharded under training.zero_stage 1) and a
// plan interpreter, as varipipe-executor does, and runs its plans of
// consecutive iterations.
#ifndef VARIPIPE_TESTS_TESTING_THREADED_RANKS_H_
#define VARIPIPE_TESTS_TESTING_THREADED_RANKS_H_

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dataset/sample_dataset.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/instruction_progress.h"
#include "executor/runtime/plan_interpreter.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

struct ThreadedRanksOptions {
  // The redis-server of the Gloo rendezvous, and a prefix no other run of
  // the same server uses.
  std::string redis_host;
  int redis_port = 0;
  std::string redis_password;
  std::string prefix;
  // Watchdog timeout of every rank, or per rank when `timeouts` is set.
  absl::Duration timeout = absl::Seconds(60);
  std::vector<absl::Duration> timeouts;
  // Per rank when set: the counting allocator's account of the rank's
  // thread (every account must outlive the tensors it paid for).
  std::vector<executor::MemoryAccount*> memory;
  // Called on rank r's thread after the rendezvous, before its first plan
  // runs, with every rank's instruction progress.
  std::function<void(int rank, const std::vector<executor::InstructionProgress>& progress)>
      before_run;
  // InterpreterOptions::gradient_bucket_bytes (and under ZeRO stage 1 the
  // sharding's, MakeRankOptimizer): small by default, so that the tiny
  // models' gradients fill several buckets and the reductions of the first
  // start inside the last backward pass.
  int64_t gradient_bucket_bytes = 8 << 10;
  // Record the gradients each rank's optimizer step is about to apply.
  bool capture_gradients = false;
  // Checkpoints (executor/runtime/checkpoint.h) in this directory: when set,
  // every rank saves its state after its last plan (as the state after that
  // plan's iteration); with `resume_from` > 0 it first loads the state after
  // that many iterations.
  std::string checkpoint_dir;
  uint64_t resume_from = 0;
  // Where every rank's stages, optimizer state and micro-batches live. A
  // GPU needs one rank (pipeline 1, data 1): the ranks' Gloo transport moves
  // host memory only. Captured gradients and parameters come back on the CPU.
  torch::Device device = torch::kCPU;
  // The ranks' transfers and collectives go through DeviceStagingTransport
  // (always on a GPU, where the ranks share it; on the CPU when set, to run
  // the same path without one).
  bool stage_through_host = false;
  // ModelStage::set_loss_chunk_tokens of every stage; 0: the default.
  int64_t loss_chunk_tokens = 0;
  // InterpreterOptions::prefetch_inputs; 0 builds every input on the rank's
  // thread when taken, so that a rank's measured memory (`memory`) does not
  // depend on when a prefetch thread ran.
  size_t prefetch_inputs = executor::InterpreterOptions().prefetch_inputs;
};

struct RankRun {
  absl::Status status;                          // the first error; the rank stops there
  std::vector<executor::IterationStats> stats;  // per iteration run
  // Per iteration (capture_gradients): gradient by parameter name, after the
  // data-parallel reduction and before clipping and the update.
  std::vector<std::map<std::string, torch::Tensor>> gradients;
  std::map<std::string, torch::Tensor> parameters;  // after the last iteration
  // Measured model state: the rank's parameter bytes, and its optimizer's
  // state bytes after each iteration.
  int64_t parameter_bytes = 0;
  std::vector<int64_t> optimizer_state_bytes;
};

// Runs `iterations[i][r]` (iteration i's plan of plan rank r) on one
// thread per rank, every iteration in order on the same stages and
// optimizer. With parallelism.tensor t each plan runs on t ranks (global
// ranks r * t .. r * t + t - 1, tensor_rank_transport.h); the result has
// one RankRun per global rank. With parallelism.context c plan rank r is
// lane r % c of its context group (common/config/rank_layout.h), whose
// lanes gather keys and values over a Gloo transport of their own.
std::vector<RankRun> RunThreadedRanks(const v1::JobConfig& config,
                                      const std::vector<std::vector<v1::ExecutionPlan>>& iterations,
                                      const SampleDataset& dataset,
                                      const ThreadedRanksOptions& options);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_THREADED_RANKS_H_
