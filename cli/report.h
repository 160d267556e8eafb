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

// `types` may be null (a schedule, or a file that did not load).
std::string report_html(const FileResult& r, const SpatialTypes* types, const std::string& source, const std::string& version);

}  // namespace spmd
