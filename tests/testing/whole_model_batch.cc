#include "tests/testing/whole_model_batch.h"

namespace varipipe::testing {

using executor::MicroBatchLoader;

executor::StageBatch WholeModelBatch(const MicroBatchLoader& loader, const v1::MicroBatch& mb,
                                     bool t5, double loss_scale) {
  const int64_t rows = mb.row_starts_size() > 0 ? mb.row_starts_size() : mb.sample_ids_size();
  const auto tokens = [&](int64_t len) {
    v1::TensorSpec s;
    s.add_dims(rows);
    s.add_dims(len);
    s.set_dtype(v1::INT64);
    return s;
  };
  const executor::RowLengths lengths = *loader.Lengths(mb);
  executor::StageBatch batch;
  batch.input_lengths = lengths.input;
  batch.target_lengths = lengths.target;
  batch.input_segments = lengths.input_segments;
  batch.input_positions = lengths.input_positions;
  batch.target_segments = lengths.target_segments;
  batch.target_positions = lengths.target_positions;
  batch.labelled_positions = lengths.labelled_positions;
  batch.input_tokens = *loader.Load(mb, v1::LoadInput::INPUT_TOKENS, tokens(mb.input_len()));
  if (t5) {
    batch.decoder_tokens =
        *loader.Load(mb, v1::LoadInput::DECODER_INPUT_TOKENS, tokens(mb.target_len()));
  }
  batch.labels =
      *loader.Load(mb, v1::LoadInput::LABELS, tokens(t5 ? mb.target_len() : mb.input_len()));
  batch.loss_scale = loss_scale;
  return batch;
}

}  // namespace varipipe::testing
