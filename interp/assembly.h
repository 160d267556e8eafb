// interp/assembly.h - what the oracle and the equivalence check (equiv/) share besides the Runner: the small
// instantiations of a program's sizes, and the assembly of per-rank values into a global one by a placement.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "interp/interp.h"
#include "interp/runner.h"
#include "interp/tensor.h"

namespace spmd::interp {

struct Instantiation {
  std::vector<std::int64_t> vars;
  std::vector<std::int64_t> mesh;
  bool even = true;  // every declared shape has a value and every declared shard divides evenly (or is declared uneven)
};

// Whether the interpreter has a value kernel for `op`, one of `ops` (the list it runs in): not the opaque
// OverlapRegion and Step, nor a PointwiseGrad of Dropout without the one forward Dropout of its x
// in `ops` (its mask cannot be redrawn: such a program is skipped, never run with a made-up mask).
bool has_value_kernel(const Program& p, const std::vector<Op>& ops, const Op& op);

// The instantiations of `p`'s symbolic sizes that fit the oracle's limits, smallest first (at most 64).
std::vector<Instantiation> instantiations(const Program& p, const OracleOptions& o);

struct Assembled {
  bool ok = false;         // a value was assembled
  bool undefined = false;  // V somewhere: no assembled value
  std::string problem;     // ranks disagree on R/I, or the pieces do not fit
  bool disagree = false;   // the problem is that ranks hold different values of an R/I value
  Tensor t;
};

// The global value of `name` on `run`'s ranks read by placement `pl` (S: concatenate, P: reduce, R/I: every rank
// must hold the same value within the options' tolerance, V: undefined). With `held` (an output's `ranks:`), only the
// ranks with those coordinates are read: the selected axes count as size 1.
Assembled assemble(const Program& p, Runner& run, NameId name, const Placements& pl, const OracleOptions& o,
                   const std::vector<std::pair<int, std::int64_t>>& held = {});

// The model a plan is compared with: the spec (its ops over the declared tensors, whole; its outputs the spec tensors
// of `spec.outputs`), or without a spec the plan's own op list on one device.
Program model_of(const Program& p);

// The same from one piece per rank (ranks in row-major mesh order, `sizes` the mesh). `counts` (Runner::value_sizes
// on a reduced mesh): the group sizes a P(avg) divides by, when they are not `sizes`.
Assembled assemble_pieces(const Program& p, const std::vector<std::int64_t>& sizes, std::vector<Tensor> pieces, const Placements& pl,
                          const OracleOptions& o, const std::vector<std::int64_t>* counts = nullptr);

// Element `flat` of `gshape` as "[i, j, k]".
std::string index_text(const Shape& gshape, std::int64_t flat);

}  // namespace spmd::interp
