// equiv/reduce.h - shape reduction: the sizes a value check runs at (docs/equivalence.md, "Shape reduction").
//
// A program written at the sizes people train with (hidden 16384, sequence 8192) is too large to run element by
// element, and its verdict does not depend on those sizes: an output element of the ops the value check runs is a
// fixed function of a fixed pattern of input elements, so once every block of every partition is represented the
// plan and the spec agree at the declared sizes exactly when they agree at the reduced ones (TrainVerify, SOSP'25,
// section 5). choose_reduction picks, for every concrete size of a program loaded with its sizes as variables
// (LoadOptions::generalize_sizes), the smallest value that keeps the program's partition structure: every shape
// claim the type checker relied on still holds, every dim keeps its block count over the mesh axes that shard it
// with at least min(2, its block size) elements a block, a quotient of 2 or more stays 2 or more, a dim of size 1
// stays 1. Sizes that feed a value are not reduced as values: the runner reads the real extents
// (Runner::real_shapes) wherever a kernel divides by one, so only the element count shrinks. A size the program
// also uses as a literal (a Slice bound written as a number), or one whose use the check cannot trace (a
// local-view plan that takes a Mean), is kept, and the verdict says why.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd::equiv_detail {

// One op list the type checker typed: its program, its ops (`ops` or `spec_ops` of that program) and its types.
struct TypedOps {
  const Program* program = nullptr;
  const std::vector<Op>* ops = nullptr;
  const SpatialTypes* types = nullptr;        // null: untyped (a local-view plan)
  const std::vector<ShapeClaim>* claims = nullptr;
};

// The type of each input of each op of a typed list (none when untyped), walking names in program order.
std::vector<std::vector<const ValueType*>> input_types(const TypedOps& t);

struct Reduction {
  bool applied = false;             // some size (or mesh axis) was reduced
  std::vector<std::int64_t> vars;   // per size variable of the program: the value the run uses
  std::vector<std::int64_t> mesh;   // per mesh axis: the ranks the run uses (choose_mesh); empty: as declared
  std::string text;                 // "H 16384 -> 16, S 8192 -> 8"
  std::vector<std::string> kept;    // "D = 128 (a Slice bound is written as a number, line 12)"
};

// The reduction of the generalized program `g` given the value `base` every variable has without reduction
// (a generalized size: its declared value; a symbolic size: its instantiation). Only SizeVar::general variables
// move. `lists` are the typed op lists whose values constrain it (the plan's forward and the spec's). When `g` is
// on a reduced mesh (at_mesh), `declared_mesh` is the declared one: a dim cut into N blocks there, now cut into
// fewer, keeps its block structure (equal blocks; a block of one element stays one, of two or more stays two or more).
Reduction choose_reduction(const Program& g, const std::vector<std::int64_t>& base, const std::vector<TypedOps>& lists,
                           const std::vector<std::int64_t>& declared_mesh = {});

// Mesh reduction: the ranks a global-view program's value check runs each mesh axis at. An axis of 3 or more ranks
// that the ops use only through the partition and symmetric collectives (AllReduce, AllGather, ReduceScatter,
// AllToAll without split sizes, ZeRO's gather / scatter / partition, a vocab-parallel cross-entropy, a grad norm,
// Convert) runs at 2: every rank computes the same function of its block, so a difference at N ranks is a
// difference on some block of some kind (its own, another's) and 2 ranks keep both kinds, as the shape reduction
// keeps two elements of a dim. Every group size used as a value (an average's divisor, a sharded dim's real local
// extent, the copies of the loss a training step differentiates) keeps its declared value (Runner::value_sizes).
// Kept as declared, with the reason in `kept`: an axis some op uses asymmetrically (a ring, a send, a root, MoE
// capacity that drops tokens, context-parallel attention's positions), an axis an output's `ranks:` selects, a
// per-rank, local-view or pipelined program. `lists`: each op list with the program whose names its ops use.
struct OpList {
  const Program* program;
  const std::vector<Op>* ops;
};
std::vector<std::int64_t> choose_mesh(const Program& g, const std::vector<OpList>& lists, std::vector<std::string>& kept);

// The ranks of each mesh axis of `g` (1 for a symbolic size).
std::vector<std::int64_t> mesh_sizes(const Program& g);

// `g` with its mesh axes at `mesh` ranks.
Program at_mesh(const Program& g, const std::vector<std::int64_t>& mesh);

// `g` with every variable's allowed set narrowed to the one value of `vars` (to type-check it at those sizes).
Program at_sizes(const Program& g, const std::vector<std::int64_t>& vars);

// Whether `g` at its declared sizes is the same program as `p` (a program read from the same text with its sizes
// folded): the same declarations, ops, attributes and outputs, each size of `g` evaluated at `vars` equal to
// `p`'s. A program edited after it was loaded (a mutant) is not, and is checked as it is.
bool same_program(const Program& p, const Program& g, const std::vector<std::int64_t>& vars);

// Per op of `run` (a list of `rp`), per input: its real global shape, evaluated at `real` from the types of `typed`
// (the list the checker typed; ops are matched by their operands, ops it lacks take their first input's shape).
// `written`, when given: per name of `rp`, the elements of its last write by `run` as typed (-1: not written, or by
// an op the list lacks, or untyped).
std::vector<std::vector<std::vector<std::int64_t>>> real_shapes(const Program& rp, const std::vector<Op>& run, const TypedOps& typed,
                                                                const std::vector<std::int64_t>& real, std::vector<std::int64_t>* written = nullptr);

}  // namespace spmd::equiv_detail
