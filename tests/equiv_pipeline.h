// tests/equiv_pipeline.h - random pipelined training programs with a spec, and an independent ground truth for their
// gradients (the differential test of pipelines, `spmd_equiv_difftest --pipeline N`).
//
// generate_pipeline(seed, bug) draws a pipeline (GPipe, 1F1B, ZBH1 or interleaved 1F1B on 2-3 pipeline ranks, with or
// without data parallelism, 1-4 microbatches, 1-2 accumulation steps, sometimes as PyTorch's CSV with its gradient
// reductions or with its SEND / RECV), stages of 1-2 random layers each, a loss normalized over the microbatches one of
// the ways the frameworks do it (a global token count, a mean per microbatch scaled by the microbatch count, or
// PyTorch's scale_grads) and the whole-batch spec. The same seed with bug = false and bug = true gives the same
// program except for one mistake (`mistake`): a dropped or a shuffled microbatch, a normalization off by the
// microbatch count, scale_grads under accumulation, a gradient reduction before a stage's last backward, two sends
// swapped, a wrong reduce op. Some carry an optimizer step (SGD with momentum or AdamW on every parameter, after a
// global-norm clip summed over the pipeline axis or without a clip) with its spec; their mistake: one stage's learning rate.
//
// pipeline_truth lowers the schedule (equiv/pipeline.h), runs every rank's program in doubles with each microbatch's
// backward seeded with 1, reads each parameter's gradient from its stage's ranks and compares it (and the gathered
// loss) with central finite differences of the spec's forward loss (tests/equiv_train.h), and every parameter and state
// the optimizer updates (from its stage's ranks) with the spec's optimizer run in doubles on those gradients.
#pragma once
#include <cstdint>
#include <string>

#include "ir/program.h"
#include "tests/equiv_train.h"

namespace spmd::test {

struct PipelineCase {
  std::string yaml;     // the program; its `schedule:` may read `pipe.csv` next to it
  std::string csv;      // that CSV ("" when the schedule is generated)
  std::string mistake;  // "" when none
};

PipelineCase generate_pipeline(std::uint64_t seed, bool bug);

Truth pipeline_truth(const Program& p, std::size_t max_elements = 0);

}  // namespace spmd::test
