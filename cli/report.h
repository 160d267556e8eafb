// cli/report.h - `spmdcheck report`: one self-contained HTML page about one program.
//
// The page has no external resources (no network, scripts, fonts or styles from elsewhere): the
// source with its diagnostics inline at their lines, a per-op placement table with the explanation
// of each placement, an SVG layout per tensor, the timeline of a temporal program (cli/timeline.h)
// and the grid of a pipeline schedule. A small inline script checks the page's own structure and
// records the verdict in <body data-selfcheck>, which the browser test reads.
#pragma once
#include <string>

#include "cli/check_file.h"

namespace spmd {

// The training step of a training program (its forward, backward and grad_sync as one program, and their types):
// the report then shows the gradients' placements and layouts too. Ops before first_backward are the forward's,
// those from first_sync on are grad_sync's, those from first_optim on the optimizer's.
struct ReportStep {
  const Program* program = nullptr;
  const SpatialTypes* types = nullptr;
  std::size_t first_backward = 0, first_sync = 0, first_optim = static_cast<std::size_t>(-1);
};

// `types` may be null (a schedule, or a file that did not load); `step` is empty for a program that does not train.
std::string report_html(const FileResult& r, const SpatialTypes* types, const std::string& source, const std::string& version,
                        const ReportStep& step = {});

}  // namespace spmd
