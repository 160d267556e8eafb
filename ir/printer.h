// ir/printer.h - writes a Program back as YAML in the contract's format (one flow mapping per op).
//
// Loading the printed text gives an equivalent program (same mesh, sizes, declarations, ops and
// attributes). Attributes are printed from the op table's specs, so a new op needs no printer code.
#pragma once
#include <string>

#include "ir/program.h"

namespace spmd {

std::string print_program(const Program& p);

// One op as a YAML flow mapping ("{op: GELU, in: [x], out: y}"), for fixes. When `rename_in` >= 0, that
// operand is written as `new_name`.
std::string print_op(const Program& p, const Op& op, int rename_in = -1, const std::string& new_name = "");

}  // namespace spmd
