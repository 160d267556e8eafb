// tests/equiv_difftest.cpp - differential test of the value check: spmd_equiv_difftest [--count N] [--seed S].
//
// Each random program of the difftest generator (tests/difftest.h) gives two plan/spec pairs: the plan against its
// own ops on one device (no `spec:`), and the plan against a spec that is its own op list with one constant changed
// (when it has one). Ground truth is the numeric interpreter with independent draws: run_oracle on three other
// seeds for the first pair, the double-precision comparison of three other seeds for the second. A pair the value
// check calls equivalent while the interpreter finds a difference is a soundness bug: printed, exit 1.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "equiv/equiv.h"
#include "interp/interp.h"
#include "ir/loader.h"
#include "tests/difftest.h"

using namespace spmd;

namespace {

int show_extra = 0;  // --show-extra N: print the first N pairs called value-mismatch that the interpreter finds equal

struct Tally {
  int extra = 0;
  int pairs = 0, equivalent = 0, mismatch = 0, unknown = 0, skipped = 0, differs = 0, false_equivalent = 0;
  std::map<std::string, int> reasons;
};

bool oracle_differs(const Program& p) {
  for (std::uint64_t seed : {11, 22, 33}) {
    OracleOptions o;
    o.seed = seed;
    auto r = run_oracle(p, o);
    if (r.verdict == OracleVerdict::Differ || r.verdict == OracleVerdict::GlobalError) return true;
  }
  return false;
}

bool doubles_differ(const Program& p) {
  for (std::uint64_t seed : {11, 22, 33}) {
    EquivOptions o;
    o.seed = seed;
    if (check_equivalence(p, o).verdict == EquivVerdict::Mismatch) return true;
  }
  return false;
}

void judge(Tally& t, const Program& p, bool differs, const std::string& text, const char* kind) {
  ++t.pairs;
  EquivResult r = check_equivalence(p);
  t.differs += differs;
  switch (r.verdict) {
    case EquivVerdict::Equivalent: ++t.equivalent; break;
    case EquivVerdict::Mismatch: ++t.mismatch; break;
    case EquivVerdict::Unknown: ++t.unknown; break;
    case EquivVerdict::Skipped:
      ++t.skipped;
      ++t.reasons[r.message.substr(0, 70)];
      break;
  }
  if (r.verdict == EquivVerdict::Mismatch && !differs && ++t.extra <= show_extra)
    std::printf("MISMATCH WHERE THE INTERPRETER AGREES (%s): %s\n---\n%s---\n", kind, r.message.c_str(), text.c_str());
  if (r.verdict == EquivVerdict::Equivalent && differs) {
    ++t.false_equivalent;
    std::printf("FALSE EQUIVALENT (%s): %s\n---\n%s---\n", kind, r.message.c_str(), text.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  int count = 10000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--count") count = std::atoi(argv[i + 1]);
    else if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--show-extra") show_extra = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: spmd_equiv_difftest [--count N] [--seed S] [--show-extra N]\n");
      return 2;
    }
  }
  Tally own, mutated;
  for (int i = 0; i < count; ++i) {
    std::string text = test::generate_program(seed + static_cast<std::uint64_t>(i));
    Program p;
    try {
      p = load_program_string(text, "gen.yaml");
    } catch (const LoadError&) {
      continue;
    }
    judge(own, p, oracle_differs(p), text, "own ops");
    // The spec: the plan's own ops with one constant changed.
    int target = -1;
    for (std::size_t k = 0; k < p.ops.size(); ++k)
      if (p.ops[k].attrs.has_number && (target < 0 || (seed + static_cast<std::uint64_t>(i) + k) % 3 == 0)) target = static_cast<int>(k);
    if (target < 0 || p.outputs.empty()) continue;
    Program q = p;
    q.has_spec = true;
    q.spec_ops = p.ops;
    double& x = q.spec_ops[static_cast<std::size_t>(target)].attrs.number;
    x = x == 0 ? 1 : x * 1.5;
    for (const auto& od : p.outputs) q.spec_outputs.push_back({od.name, od.name, od.loc});
    judge(mutated, q, doubles_differ(q), text + fmt::format("# spec: op {} constant changed to {}\n", target, x), "mutated spec");
  }
  for (auto* t : {&own, &mutated}) {
    std::printf("%s: %d pairs: %d equivalent, %d value-mismatch, %d not proved, %d not checked; %d differ numerically; %d false equivalent\n",
                t == &own ? "plan vs its own ops" : "plan vs a mutated spec", t->pairs, t->equivalent, t->mismatch, t->unknown, t->skipped, t->differs,
                t->false_equivalent);
    for (const auto& [why, n] : t->reasons) std::printf("  not checked x%d: %s\n", n, why.c_str());
  }
  return own.false_equivalent + mutated.false_equivalent ? 1 : 0;
}
