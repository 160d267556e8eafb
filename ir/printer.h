// ir/printer.h - writes a Program back as YAML in the contract's format (one flow mapping per op).
//
// Loading the printed text gives an equivalent program (same mesh, sizes, declarations, ops and
// attributes). Attributes are printed from the op table's specs, so a new op needs no printer code.
#pragma once
#include <string>

#include "ir/program.h"

namespace spmd {

std::string print_program(const Program& p);

// The one text of a value's placements, shared by every printer (YAML, explain, report, messages): each axis's
// placement and, when a dim is cut by several axes out of mesh order, the `order` key (docs/format.md):
// "dp: S(0), tp: S(0), order: [tp, dp]". Every mesh axis, or (`skip_r`) only those that are not R, the body of
// a YAML placement map.
std::string placements_text(const Program& p, const Placements& pl, bool skip_r = false);
// One axis's placement, with its dim's shard order when that is not mesh order: "S(0) (order [tp, dp])".
std::string axis_placement_text(const Program& p, const Placements& pl, int axis);

// One op as a YAML flow mapping ("{op: GELU, in: [x], out: y}"), for fixes. When `rename_in` >= 0, that
// operand is written as `new_name`.
std::string print_op(const Program& p, const Op& op, int rename_in = -1, const std::string& new_name = "");

}  // namespace spmd
