// interp/interp.h - the numeric oracle: runs a program per rank and on one device, and compares.
//
// run_oracle instantiates symbolic sizes with small allowed values, draws inputs (each rank's local
// piece of every declared tensor, by its placement), runs the ops once per rank with real collective
// and point-to-point semantics across the simulated ranks and once on a single device in the global
// view (collectives and conversions are the identity there), then assembles every output from the
// ranks by its placement (S: concatenate, P: reduce, R/I: all ranks must agree) and compares in float64.
// It builds on ir/ only: it never asks the checker what a placement is.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/program.h"

namespace spmd {

struct OracleOptions {
  std::uint64_t seed = 0;  // input values, and which small instantiation of symbolic sizes
  double rtol = 1e-9, atol = 1e-9;
  std::int64_t max_elements = std::int64_t{1} << 22;  // per tensor
  std::int64_t max_work = 400'000'000;                // element operations per run
  std::int64_t max_bytes = std::int64_t{800} << 20;   // tensor values live at once (checked before allocating)
  std::int64_t max_ranks = 64;
  // Placement to assemble each entry of Program::outputs by; nullopt (or missing): the declared one, R when
  // none is declared.
  std::vector<std::optional<Placements>> assemble;
};

enum class OracleVerdict {
  Agree,        // every comparable output agrees
  Differ,       // an output differs, ranks disagree on an R/I output, or the per-rank run fails
  GlobalError,  // the single-device run itself fails (the program is ill-formed in the global view)
  Skipped,      // cannot be interpreted (too large, no small sizes, nothing comparable): never agreement
};

struct OracleResult {
  OracleVerdict verdict = OracleVerdict::Skipped;
  std::string message;      // the first difference, the failure or the reason for skipping
  std::string sizes;        // the instantiation used, e.g. "T = 2, H = 64" (empty when all sizes are concrete)
  double max_diff = 0;      // the largest difference over compared outputs
  int compared = 0;         // outputs compared with the single-device value
  int rank_checked = 0;     // outputs only checked for agreement across ranks (their global value is undefined)
  std::vector<std::string> notes;  // outputs skipped and why
  int failed_op = -1;              // Differ because the per-rank run fails: the op (index into Program::ops)
  std::string failed_rank;         // and the rank, e.g. {tp: 1}
  std::string failure;             // and what failed there
};

std::string_view verdict_name(OracleVerdict v);

// Runs the oracle on `program` (SPMD `ops:`). Never throws on a well-formed Program.
// A local-view program (`view: local`) runs each rank on its local pieces and its single-device run on a mesh of
// ones (axis_index 0, axis sizes 1); when that run fails or an output's shape differs from the assembled one the
// program has no single-device meaning there: the output is not compared (never agreement).
OracleResult run_oracle(const Program& program, const OracleOptions& options = {});

// `spmdcheck check` on a local-view program: runs it per rank at the declared sizes (small values for symbolic
// ones) and reports an op that fails on some rank (local shapes that do not fit, a slice out of range, a Recv of
// another shape) as shape-mismatch at the op. A run over the interpreter's budget reports nothing.
std::vector<Diagnostic> check_local_view(const Program& program, const OracleOptions& options = {});

}  // namespace spmd
