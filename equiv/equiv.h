// equiv/equiv.h - value-level equivalence: a parallel plan against its single-device model (docs/equivalence.md).
//
// check_equivalence runs the model (`spec:`, or the plan's own op list on one device when there is none) and the
// plan per rank on the same inputs (the plan's inputs are the spec's, partitioned by their declared placements),
// in doubles and in random prime fields at once (interp/num.h: each op's meaning is written once), assembles the
// plan's outputs by placement and compares. Equal in every field lane and in doubles: equivalent, with a stated
// error bound. Different in doubles: value-mismatch, with the inputs, one element and both values, and the first
// plan op whose value stops matching the model (by lineage). Different only in the fields: unknown, never a pass.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd {

struct EquivOptions {
  std::uint64_t seed = 0;
  int trials = 1;
  // Run at reduced sizes that keep the program's partition structure (equiv/reduce.h); off: at the sizes as declared
  // (symbolic ones at a small allowed value).
  bool reduce = true;
  // A difference found at reduced sizes is run again as declared when that run is small (check_equivalence); off: the
  // reduced run's verdict as it is (tests).
  bool confirm = true;
  // element operations in all of a check's runs (about 4 s on the reference machine): a run past it is not proved
  std::int64_t max_work = 250'000'000;
  std::int64_t max_bytes = 0;  // tensor values live at once (0: the interpreter's default, OracleOptions::max_bytes)
  // Two trials the check is sure to need run at once on two threads (each run within max_bytes); off: one after the
  // other. The verdict, the bound and every message are the same either way.
  bool parallel = true;
};

enum class EquivVerdict { Equivalent, Mismatch, Unknown, Skipped };

struct EquivResult {
  EquivVerdict verdict = EquivVerdict::Skipped;
  std::vector<Diagnostic> diags;  // value-mismatch (error), or a warning/note saying what was proved and how
  double error_bound = 1;         // probability that `Equivalent` is wrong (field arithmetic), when Equivalent
  std::string sizes;              // the instantiation the run used
  std::string reduction;          // the sizes shape reduction changed ("H 1024 -> 8, S 512 -> 2"), empty: none
  std::string message;            // one line: the verdict and why
  // Equivalent for the drawn routings only: the only choices by value are MoE routing (TopKGate, MoEDispatch), and
  // the identity is proved with each trial's routing held fixed (a value-unproved warning says so).
  bool drawn_routings = false;
};

// "equivalent", "value-mismatch", "not proved", "not checked".
const char* equiv_verdict_name(EquivVerdict v);

EquivResult check_equivalence(const Program& p, const EquivOptions& o = {});

namespace equiv_detail {
struct TrainingPair;
}
// The value check of a training pair already built (equiv/training.h, equiv/pipeline.h); the mutation tests change
// its plan (a pipeline's lowered per-rank programs) and check it again.
EquivResult check_built_pair(const equiv_detail::TrainingPair& tp, const EquivOptions& o = {});

}  // namespace spmd
