// ir/loader.h - reads a YAML program (contract section 1) into a Program.
//
// Every malformed input raises LoadError at a source position: YAML syntax, unknown keys and ops
// (with a "did you mean"), missing or mistyped attributes, bad placements, duplicate names,
// non-positive or absurd sizes. It never checks placements or order: that is the checks' job.
#pragma once
#include <string>

#include "ir/program.h"

namespace spmd {

Program load_program_file(const std::string& path);
Program load_program_string(const std::string& text, const std::string& filename);

// Whether JSON ops and tensors of the plain form are read straight from the text (ir/loader_json.cpp; on by
// default). Off, every item goes through the parse events: the tests load each program both ways and compare.
void set_json_direct(bool on);

}  // namespace spmd
