// ir/printer.h - writes a Program back as YAML in the contract's format (one flow mapping per op).
//
// Loading the printed text gives an equivalent program (same mesh, sizes, declarations, ops and
// attributes). Attributes are printed from the op table's specs, so a new op needs no printer code.
#pragma once
#include <string>

#include "ir/program.h"

namespace spmd {

std::string print_program(const Program& p);

}  // namespace spmd
