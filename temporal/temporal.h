// temporal/temporal.h - the temporal checker: happens-before over ranks, streams, async ops and waits.
//
// check_temporal simulates the representative ranks of the program (ir/ranks.h: one rank for a
// plain SPMD program) at the CPU level: a rank blocks at a synchronous collective until every
// member of its group arrives, at a Recv until the matching Send is posted, at a synchronous Send
// under the rendezvous model until the matching Recv is posted, and at a Wait until its op can
// complete; async ops never block when issued. Along the way it builds the happens-before graph
// (program order per (rank, stream), issue edges, completion -> Wait, Send -> Recv, collective
// arrivals -> departures) with vector clocks over the (rank, stream) chains, and checks every
// buffer access against the earlier ones (missing-wait, data-race, buffer-aliasing) and the
// handles (orphaned-handle, invalid-wait). Communication is matched statically (FIFO per
// (src, dst); collectives per (group, sequence number)): unmatched-p2p, collective-mismatch. When
// no rank can move and not all are done, the cycle of waits is a deadlock. A query "does a happen
// before b" is O(1); the whole check is linear in events x chains.
#pragma once
#include <iosfwd>
#include <optional>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

struct TemporalOptions {
  std::ostream* dot = nullptr;           // when set, the happens-before graph is written there as Graphviz DOT
  std::optional<P2PModel> p2p_model;     // overrides the program's `p2p_model` (default: rendezvous)
};

std::vector<Diagnostic> check_temporal(const Program& program, const TemporalOptions& options = {});

// Writes the happens-before graph as Graphviz DOT, one cluster per (rank, stream) (check_temporal with `dot`).
void write_hb_dot(const Program& program, std::ostream& out);

}  // namespace spmd
