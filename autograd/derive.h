// autograd/derive.h - derives the backward of a training program, one VJP per forward op.
//
// The backward is an ordinary op list in the same IR (Program::backward), so the spatial and
// temporal checks run on it unchanged and the printer writes it as YAML. Gradients are named
// `<tensor>.grad` (PyTorch's x.grad); the backward starts from `<loss>.grad`. The gradient of a value
// whose forward placement is t gets placement dual(t) (R<->P, I<->I, V<->V, S(d)<->S(d)); forward
// collectives and conversions map to their duals (docs/semantics.md, "Gradients").
#pragma once
#include <cstdint>
#include <vector>

#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd {

struct Derived {
  Program program;                     // a copy of the forward with `backward` filled in
  std::vector<std::int32_t> forward_op;  // per backward op: the forward op it is part of the VJP of
};

// The dual placement of a forward placement: the placement its gradient has.
Placement dual(Placement p);

// `types` are the forward's types from check_spatial (the forward must be free of errors). Throws
// LoadError at an op that has no VJP (a gradient op in a forward program). With `append_to_ops`, the
// backward's ops go straight after the forward's in `program.ops` (the training step, with no copy of
// the backward) and `program.backward` stays empty.
Derived derive_backward(const Program& forward, const SpatialTypes& types, bool append_to_ops = false);

// The same in place, with no copy of the forward: the backward's ops, names and side-table entries are
// appended to `program`'s own (its ops stay the first ones), as derive_backward(program, types, true) would
// give them. Returns, per backward op, the forward op it is part of the VJP of.
std::vector<std::int32_t> derive_backward_in_place(Program& program, const SpatialTypes& types);

}  // namespace spmd
