// tests/difftest.h - differential testing of the checker against the numeric oracle.
//
// generate_program draws a random SPMD program (1-D, 2-D or 3-D mesh, random placements) biased toward
// the hard cases: partial sums, contractions over sharded dims, reshapes of sharded dims, norms and
// collectives on every input kind. It asks the checker for the placements it infers so far, so it can
// pick the collective or operand that a real program would (and, now and then, a wrong one).
// run_difftest classifies each program: checker passes but numbers differ (a soundness bug, minimized),
// checker rejects but numbers agree on every seed (a false-alarm candidate), or consistent.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spmd::test {

// A random program as YAML text (it always loads).
std::string generate_program(std::uint64_t seed);

struct DiffStats {
  int programs = 0, passed = 0, rejected = 0;
  int agree = 0, skipped = 0;           // among passed programs
  int true_positive = 0;                // rejected and the numbers differ
  int false_alarm_candidates = 0;       // rejected and the numbers agree on every seed
  std::vector<std::string> soundness;   // minimized programs the checker passes and the numbers refute
  // false-alarm candidates by "check-id(s) at OpKind": count and the smallest example
  std::map<std::string, std::pair<int, std::string>> false_alarms;
  std::map<std::string, int> skip_reasons;
};

// Runs `count` programs from `seed` (each judged on `seeds` value seeds). `log` gets progress lines when set.
DiffStats run_difftest(std::uint64_t seed, int count, int seeds, bool verbose);

// A report of the stats (counts, soundness bugs, false-alarm candidates by kind).
std::string render_stats(const DiffStats& s);

}  // namespace spmd::test
