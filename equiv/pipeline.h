// equiv/pipeline.h - a pipeline schedule whose stages run real ops (docs/schedules.md, "Stages"), lowered to per-rank
// programs with real ops, and the training pair the value check compares (docs/equivalence.md, "Pipelines").
//
// The stages are typed and differentiated once, as one microbatch's training step (every stage in order, the batch
// inputs at the microbatch's size, `grad_sync:` after it): that is where their spatial and gradient findings come
// from. The schedule's lowering (schedules/, the one the temporal checks simulate) then says what each rank runs; each
// F, B, I and W becomes that stage's part of the step for the microbatch, with its names suffixed `@mb<k>`, each
// backward adds the stage's parameter gradients into `<param>.grad`, and a stage's `grad_sync:` ops run after its last
// backward (or at its REDUCE_GRAD), and the `optimizer:` ops at the end of each rank's program
// (optimizer.step() after the schedule's last run) (each op on the
// ranks of the stage whose parameters, gradients or states it touches; a GradNormSq on every rank over its stages'
// gradients, summed over the pipeline axis when `axis:` names it).
#pragma once
#include <string>
#include <vector>

#include "equiv/training.h"
#include "ir/diagnostic.h"
#include "ir/program.h"
#include "schedules/schedule.h"

namespace spmd {

struct PipelineLowering {
  bool built = false;             // false: `diags` has findings in the stages (or `why` says what is missing)
  std::string why;
  std::vector<Diagnostic> diags;  // the one-microbatch step's findings (spatial, backward, unsynced-gradient)
  Program program;                // per-rank programs with real ops
  std::vector<equiv_detail::PairGrad> grads;  // each parameter's accumulated gradient, by its placement after grad_sync, on its stage's ranks
  // The optimizer step's results (per NameId of the step): written by it, the placement of its last write, the ranks
  // that hold it (its stage's; none: every rank).
  std::vector<char> optim_writes;
  std::vector<Placements> optim_pl;
  std::vector<std::vector<std::pair<int, std::int64_t>>> optim_ranks;
  NameId seed = -1;               // the backward's seed `<loss>.grad`: one declared value every microbatch's backward reads
  double n_copies = 1;            // the copies of the loss the ranks differentiate (equiv/training.h)
  equiv_detail::TrainingPair meta;  // microbatches, family, generated, derived
  std::vector<Op> step_ops;       // the one-microbatch training step (operands in `program`) and its types, with no
  SpatialTypes step_types;        // pipeline axis: each lowered op with a family is an instance of one of these ops
};

// The one-microbatch step's forward that lower_pipeline types: every stage's ops in order, the batch inputs at the
// microbatch's size (a size loaded as a variable: its expression over the microbatch count), without the pipeline
// axis. Throws LoadError as lower_pipeline does.
Program pipeline_step_forward(const Program& p);

// Lowers `p` (a `schedule:` with `stages:`) along the action grid `s`. Throws LoadError for input the schedule cannot
// run (a stage count that differs from the grid's, a batch dim the microbatches do not divide, a parameter that two
// stages read, a grad_sync op that reads no parameter gradient, an optimizer op that touches two stages' values or a
// parameter no stage reads).
PipelineLowering lower_pipeline(const Program& p, const Schedule& s);

namespace equiv_detail {
// The value check's pair for a pipelined schedule: the lowered plan against the spec's whole-batch step.
TrainingPair pipeline_pair(const Program& p);
}  // namespace equiv_detail

}  // namespace spmd
