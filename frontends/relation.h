// frontends/relation.h - how the ranks' graphs relate to the sequential graph, in spmdcheck's vocabulary: the mesh
// axis of each process group, each input's placement (S(d), R, P), the ranks' inputs that are pieces of a
// sequential input, the outputs compared, and the values of lifted constants. Inferred from shapes where that is
// unambiguous; a small YAML relation file gives the rest (docs/import.md, "The relation").
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "frontends/graph.h"

namespace spmd::frontends {

// A ranks' input defined from a sequential input: `slice` of `of` along `dim` ([start, end)).
struct RankInput {
  std::string of;
  int dim = 0;
  std::int64_t start = 0, end = 0;
  Loc loc;
};

// An intermediate value both graphs compute, taken as an input instead (GraphGuard's forced leaves): the checks
// assume the ranks' values are the sequential one by `placement`, and verify what follows.
struct Cut {
  std::string ranks;      // its name in the ranks' graphs (default: the same)
  std::string placement;  // empty: inferred from the shapes
  Loc loc;
};

// A fused weight whose blocks are sharded one by one (a fused QKV: each rank holds its chunk of Q, of K and of V,
// concatenated): every sequential input of `shape` whose ranks' dim `dim` is the sum of the blocks' chunks.
struct Blocked {
  std::vector<std::int64_t> shape;
  int dim = 0;
  std::vector<std::int64_t> sizes;  // consecutive blocks of the sequential dim
  Loc loc;
};

struct Relation {
  std::string file;                                 // empty: no relation file
  std::string graph;                                // which dump of each folder (fw, bw, both, both.g0)
  std::string axis = "tp";                          // the mesh axis of the ranks
  std::int64_t devices = 0;                         // HLO: the number of devices (when the module does not say)
  std::map<std::string, std::string> groups;        // process group -> mesh axis
  std::vector<std::pair<std::string, std::int64_t>> extra_axes;  // `axes:` further mesh axes (size 1 for now)
  Loc axes_loc;
  std::map<std::string, std::string> placements;    // sequential input -> placement text (R, S(0), P)
  std::map<std::string, Loc> placement_locs;
  std::map<std::string, RankInput> rank_inputs;
  std::map<std::string, Cut> cuts;                  // sequential node -> the ranks' node, taken as inputs
  std::vector<Blocked> blocked;
  std::vector<std::pair<std::string, std::string>> outputs;  // (sequential name, ranks' name)
  Loc outputs_loc;
  std::map<std::string, double> constants;
  std::optional<double> default_constant;
};

Relation load_relation(const std::string& path);

// The placement of a sequential input of global shape `global` held by the ranks as `local` (one per rank, mesh
// order): R when equal, S(d) when exactly dim d is cut into the ranks' chunks; nullopt when no single placement fits.
std::optional<std::string> infer_placement(const std::vector<std::int64_t>& global, const std::vector<std::vector<std::int64_t>>& local);

}  // namespace spmd::frontends
