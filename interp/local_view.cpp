// interp/local_view.cpp - `spmdcheck check` on a local-view program: the run per rank finds the op whose local
// shapes do not fit (a local array has no placement, so the spatial rules do not run; docs/format.md, "Local view").
#include "interp/interp.h"

namespace spmd {

std::vector<Diagnostic> check_local_view(const Program& p, const OracleOptions& o) {
  std::vector<Diagnostic> out;
  if (!p.local_view) return out;
  OracleResult r = run_oracle(p, o);
  if (r.verdict != OracleVerdict::Differ || r.failed_op < 0 || static_cast<std::size_t>(r.failed_op) >= p.ops.size()) return out;
  const Op& op = p.ops[static_cast<std::size_t>(r.failed_op)];
  Diagnostic d;
  d.id = CheckId::ShapeMismatch;
  d.loc = op.loc;
  d.op = r.failed_op;
  if (op.n_out) d.tensor = p.name(p.outs(op)[0]);
  d.message = std::string(op_name(op.kind)) + " fails on rank " + r.failed_rank + " of the local-view run" + (r.sizes.empty() ? "" : " (" + r.sizes + ")") +
              ": " + r.failure;
  d.ranks.push_back(r.failed_rank);
  if (p.view_loc.line) d.notes.push_back({p.view_loc, "the program is in the local view: each rank computes on its local pieces, so shapes are the local ones"});
  d.notes.push_back({op.loc, "fix: make the local shapes fit (slice sizes from the mesh axis, e.g. end: (axis_index(tp) + 1)*V/tp, or gather the operand first)"});
  out.push_back(std::move(d));
  return out;
}

}  // namespace spmd
