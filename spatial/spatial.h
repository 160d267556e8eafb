// spatial/spatial.h - the spatial checker: placements and shapes, per mesh axis.
//
// check_spatial runs every op of an SPMD program in order, mapping input placements and shapes to
// output ones by the op's rule (spatial/rules.cpp, one exhaustive switch) or to a diagnostic; then
// checks the declared outputs (partial-output, placement-mismatch). Shape obligations are decided
// directly when concrete and by Z3 when symbolic (spatial/obligations.h). A value with an error
// is not reported again downstream. Diagnostics come back sorted by position.
#pragma once
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

struct SpatialOptions {
  unsigned z3_timeout_ms = 10000;
};

std::vector<Diagnostic> check_spatial(const Program& program, const SpatialOptions& options = {});

}  // namespace spmd
