// Chrome trace JSON of a simulated iteration (open in Perfetto or
// chrome://tracing): one process per device with a "compute" and a "comm"
// thread; events are named like "F mb3 s1" (forward of micro-batch 3 on
// stage 1; "B" the backward or, split, its input gradient; "W" the weight
// gradient, category "weight_grad") and carry micro-batch and stage as
// arguments.
#ifndef VARIPIPE_PLANNER_SIM_CHROME_TRACE_H_
#define VARIPIPE_PLANNER_SIM_CHROME_TRACE_H_

#include <string>

#include "planner/sim/simulator.h"

namespace varipipe::planner {

// `title` names the trace (e.g. "iteration 7, adaptive"); `first_rank` is the
// global rank of device 0, used in the process names.
std::string ChromeTraceJson(const SimulationResult& result, const std::string& title,
                            int first_rank = 0);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SIM_CHROME_TRACE_H_
