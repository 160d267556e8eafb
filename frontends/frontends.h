// frontends/frontends.h - `spmdcheck import fx|hlo SEQ RANKS`: captured graphs to an ordinary spmdcheck program.
//
// The sequential graph becomes the program's `spec:`; the ranks' graphs become its plan: one local-view op list
// (`view: local`) when they differ only in integer constants affine in the rank (a vocab range, a slice offset:
// written a + b*axis_index(tp)), else one program per rank. Every op carries `at:` with the model's source line
// and the graph's line, so diagnostics point at the Python line first. Builds on ir/ only.
#pragma once
#include <string>
#include <vector>

#include "frontends/graph.h"

namespace spmd::frontends {

struct ImportOptions {
  std::string format;                  // "fx" or "hlo"
  std::string seq, ranks;              // folders (or single graph files)
  std::string relation;                // a relation file; empty: inferred from shapes only
  std::vector<std::string> ops_files;  // more custom-op mapping files (after the defaults)
  std::string graph;                   // which dump of a folder (fw, bw, both, both.g0); overrides the relation's
  bool reduce = false;                 // write the named sizes at small values (dims/reduce in dims.h), the real ones in comments
};

struct ImportResult {
  std::string yaml;                    // the program
  bool local_view = true;              // false: per-rank programs
  std::size_t ranks = 0, plan_ops = 0, spec_ops = 0;
};

// Throws ImportError (a located error: a graph, relation or mapping file and a position) for input it cannot read.
ImportResult import_program(const ImportOptions& o);

}  // namespace spmd::frontends
