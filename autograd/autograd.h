// autograd/autograd.h - checks a training program: its backward and its gradient synchronization.
//
// check_training builds the training step as one ordinary program (the forward ops, the backward -
// derived op by op, or the file's hand-written `backward:` - `grad_sync:` and `optimizer:`, with `<loss>.grad`
// declared with the dual of the loss's placement) and runs the spatial checks on it. A hand-written
// backward is compared with the forward: a backward collective that is not the dual of its forward
// one, a missing dual and an extra collective are gradient-duality. A parameter that is R (or I) on
// an axis whose gradient is still P (or per-rank V) there when it reaches the optimizer is
// unsynced-gradient, with the AllReduce that fixes it. Nothing is built when the forward has errors.
#pragma once
#include <cstddef>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd {

struct TrainingOptions {
  unsigned z3_timeout_ms = 10000;
  // The forward's types, when the caller has checked the forward already (check_spatial with
  // SpatialOptions::types), and whether that check found errors; null: the forward is checked here.
  // The forward is never checked again: the training step's check takes its types as they are.
  const SpatialTypes* forward_types = nullptr;
  bool forward_ok = true;
  // When set, receives the types of every value of the training step (as check_spatial's SpatialOptions::types).
  SpatialTypes* step_types = nullptr;
};

// What check_training_in_place changes in the program it turns into the training step, to give the
// forward back (restore_forward): the sizes of its arrays and the fields the step clears.
struct ForwardUndo {
  bool saved = false;
  std::size_t ops = 0, operands = 0, names = 0, tensors = 0, int_lists = 0, shapes = 0, placement_maps = 0, coords = 0, name_lists = 0;
  ExprPool exprs;
  std::vector<Op> backward, grad_sync, optimizer;
  std::vector<OutputDecl> outputs;
  std::vector<std::string> expect;
  bool has_backward = false, has_grad_sync = false, has_optimizer = false, train = false, has_expect = false;
  Loc backward_loc;
};

struct TrainingCheck {
  bool built = false;              // false when the forward has errors (or declares no loss)
  Program program;                 // the training step, for the temporal checks (check_training; in place: the program itself)
  std::size_t first_backward = 0;  // ops before this index are the forward's (already checked)
  // Ops in [first_relabel, first_sync) relabel a mean loss's parameter gradients P -> P(avg) (Reinterpret, no data
  // moves); grad_sync's ops start at first_sync.
  std::size_t first_relabel = 0, first_sync = 0;
  std::vector<std::int32_t> forward_op;  // a derived backward: per op in [first_backward, first_relabel), the forward op it is a VJP of
  std::size_t first_optim = 0;     // the ops of `optimizer:` start here (after grad_sync's)
  std::vector<Diagnostic> diags;   // findings in the backward and grad_sync, gradient-duality, unsynced-gradient
                                   // (not built: the forward's errors, when this call checked the forward)
};

// Throws LoadError when the backward cannot be derived (an op without a VJP).
TrainingCheck check_training(const Program& program, const TrainingOptions& options = {});

// The same with no copy of the forward: `program` itself becomes the training step (the forward's ops,
// names and declarations stay its first ones, the backward and grad_sync follow), and `undo` records how
// to give the forward back. Findings are the same as check_training's. On a LoadError the program is
// restored before the exception leaves.
TrainingCheck check_training_in_place(Program& program, ForwardUndo& undo, const TrainingOptions& options = {});
// Turns a training step made by check_training_in_place back into its forward (as it was before).
void restore_forward(Program& program, ForwardUndo& undo);

}  // namespace spmd
