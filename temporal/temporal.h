// temporal/temporal.h - the temporal checker: happens-before over streams, async ops and waits.
//
// check_temporal runs the program's ops on one representative rank (every rank of an SPMD `ops:`
// program runs the same sequence, so one rank decides it), builds the happens-before graph
// (program order per stream, issue edges, completion -> Wait edges) with vector clocks over the
// streams, and checks every buffer access against the earlier ones: missing-wait, data-race,
// buffer-aliasing; and the handles: orphaned-handle, invalid-wait. A query "does a happen before b"
// is O(1); building is linear in ops x streams.
#pragma once
#include <iosfwd>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

struct TemporalOptions {
  std::ostream* dot = nullptr;  // when set, the happens-before graph is written there as Graphviz DOT
};

std::vector<Diagnostic> check_temporal(const Program& program, const TemporalOptions& options = {});

// Writes the happens-before graph as Graphviz DOT, one cluster per stream (check_temporal with `dot`).
void write_hb_dot(const Program& program, std::ostream& out);

}  // namespace spmd
