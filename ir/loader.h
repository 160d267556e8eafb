// ir/loader.h - reads a YAML program (contract section 1) into a Program.
//
// Every malformed input raises LoadError at a source position: YAML syntax, unknown keys and ops
// (with a "did you mean"), missing or mistyped attributes, bad placements, duplicate names,
// non-positive or absurd sizes. It never checks placements or order: that is the checks' job.
#pragma once
#include <string>

#include "ir/program.h"

namespace spmd {

struct LoadOptions {
  // Every integer size under `sizes:` that no mesh axis names becomes a variable with that one value
  // (SizeVar::general), so the program's shapes keep their dependence on it: the value check reloads a program this
  // way to run it at reduced sizes (equiv/reduce.h). Off: sizes fold into constants, as everywhere else.
  bool generalize_sizes = false;
};

// The loaded Program keeps the text it was read from (Program::source), so it can be loaded again with other options.
Program load_program_file(const std::string& path, const LoadOptions& options = {});
Program load_program_string(const std::string& text, const std::string& filename, const LoadOptions& options = {});

// Whether JSON ops and tensors of the plain form are read straight from the text (ir/loader_json.cpp; on by
// default). Off, every item goes through the parse events: the tests load each program both ways and compare.
void set_json_direct(bool on);

}  // namespace spmd
