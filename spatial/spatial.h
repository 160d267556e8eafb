// spatial/spatial.h - the spatial checker: placements and shapes, per mesh axis.
//
// check_spatial runs every op of an SPMD program in order, mapping input placements and shapes to
// output ones by the op's rule (spatial/rules.cpp, one exhaustive switch) or to a diagnostic; then
// checks the declared outputs (partial-output, placement-mismatch). Shape obligations are decided
// directly when concrete and by Z3 when symbolic (spatial/obligations.h). A value with an error
// is not reported again downstream. Diagnostics come back sorted by position.
#pragma once
#include <optional>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

struct SpatialOptions {
  unsigned z3_timeout_ms = 10000;
  // When set, receives the inferred placement of every entry of Program::outputs, in order
  // (nullopt for an output that is undefined or poisoned by an earlier error). The numeric oracle
  // assembles an output with no declared placement by this one.
  std::vector<std::optional<Placements>>* inferred_outputs = nullptr;
};

std::vector<Diagnostic> check_spatial(const Program& program, const SpatialOptions& options = {});

}  // namespace spmd
