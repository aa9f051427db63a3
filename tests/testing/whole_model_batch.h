// A whole micro-batch as one stage holding the whole model sees it, built
// through the executor's loader: what the packing test runs packed and
// unpacked rows of the same samples with.
#ifndef VARIPIPE_TESTS_TESTING_WHOLE_MODEL_BATCH_H_
#define VARIPIPE_TESTS_TESTING_WHOLE_MODEL_BATCH_H_

#include "executor/data/micro_batch_loader.h"
#include "executor/model/model_stage.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

// Everything one stage holding the whole model needs to run micro-batch `mb`
// in one pass, read through the executor's loader (packed rows included):
// lengths, segments and positions, tokens, decoder tokens (T5) and labels.
executor::StageBatch WholeModelBatch(const executor::MicroBatchLoader& loader,
                                     const v1::MicroBatch& mb, bool t5, double loss_scale);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_WHOLE_MODEL_BATCH_H_
