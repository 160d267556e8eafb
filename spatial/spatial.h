// spatial/spatial.h - the spatial checker: placements and shapes, per mesh axis.
//
// check_spatial runs every op of an SPMD program in order, mapping input placements and shapes to
// output ones by the op's rule (spatial/rules.cpp, one exhaustive switch) or to a diagnostic; then
// checks the declared outputs (partial-output, placement-mismatch). Shape obligations are decided
// directly when concrete and by Z3 when symbolic (spatial/obligations.h). A value with an error
// is not reported again downstream. Diagnostics come back sorted by position.
#pragma once
#include <array>
#include <span>
#include <string>
#include <optional>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

// The type the checker gave one value: global shape, per-axis placements, dtype. `ok` is false when
// the value is undefined or carries an error (no type).
struct ValueType {
  std::array<ExprId, kMaxRank> shape{};
  std::uint8_t rank = 0;
  Placements pl{};
  DType dtype = DType::F32;
  bool ok = false;
  std::uint32_t fresh = 0;  // axes on which a V holds per-rank values (the checker's Value::fresh)
  bool uneven = false;      // shards may be padded (declared `uneven`, or computed from such a value)
  std::int8_t zz_axis = -1;  // the dims (bitmask zz_dims) held in zigzag order over this axis (LoadBalance), for drawing
  std::uint8_t zz_dims = 0;
  std::span<const ExprId> dims() const { return {shape.data(), rank}; }
};

// Where a value's placement on one axis arose (SpatialTypes::want_origins): the declaration or op that
// created it, and the rule's reason in its own words (empty for a declaration). `known` false: R by default.
struct PlacementOrigin {
  Loc loc;
  std::string tensor;
  std::string why;
  bool known = false;
};
using AxisOrigins = std::array<PlacementOrigin, kMaxAxes>;

// Every value's type, for passes built on the spatial rules (autograd, `spmdcheck explain`).
struct SpatialTypes {
  ExprPool exprs;                       // the program's expressions and the checker's own (shapes refer to it)
  std::vector<ValueType> decls;         // per tensor declaration
  std::vector<std::uint32_t> out_base;  // per op: index of its first output in `outs`
  std::vector<ValueType> outs;          // per op output
  const ValueType& out(std::size_t op, int k) const { return outs[out_base[op] + static_cast<std::size_t>(k)]; }
  bool want_origins = false;              // set before the check to fill the two below (off: no cost)
  std::vector<AxisOrigins> decl_origins;  // per declaration, like `decls`
  std::vector<AxisOrigins> out_origins;   // per op output, like `outs`
};

// A shape claim the check relied on that mentions a size variable (SpatialOptions::claims): a % b == 0, a == b,
// a >= 1, or the Div node `a` is exact. Shape reduction (equiv/reduce.h) keeps every one of them true.
enum class ClaimKind : std::uint8_t { Divisible, Equal, Positive, ExactDiv };
struct ShapeClaim {
  ClaimKind kind;
  ExprId a, b;
};

struct SpatialOptions {
  unsigned z3_timeout_ms = 10000;
  SpatialTypes* types = nullptr;  // when set, receives every value's type
  // When set, receives the inferred placement of every entry of Program::outputs, in order
  // (nullopt for an output that is undefined or poisoned by an earlier error). The numeric oracle
  // assembles an output with no declared placement by this one.
  std::vector<std::optional<Placements>>* inferred_outputs = nullptr;
  // Types of the first `prefix_ops` ops from an earlier check of the same ops with the same declarations
  // (the forward of a training step, whose check gave no error): those ops are not checked again, their
  // outputs take these types (without the notes on where a placement arose), and only the ops after them
  // are checked. Shapes refer to prefix->exprs, which the program's expression pool must extend.
  const SpatialTypes* prefix = nullptr;
  std::size_t prefix_ops = 0;
  // When set, receives every symbolic shape claim (deduplicated), in the expressions of `types->exprs` (set `types`
  // too: the checker's own expressions live there).
  std::vector<ShapeClaim>* claims = nullptr;
  // Ops from this index on are never differentiated (a training step's `optimizer:`): I and R differ only in their
  // gradient, so there an I operand is read as R (an invariant bias and a replicated clip coefficient mix freely).
  std::size_t no_grad_from = static_cast<std::size_t>(-1);
};

// A local-view program (`view: local`) gets no findings: its values have no placement.
std::vector<Diagnostic> check_spatial(const Program& program, const SpatialOptions& options = {});

}  // namespace spmd
