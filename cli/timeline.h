// cli/timeline.h - the per-rank, per-stream timeline of a temporal program, as SVG (for `spmdcheck report`).
//
// One lane per (representative rank, stream), ops in program order (logical steps, not to scale).
// Async ops are dashed and joined to the Wait that completes them; each matched Send has an arrow
// to its Recv; a deadlock's blocked ops are red and its cycle of waits is drawn as red arrows.
#pragma once
#include <string>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

// Empty when the program has nothing temporal (one rank, one stream, no async op, no point-to-point).
std::string timeline_svg(const Program& p, const std::vector<Diagnostic>& diags);

}  // namespace spmd
