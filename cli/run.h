// cli/run.h - `spmdcheck run`: the checker's verdict and the numeric oracle on one program.
//
// run_program loads a program, checks it (spatial), picks the smallest scaled copy whose checker verdict
// is unchanged (interp/scale.h), and runs the oracle, assembling each output by its declared placement or,
// when none is declared, by the placement the checker inferred. The tests and the CLI share it.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "interp/interp.h"
#include "ir/diagnostic.h"

namespace spmd {

struct RunOptions {
  std::uint64_t seed = 0;
  unsigned z3_timeout_ms = 10000;
  bool scale = true;  // try scaled copies of large programs
};

struct RunReport {
  std::optional<LoadError> load_error;  // set when the file is not a valid program
  std::set<std::string> checker_ids;    // spatial check IDs of the original program (empty: it passes)
  std::string first_op;                 // the op kind of the first spatial error ("outputs" for a declaration)
  std::int64_t scale = 1;               // the named concrete sizes were first divided by this common factor
  bool scaled_each = false;             // and then some were reduced further on their own
  std::string run_sizes;                // the named sizes of the copy that ran ("B = 2, H = 16"), empty: the original
  OracleResult oracle;
};

RunReport run_program_text(const std::string& text, const std::string& filename, const RunOptions& options = {});
RunReport run_program_file(const std::string& path, const RunOptions& options = {});

// One line per report: "FILE: agree: ..." plus indented details (checker verdict, sizes, notes).
std::string render_run(const std::string& file, const RunReport& report);

}  // namespace spmd
