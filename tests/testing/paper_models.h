// The two models of DynaPipe's evaluation (GPT-6.7B and T5-11B), shared by
// the planner benchmarks (as configs) and the cost-model tests (as
// dimensions), so every number they report is about the same models.
#ifndef VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_
#define VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_

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

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_PAPER_MODELS_H_
