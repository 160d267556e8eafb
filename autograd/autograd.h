// autograd/autograd.h - checks a training program: its backward and its gradient synchronization.
//
// check_training builds the training step as one ordinary program (the forward ops, the backward -
// derived op by op, or the file's hand-written `backward:` - and `grad_sync:`, with `<loss>.grad`
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
};

struct TrainingCheck {
  bool built = false;              // false when the forward has errors (or declares no loss)
  Program program;                 // the training step, for the temporal checks
  std::size_t first_backward = 0;  // ops before this index are the forward's (already checked)
  std::vector<Diagnostic> diags;   // findings in the backward and grad_sync, gradient-duality, unsynced-gradient
};

// Throws LoadError when the backward cannot be derived (an op without a VJP).
TrainingCheck check_training(const Program& program, const TrainingOptions& options = {});

}  // namespace spmd
