// The two models of DynaPipe's evaluation (GPT-6.7B and T5-11B), shared by
// the planner benchmarks (as configs) and the cost-model tests (as
// dimensions), so every number they report is about the same models; and a
// T5-small-like model for the cost-model tests that need a small T5.
#ifndef VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_
#define VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_

#include <initializer_list>

#include "common/config/job_config.h"
#include "planner/cost/model_dims.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::testing {

// GPT-6.7B: 32 layers, h = 4,096, 32 heads of 128, MLP 16,384, vocabulary
// 50,432 (GPT-2's padded to a multiple of 128); 16-bit.
inline v1::ModelConfig Gpt67bConfig() {
  v1::ModelConfig m;
  m.set_kind(v1::GPT);
  m.set_num_layers(32);
  m.set_hidden_size(4096);
  m.set_num_attention_heads(32);
  m.set_kv_channels(128);
  m.set_ffn_hidden_size(16384);
  m.set_vocab_size(50432);
  m.set_dtype(v1::BFLOAT16);
  return m;
}

// T5-11B: 24 encoder and 24 decoder layers, h = 1,024, 128 heads of 128,
// MLP 65,536, vocabulary 32,128; 16-bit.
inline v1::ModelConfig T511bConfig() {
  v1::ModelConfig m;
  m.set_kind(v1::T5);
  m.set_num_layers(24);
  m.set_num_decoder_layers(24);
  m.set_hidden_size(1024);
  m.set_num_attention_heads(128);
  m.set_kv_channels(128);
  m.set_ffn_hidden_size(65536);
  m.set_vocab_size(32128);
  m.set_dtype(v1::BFLOAT16);
  return m;
}

inline planner::ModelDims Gpt67bDims() { return planner::ModelDimsFromConfig(Gpt67bConfig()); }

// A T5-small-like model: 4 + 4 layers, h = 512, 8 heads of 64, MLP 2,048,
// vocabulary 32,128; 16-bit.
inline planner::ModelDims SmallT5Dims(
    planner::AttentionKernel kernel = planner::AttentionKernel::kExplicit) {
  return {.kind = planner::ModelKind::kT5,
          .encoder_layers = 4,
          .decoder_layers = 4,
          .hidden = 512,
          .heads = 8,
          .kv_channels = 64,
          .ffn = 2048,
          .vocab = 32128,
          .dtype_bytes = 2,
          .attention_kernel = kernel};
}

// The planner benchmarks' job of either model (zero_bubble_bench.cc,
// stage_layout_bench.cc): GPT-6.7B at pp = 4 or T5-11B at pp = 8, dp = 1,
// the A100-40GB analytic model with 40,960 MiB per device, 65,536 tokens per
// mini-batch up to 2,048 tokens (T5 targets up to 512), one planning
// thread, `schedules` only, defaults applied.
inline v1::JobConfig PaperBenchmarkJob(bool t5, std::initializer_list<v1::ScheduleKind> schedules) {
  v1::JobConfig c;
  c.set_job_id(t5 ? "t5-11b" : "gpt-6.7b");
  *c.mutable_model() = t5 ? T511bConfig() : Gpt67bConfig();
  c.mutable_parallelism()->set_pipeline(t5 ? 8 : 4);
  c.mutable_parallelism()->set_data(1);
  c.mutable_cluster()->set_device_memory_limit_mib(40960);
  c.mutable_cluster()->set_hardware("a100-40gb");
  c.mutable_data()->set_format(v1::SYNTHETIC);
  c.mutable_data()->set_tokens_per_global_batch(65536);
  c.mutable_data()->set_max_sequence_length(2048);
  if (t5) c.mutable_data()->set_max_target_length(512);
  for (v1::ScheduleKind s : schedules) c.mutable_planner()->add_schedules(s);
  c.mutable_planner()->set_threads(1);
  c.mutable_training()->set_iterations(1);
  ApplyJobConfigDefaults(c);
  return c;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_
