// tests/equiv_difftest.cpp - differential test of the value check: spmd_equiv_difftest [--count N] [--seed S].
//
// Each random program of the difftest generator (tests/difftest.h) gives two plan/spec pairs: the plan against its
// own ops on one device (no `spec:`), and the plan against a spec that is its own op list with one constant changed
// (when it has one). Ground truth is the numeric interpreter with independent draws: run_oracle on three other
// seeds for the first pair, the double-precision comparison of three other seeds for the second. A pair the value
// check calls equivalent while the interpreter finds a difference is a soundness bug: printed, exit 1.
//
// `--local N` runs N random local-view plan/spec pairs (tests/equiv_gen.h: a spec chain and a plan derived from it
// by a random sharding strategy, with one injected mistake about half the time). Ground truth: the doubles of the
// plan's assembled outputs against the spec's on three other seeds. Counted: verdicts, false equivalent (exit 1),
// injected mistakes not reported as value-mismatch, and mistake-free plans not proved (with their reasons).
//
// `--train N` runs N random training programs with a spec (tests/equiv_train.h): a layer stack over a 1-3 axis mesh,
// a loss, the grad_sync the type checker asks for, and one injected mistake in half of them. Ground truth: the plan's
// synchronized gradients (its derived backward run per rank) against central finite differences of the spec's
// forward in doubles. A program whose gradients differ from the finite differences must never be `equivalent`.
//
// `--reduce N` tests shape reduction (issue 20, docs/equivalence.md "Shape reduction") on N random families of
// programs with named sizes (tests/reduce_gen.h): each family's verdict at 6 times its base sizes, which the value
// check reduces, must equal its verdicts at 2 and 3 times its base sizes run in full (no reduction). A verdict that
// differs either way (equivalent against a mismatch found in full, or the reverse) fails (exit 1).
// `--pipeline N` runs N random pipelined programs (tests/equiv_pipeline.h: a schedule with stages, generated or as
// PyTorch's CSV, and one injected mistake in half of them). Ground truth: each rank's program run in doubles, each
// parameter's gradient read from its stage, against finite differences of the spec's forward. Counted: verdicts,
// false equivalent (exit 1), mistakes that change a gradient but `spmdcheck check` does not report. The value check
// reduces sizes (and a dp of 4 to 2 ranks) as it does for users; the ground truth runs as declared.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include <unistd.h>

#include "cli/check_file.h"
#include "tests/equiv_pipeline.h"

#include "equiv/equiv.h"
#include "interp/interp.h"
#include "ir/loader.h"
#include "tests/difftest.h"
#include "tests/equiv_gen.h"
#include "tests/equiv_train.h"
#include "tests/local_train_gen.h"
#include "tests/reduce_gen.h"

using namespace spmd;

namespace {

int show_extra = 0;  // --show-extra N: print the first N pairs called value-mismatch that the interpreter finds equal

struct Tally {
  int extra = 0;
  int pairs = 0, equivalent = 0, mismatch = 0, unknown = 0, skipped = 0, differs = 0, false_equivalent = 0;
  std::map<std::string, int> reasons;
};

void tally(EquivVerdict v, int& equivalent, int& mismatch, int& unknown, int& skipped) {
  switch (v) {
    case EquivVerdict::Equivalent: ++equivalent; break;
    case EquivVerdict::Mismatch: ++mismatch; break;
    case EquivVerdict::Unknown: ++unknown; break;
    case EquivVerdict::Skipped: ++skipped; break;
  }
}

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

struct LocalTally {
  int pairs = 0, load_errors = 0, injected = 0, equivalent = 0, mismatch = 0, unknown = 0, skipped = 0, differs = 0;
  int false_equivalent = 0, missed = 0, harmless = 0, fixed_differs = 0, fixed_unproved = 0, spec_fails = 0, false_mismatch = 0;
  // the same plan as per-rank `programs:`: checked too, judged by the same ground truth
  int per_rank = 0, per_rank_same = 0, per_rank_false_equivalent = 0, per_rank_false_mismatch = 0, per_rank_load_errors = 0;
  std::map<std::string, int> by_mistake, missed_by_mistake, unproved_reasons, per_rank_differences;
};

// A generated program loaded, or nullopt after printing the first three that do not load (`errors` counts them).
std::optional<Program> load_generated(const std::string& text, const char* file, int& errors, const char* what) {
  try {
    return load_program_string(text, file);
  } catch (const LoadError& e) {
    if (++errors <= 3) std::printf("%s: %s\n---\n%s---\n", what, e.what(), text.c_str());
    return std::nullopt;
  }
}

void run_local(LocalTally& t, std::uint64_t seed, int count, bool verbose) {
  for (int i = 0; i < count; ++i) {
    test::LocalPair lp = test::generate_local_pair(seed + static_cast<std::uint64_t>(i));
    if (lp.text.empty()) continue;
    std::optional<Program> loaded = load_generated(lp.text, "local_gen.yaml", t.load_errors, "generator wrote a program that does not load");
    if (!loaded) continue;
    Program& p = *loaded;
    bool bug = !lp.mistake.empty();
    EquivResult r = check_equivalence(p);
    if (r.message.rfind("the spec's run fails", 0) == 0) {
      // The single-device spec does not run (an engine finding, not a verdict on the plan): counted apart.
      if (++t.spec_fails <= 2 || verbose) std::printf("SPEC RUN FAILS (%s): %s\n---\n%s---\n", bug ? lp.mistake.c_str() : "no mistake", r.message.c_str(), lp.text.c_str());
      continue;
    }
    ++t.pairs;
    t.injected += bug;
    if (bug) ++t.by_mistake[lp.mistake];
    bool differs = doubles_differ(p);
    t.differs += differs;
    switch (r.verdict) {
      case EquivVerdict::Equivalent: ++t.equivalent; break;
      case EquivVerdict::Mismatch: ++t.mismatch; break;
      case EquivVerdict::Unknown: ++t.unknown; break;
      case EquivVerdict::Skipped: ++t.skipped; break;
    }
    if (r.verdict == EquivVerdict::Equivalent && differs) {
      ++t.false_equivalent;
      std::printf("FALSE EQUIVALENT (local, %s): %s\n---\n%s---\n", bug ? lp.mistake.c_str() : "no mistake", r.message.c_str(), lp.text.c_str());
    }
    if (bug && r.verdict != EquivVerdict::Mismatch) {
      if (differs) {
        ++t.missed;
        ++t.missed_by_mistake[lp.mistake];
        if (verbose || t.missed <= 3)
          std::printf("MISSED (%s, %s): %s\n---\n%s---\n", lp.mistake.c_str(), equiv_verdict_name(r.verdict), r.message.c_str(), lp.text.c_str());
      } else {
        ++t.harmless;
        if (verbose) std::printf("HARMLESS (%s, %s): %s\n---\n%s---\n", lp.mistake.c_str(), equiv_verdict_name(r.verdict), r.message.c_str(), lp.text.c_str());
      }
    }
    if (r.verdict == EquivVerdict::Mismatch && !differs) {
      ++t.false_mismatch;
      std::printf("VALUE-MISMATCH BUT THE DOUBLES AGREE (%s): %s\n---\n%s---\n", bug ? lp.mistake.c_str() : "no mistake", r.message.c_str(), lp.text.c_str());
    }
    if (!bug && differs) {
      ++t.fixed_differs;
      if (verbose || t.fixed_differs <= 3) std::printf("MISTAKE-FREE PLAN DIFFERS (%s): %s\n---\n%s---\n", equiv_verdict_name(r.verdict), r.message.c_str(), lp.text.c_str());
    }
    if (!bug && !differs && r.verdict != EquivVerdict::Equivalent) {
      ++t.fixed_unproved;
      ++t.unproved_reasons[fmt::format("{}: {}", equiv_verdict_name(r.verdict), r.message.substr(0, 90))];
      if (verbose) std::printf("UNPROVED: %s\n---\n%s---\n", r.message.c_str(), lp.text.c_str());
    }
    // The per-rank spelling of the same plan: the same values, so the same verdict (and never a false one).
    std::optional<Program> q = load_generated(lp.per_rank, "local_gen_per_rank.yaml", t.per_rank_load_errors, "per-rank spelling does not load");
    if (!q) continue;
    EquivResult pr = check_equivalence(*q);
    ++t.per_rank;
    if (pr.verdict == r.verdict) ++t.per_rank_same;
    else ++t.per_rank_differences[fmt::format("{} as ops, {} as programs: {}", equiv_verdict_name(r.verdict), equiv_verdict_name(pr.verdict), pr.message.substr(0, 80))];
    if (pr.verdict == EquivVerdict::Equivalent && differs) {
      ++t.per_rank_false_equivalent;
      std::printf("FALSE EQUIVALENT (per-rank, %s): %s\n---\n%s---\n", bug ? lp.mistake.c_str() : "no mistake", pr.message.c_str(), lp.per_rank.c_str());
    }
    if (pr.verdict == EquivVerdict::Mismatch && !differs) {
      ++t.per_rank_false_mismatch;
      std::printf("VALUE-MISMATCH BUT THE DOUBLES AGREE (per-rank, %s): %s\n---\n%s---\n", bug ? lp.mistake.c_str() : "no mistake", pr.message.c_str(),
                  lp.per_rank.c_str());
    }
  }
  std::printf("local-view pairs: %d pairs (%d with an injected mistake): %d equivalent, %d value-mismatch, %d not proved, %d not checked; "
              "%d differ numerically; %d false equivalent; %d injected mistakes not reported as value-mismatch (%d numerically harmless "
              "not counted); %d mistake-free plans differ; %d mistake-free plans not proved; %d did not load; %d more where the spec's own run fails; %d value-mismatch while the doubles agree\n",
              t.pairs, t.injected, t.equivalent, t.mismatch, t.unknown, t.skipped, t.differs, t.false_equivalent, t.missed, t.harmless,
              t.fixed_differs, t.fixed_unproved, t.load_errors, t.spec_fails, t.false_mismatch);
  for (const auto& [m, k] : t.by_mistake) {
    auto it = t.missed_by_mistake.find(m);
    std::printf("  injected x%d: %s (missed %d)\n", k, m.c_str(), it == t.missed_by_mistake.end() ? 0 : it->second);
  }
  for (const auto& [why, k] : t.unproved_reasons) std::printf("  mistake-free not proved x%d: %s\n", k, why.c_str());
  std::printf("the same plans as per-rank programs: %d checked, %d with the same verdict, %d false equivalent, %d value-mismatch while the "
              "doubles agree, %d did not load\n",
              t.per_rank, t.per_rank_same, t.per_rank_false_equivalent, t.per_rank_false_mismatch, t.per_rank_load_errors);
  for (const auto& [why, k] : t.per_rank_differences) std::printf("  verdict differs x%d: %s\n", k, why.c_str());
}

// `--local-train N`: random local-view training steps with a hand-written backward (tests/local_train_gen.h),
// judged by the plan's own step against finite differences of the spec's forward (tests/equiv_train.h).
struct LocalTrainTally {
  int n = 0, load_errors = 0, truth_failed = 0, equivalent = 0, mismatch = 0, other = 0, differs = 0, false_equivalent = 0, false_mismatch = 0,
      missed = 0, clean = 0, clean_equivalent = 0;
  std::map<std::string, int> by_mistake, missed_by_mistake, other_reasons;
};

void run_local_train(LocalTrainTally& t, std::uint64_t seed, int count, bool verbose) {
  for (int i = 0; i < count; ++i) {
    test::LocalTrainProgram g = test::generate_local_train(seed + static_cast<std::uint64_t>(i));
    std::optional<Program> loaded = load_generated(g.text, "local_train_gen.yaml", t.load_errors, "generator wrote a program that does not load");
    if (!loaded) continue;
    Program& p = *loaded;
    test::Truth truth = test::gradient_truth(p);
    if (truth.failed && !truth.differs) {
      if (++t.truth_failed <= 3) std::printf("GROUND TRUTH CANNOT RUN: %s\n---\n%s---\n", truth.what.c_str(), g.text.c_str());
      continue;
    }
    ++t.n;
    bool bug = !g.mistake.empty();
    if (bug) ++t.by_mistake[g.mistake];
    EquivResult r = check_equivalence(p);
    t.differs += truth.differs;
    if (r.verdict == EquivVerdict::Equivalent) ++t.equivalent;
    else if (r.verdict == EquivVerdict::Mismatch) ++t.mismatch;
    else ++t.other, ++t.other_reasons[fmt::format("{}: {}", equiv_verdict_name(r.verdict), r.message.substr(0, 90))];
    if (!bug) ++t.clean, t.clean_equivalent += r.verdict == EquivVerdict::Equivalent;
    if (r.verdict == EquivVerdict::Equivalent && truth.differs) {
      ++t.false_equivalent;
      std::printf("FALSE EQUIVALENT (local training, %s): %s\n---\n%s---\n", bug ? g.mistake.c_str() : "no mistake", truth.what.c_str(), g.text.c_str());
    }
    if (r.verdict == EquivVerdict::Mismatch && !truth.differs) {
      ++t.false_mismatch;
      std::printf("VALUE-MISMATCH BUT THE FINITE DIFFERENCES AGREE (local training, %s): %s\n---\n%s---\n", bug ? g.mistake.c_str() : "no mistake",
                  r.message.c_str(), g.text.c_str());
    }
    if (truth.differs && r.verdict != EquivVerdict::Mismatch) {
      ++t.missed, ++t.missed_by_mistake[bug ? g.mistake : "no mistake"];
      if (verbose || t.missed <= 3) std::printf("MISSED (%s): %s\n---\n%s---\n", bug ? g.mistake.c_str() : "no mistake", r.message.c_str(), g.text.c_str());
    }
  }
  std::printf("local-view training steps: %d run (%d did not load, %d where the ground truth cannot run): %d equivalent, %d value-mismatch, %d other; "
              "%d differ from the finite differences; %d false equivalent; %d value-mismatch while the finite differences agree; %d differing "
              "not reported; mistake-free: %d, %d of them equivalent\n",
              t.n, t.load_errors, t.truth_failed, t.equivalent, t.mismatch, t.other, t.differs, t.false_equivalent, t.false_mismatch, t.missed, t.clean,
              t.clean_equivalent);
  for (const auto& [m, k] : t.by_mistake) {
    auto it = t.missed_by_mistake.find(m);
    std::printf("  mistake x%d: %s (missed %d)\n", k, m.c_str(), it == t.missed_by_mistake.end() ? 0 : it->second);
  }
  for (const auto& [w, k] : t.other_reasons) std::printf("  not decided x%d: %s\n", k, w.c_str());
}

struct TrainTally {
  int generated = 0, discarded = 0, evaluated = 0, caught_by_types = 0, equivalent = 0, mismatch = 0, unknown = 0, skipped = 0;
  int differs = 0, clean = 0, clean_equivalent = 0, false_equivalent = 0, false_mismatch = 0, fixed_differs = 0, fixed_unproved = 0, truth_failed = 0, compared = 0, reduced = 0;
  // The same programs without their spec (the plan's own ops on one device, docs/equivalence.md) where the plan's forward
  // and optimizer carry no mistake: the verdict must still agree with the finite differences.
  int derived = 0, derived_equivalent = 0, derived_mismatch = 0, derived_false_equivalent = 0, derived_false_mismatch = 0;
  std::map<std::string, int> discards, unproved, features;
  struct PerClass {
    int n = 0, not_applicable = 0, types = 0, mismatch = 0, unproved = 0, equivalent = 0, harmless = 0, missed = 0;
  };
  std::map<std::string, PerClass> per;
};

// The program with every integer of 2 or more in a `shape: [...]` list written as a named size (N4: 4), so the
// value check reduces it (docs/equivalence.md, "Shape reduction"); equal numbers share one name.
std::string with_named_sizes(const std::string& text) {
  std::string out;
  std::set<long> used;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t at = text.find("shape: [", i);
    if (at == std::string::npos) {
      out += text.substr(i);
      break;
    }
    std::size_t open = at + 8, close = text.find(']', open);
    out += text.substr(i, open - i);
    std::string list = text.substr(open, close - open), rewritten;
    for (std::size_t j = 0; j < list.size();) {
      if (std::isdigit(static_cast<unsigned char>(list[j])) && (j == 0 || !std::isalnum(static_cast<unsigned char>(list[j - 1])))) {
        std::size_t e = j;
        while (e < list.size() && std::isdigit(static_cast<unsigned char>(list[e]))) ++e;
        long v = std::stol(list.substr(j, e - j));
        if (v >= 2 && (e == list.size() || !std::isalnum(static_cast<unsigned char>(list[e])))) {
          rewritten += fmt::format("N{}", v);
          used.insert(v);
        } else {
          rewritten += list.substr(j, e - j);
        }
        j = e;
      } else {
        rewritten += list[j++];
      }
    }
    out += rewritten;
    i = close;
  }
  if (used.empty()) return text;
  std::string sizes = "sizes: {";
  for (long v : used) sizes += fmt::format("{}N{}: {}", sizes.size() > 8 ? ", " : "", v, v);
  sizes += "}\n";
  std::size_t mesh = out.find("\nmesh:");
  std::size_t eol = mesh == std::string::npos ? std::string::npos : out.find('\n', mesh + 1);
  if (eol == std::string::npos) return text;
  return out.substr(0, eol + 1) + sizes + out.substr(eol + 1);
}

void run_train(TrainTally& t, std::uint64_t seed, int count, bool verbose) {
  for (int i = 0; i < count; ++i) {
    std::uint64_t sd = seed + static_cast<std::uint64_t>(i);
    ++t.generated;
    test::TrainCase fixed = test::generate_train(sd, false), buggy = test::generate_train(sd, true);
    bool bug = !buggy.mistake.empty();
    std::string ftext, text, why;
    // The mistake-free program must pass the type checks (with the grad_sync they ask for), else it is discarded.
    if (!test::with_grad_sync(fixed, false, ftext, why)) {
      ++t.discarded, ++t.discards[why.substr(0, 60)];
      continue;
    }
    Program p;
    try {
      p = load_program_string(ftext, "train_gen.yaml");
      auto errs = test::type_errors(p);
      if (!errs.empty()) {
        ++t.discarded, ++t.discards[fmt::format("with grad_sync: {}", errs[0].message.substr(0, 60))];
        continue;
      }
      if (bug) {
        if (!test::with_grad_sync(buggy, true, text, why)) {  // no grad_sync (or no other axis) to break
          ++t.per[buggy.mistake].not_applicable;
          continue;
        }
        p = load_program_string(text, "train_gen.yaml");
        if (!test::type_errors(p).empty()) {
          ++t.per[buggy.mistake].n, ++t.per[buggy.mistake].types, ++t.caught_by_types;
          continue;
        }
      } else {
        text = ftext;
      }
    } catch (const LoadError& e) {
      ++t.discarded, ++t.discards[std::string("load error: ") + std::string(e.what()).substr(0, 50)];
      if (verbose) std::printf("LOAD ERROR: %s\n%s\n", e.what(), text.empty() ? ftext.c_str() : text.c_str());
      continue;
    }
    ++t.evaluated;
    for (const char* f : {"op: ReduceScatter", "op: AllGather", "dst: I", "op: Convert", "op: LossScale", "op: Concat", "op: Reshape", "grad_sync:", "scalar: 0.25}",
                          "tp: S(1)", "cp: S(0)", "op: Exp", "op: SiLU", "op: GELU", "op: Sigmoid", "op: Sqrt", "op: Rsqrt", "op: Log", "op: RMSNorm", "op: LayerNorm", "op: Softmax", "op: CrossEntropyLoss", "vocab_parallel: true", "op: FlashAttention", "causal: true", "cp: cp", "op: Embedding", "[4, 2], placement: {tp: S(0)}", "optimizer:", "op: SGDUpdate", "op: AdamWUpdate", "op: GradNormSq"})
      t.features[f] += text.find(f) != std::string::npos;
    {
      std::map<NameId, int> uses;
      for (const auto& op : p.ops)
        for (NameId n : p.ins(op)) ++uses[n];
      bool tied = false;
      for (const auto& d : p.tensors) tied |= d.param && uses[d.name] > 1;
      t.features["tied weight"] += tied;
    }
    // The value check runs with shape reduction: on the program with its sizes named (the ground truth on the literal one).
    EquivResult r = check_equivalence(load_program_string(with_named_sizes(text), "train_gen.yaml"));
    t.reduced += !r.reduction.empty();
    test::Truth tr = test::gradient_truth(p);
    t.compared += tr.compared;
    if (tr.failed && !tr.differs) {
      ++t.truth_failed;
      if (verbose || t.truth_failed <= 3) std::printf("GROUND TRUTH FAILS: %s\n---\n%s---\n", tr.what.c_str(), text.c_str());
      continue;
    }
    t.differs += tr.differs;
    tally(r.verdict, t.equivalent, t.mismatch, t.unknown, t.skipped);
    if (r.verdict == EquivVerdict::Equivalent && tr.differs) {
      ++t.false_equivalent;
      std::printf("FALSE EQUIVALENT (train, %s): %s; truth: %s\n---\n%s---\n", bug ? buggy.mistake.c_str() : "no mistake", r.message.c_str(), tr.what.c_str(), text.c_str());
    }
    // Without the spec: only where the mistake (if any) is in the grad sync, which the single-device step does not run.
    if (!bug || (buggy.grad_sync_mistake && buggy.optim_mistake < 0)) {
      std::string own;
      std::istringstream lines(text);
      bool in_spec = false;
      for (std::string l; std::getline(lines, l);) {
        if (!l.empty() && l[0] != ' ') in_spec = l.rfind("spec:", 0) == 0;
        if (!in_spec) own += l + "\n";
      }
      EquivResult d = check_equivalence(load_program_string(with_named_sizes(own), "train_gen.yaml"));
      ++t.derived;
      t.derived_equivalent += d.verdict == EquivVerdict::Equivalent;
      t.derived_mismatch += d.verdict == EquivVerdict::Mismatch;
      if (d.verdict == EquivVerdict::Equivalent && tr.differs) {
        ++t.derived_false_equivalent;
        std::printf("FALSE EQUIVALENT WITHOUT THE SPEC (train, %s): %s; truth: %s\n---\n%s---\n", bug ? buggy.mistake.c_str() : "no mistake", d.message.c_str(),
                    tr.what.c_str(), own.c_str());
      }
      if (d.verdict == EquivVerdict::Mismatch && !tr.differs) {
        ++t.derived_false_mismatch;
        std::printf("VALUE-MISMATCH WITHOUT THE SPEC BUT THE FINITE DIFFERENCES AGREE (train, %s): %s\n---\n%s---\n", bug ? buggy.mistake.c_str() : "no mistake",
                    d.message.c_str(), own.c_str());
      }
    }
    if (r.verdict == EquivVerdict::Mismatch && !tr.differs) {
      ++t.false_mismatch;
      std::printf("VALUE-MISMATCH BUT THE FINITE DIFFERENCES AGREE (train, %s): %s\n---\n%s---\n", bug ? buggy.mistake.c_str() : "no mistake", r.message.c_str(), text.c_str());
    }
    if (bug) {
      auto& pc = t.per[buggy.mistake];
      ++pc.n;
      if (!tr.differs) ++pc.harmless;
      else if (r.verdict == EquivVerdict::Mismatch) ++pc.mismatch;
      else if (r.verdict == EquivVerdict::Equivalent) ++pc.equivalent;
      else {
        ++pc.unproved;
        if (verbose) std::printf("MISSED (%s, %s): %s\n---\n%s---\n", buggy.mistake.c_str(), equiv_verdict_name(r.verdict), r.message.c_str(), text.c_str());
      }
    } else if ((++t.clean, r.verdict == EquivVerdict::Equivalent && ++t.clean_equivalent, tr.differs)) {
      ++t.fixed_differs;
      if (verbose || t.fixed_differs <= 3) std::printf("MISTAKE-FREE PROGRAM DIFFERS (%s): %s; truth: %s\n---\n%s---\n", equiv_verdict_name(r.verdict), r.message.c_str(), tr.what.c_str(), text.c_str());
    } else if (r.verdict != EquivVerdict::Equivalent) {
      ++t.fixed_unproved;
      ++t.unproved[fmt::format("{}: {}", equiv_verdict_name(r.verdict), r.message.substr(0, 100))];
      if (verbose) std::printf("UNPROVED: %s\n---\n%s---\n", r.message.c_str(), text.c_str());
    }
  }
  std::printf("training programs: %d generated, %d discarded (the mistake-free program fails the type checks), %d mistakes reported by the type checks; "
              "%d run: %d equivalent, %d value-mismatch, %d not proved, %d not checked; %d differ from the finite differences (%d parameter elements compared); "
              "%d false equivalent; %d value-mismatch while the finite differences agree; %d mistake-free programs differ; %d mistake-free programs not proved; "
              "%d where the ground truth cannot run\n",
              t.generated, t.discarded, t.caught_by_types, t.evaluated, t.equivalent, t.mismatch, t.unknown, t.skipped, t.differs, t.compared, t.false_equivalent,
              t.false_mismatch, t.fixed_differs, t.fixed_unproved, t.truth_failed);
  std::printf("  mistake-free programs run: %d, %d of them equivalent; %d value checks ran at reduced sizes\n", t.clean, t.clean_equivalent, t.reduced);
  std::printf("  without their spec (no mistake, or one in the grad sync): %d run, %d equivalent, %d value-mismatch; %d false equivalent; %d "
              "value-mismatch while the finite differences agree\n",
              t.derived, t.derived_equivalent, t.derived_mismatch, t.derived_false_equivalent, t.derived_false_mismatch);
  std::string feats;
  for (const auto& [f, k] : t.features) feats += fmt::format("{}'{}' {}", feats.empty() ? "" : ", ", f, k);
  std::printf("  programs run that contain: %s\n", feats.c_str());
  for (const auto& [m, c] : t.per)
    std::printf("  mistake x%d: %s: %d by the type checks, %d value-mismatch, %d not proved, %d equivalent, %d numerically harmless (%d more not applicable)\n", c.n,
                m.c_str(), c.types, c.mismatch, c.unproved, c.equivalent, c.harmless, c.not_applicable);
  for (const auto& [w, k] : t.discards) std::printf("  discarded x%d: %s\n", k, w.c_str());
  for (const auto& [w, k] : t.unproved) std::printf("  mistake-free not proved x%d: %s\n", k, w.c_str());
}

struct PipelineTally {
  int cases = 0, load_errors = 0, equivalent = 0, mismatch = 0, unknown = 0, skipped = 0, differs = 0, false_equivalent = 0, truth_failed = 0;
  int clean = 0, clean_equivalent = 0, clean_differs = 0, missed = 0, extra_mismatch = 0;
  int reduced = 0, mesh_reduced = 0;  // value checks run at reduced sizes; of them on a reduced mesh (dp 4 -> 2 ranks)
  // A normalization mistake's value-mismatch: at the head's LossScale, elsewhere in the head or at the merge (a
  // per-microbatch mean read as P(avg) over dp, a loss right under a mean merge: not yet told apart), or at an op of a
  // stage before the head (a failure: those values are right).
  int located = 0, near = 0, mislocated = 0;
  std::map<std::string, std::array<int, 4>> per;  // mistake -> {cases, reported, changes values, missed}
  std::map<std::string, int> unproved;
};

void run_pipeline(PipelineTally& t, std::uint64_t seed, int count, bool verbose) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("spmd_pipeline_difftest_{}_{}", seed, ::getpid());  // runs in parallel do not share it
  fs::create_directories(dir);
  for (int i = 0; i < count; ++i) {
    std::uint64_t sd = seed + static_cast<std::uint64_t>(i);
    for (bool bug : {false, true}) {
      test::PipelineCase c = test::generate_pipeline(sd, bug);
      if (bug && c.mistake.empty()) continue;
      std::ofstream(dir / "pipe.yaml") << c.yaml;
      if (!c.csv.empty()) std::ofstream(dir / "pipe.csv") << c.csv;
      std::string path = (dir / "pipe.yaml").string();
      ++t.cases;
      Options opt;
      FileResult fr = check_file(path, opt);
      if (fr.load_failed) {
        if (++t.load_errors <= 3 || verbose) std::printf("LOAD ERROR: %s\n---\n%s---\n%s", fr.load_message.c_str(), c.yaml.c_str(), c.csv.c_str());
        continue;
      }
      bool reported = has_errors(fr.diags);
      Program p = load_program_file(path);
      EquivResult r = check_equivalence(p);
      test::Truth tr = test::pipeline_truth(p, p.has_optimizer ? 0 : 8);  // the optimizer's truth needs every gradient element
      if (tr.failed && !tr.differs) {
        if (bug && reported) {  // the checks before the values (the stages' types, the schedule) report it
          ++t.per[c.mistake][0], ++t.per[c.mistake][1];
          continue;
        }
        if (++t.truth_failed <= 3 || verbose)
          std::printf("GROUND TRUTH FAILS (%s): %s\n---\n%s---\n", bug ? c.mistake.c_str() : "no mistake", tr.what.c_str(), c.yaml.c_str());
        continue;
      }
      t.differs += tr.differs;
      t.reduced += !r.reduction.empty();
      t.mesh_reduced += r.reduction.find(" ranks") != std::string::npos;
      tally(r.verdict, t.equivalent, t.mismatch, t.unknown, t.skipped);
      if (r.verdict == EquivVerdict::Equivalent && tr.differs) {
        ++t.false_equivalent;
        std::printf("FALSE EQUIVALENT (pipeline, %s): %s; truth: %s\n---\n%s---\n%s", bug ? c.mistake.c_str() : "no mistake", r.message.c_str(), tr.what.c_str(),
                    c.yaml.c_str(), c.csv.c_str());
      }
      if (r.verdict == EquivVerdict::Mismatch && !tr.differs && ++t.extra_mismatch <= 3)
        std::printf("VALUE-MISMATCH BUT THE FINITE DIFFERENCES AGREE (pipeline, %s): %s\n---\n%s---\n%s", bug ? c.mistake.c_str() : "no mistake",
                    r.message.c_str(), c.yaml.c_str(), c.csv.c_str());
      // A normalization mistake is the head's LossScale (its first line in the file: the stages' modules come before
      // the spec): the value-mismatch is located there, not at a stage before the head (the last module).
      if (bug && c.mistake == "normalization" && r.verdict == EquivVerdict::Mismatch && !r.diags.empty()) {
        auto line_of = [&](std::size_t at) { return static_cast<std::uint32_t>(std::count(c.yaml.begin(), c.yaml.begin() + static_cast<std::ptrdiff_t>(at), '\n') + 1); };
        std::uint32_t want = line_of(c.yaml.find("{op: LossScale")), head = line_of(c.yaml.rfind("\n  stage", c.yaml.find("\nschedule:")) + 1);
        std::uint32_t got = r.diags[0].loc.line;
        if (got == want) ++t.located;
        else if (got > head) ++t.near;
        else if (++t.mislocated <= 3 || verbose)
          std::printf("MISLOCATED (pipeline, normalization at line %u, not at a stage before the head): %s\n---\n%s---\n%s", want, r.message.c_str(),
                      c.yaml.c_str(), c.csv.c_str());
      }
      if (bug) {
        auto& pc = t.per[c.mistake];
        ++pc[0], pc[1] += reported, pc[2] += tr.differs;
        if (tr.differs && !reported) {
          ++pc[3], ++t.missed;
          std::printf("MISSED (pipeline, %s): %s; truth: %s\n---\n%s---\n%s", c.mistake.c_str(), r.message.c_str(), tr.what.c_str(), c.yaml.c_str(), c.csv.c_str());
        }
      } else {
        ++t.clean;
        if (tr.differs) {
          ++t.clean_differs;
          if (t.clean_differs <= 3 || verbose) std::printf("MISTAKE-FREE PIPELINE DIFFERS: %s\n---\n%s---\n%s", tr.what.c_str(), c.yaml.c_str(), c.csv.c_str());
        } else if (r.verdict == EquivVerdict::Equivalent && !reported) {
          ++t.clean_equivalent;
        } else {
          ++t.unproved[fmt::format("{}: {}", reported ? "reported" : equiv_verdict_name(r.verdict), (reported ? fr.diags[0].message : r.message).substr(0, 100))];
          if (verbose) std::printf("MISTAKE-FREE PIPELINE NOT PROVED: %s\n---\n%s---\n%s", r.message.c_str(), c.yaml.c_str(), c.csv.c_str());
        }
      }
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("pipelined programs: %d run (%d load errors, %d where the ground truth cannot run): %d equivalent, %d value-mismatch, %d not proved, %d not "
              "checked; %d differ from the finite differences; %d false equivalent; %d value-changing mistakes not reported\n",
              t.cases, t.load_errors, t.truth_failed, t.equivalent, t.mismatch, t.unknown, t.skipped, t.differs, t.false_equivalent, t.missed);
  std::printf("  mistake-free programs: %d, %d proved equivalent, %d differ\n", t.clean, t.clean_equivalent, t.clean_differs);
  std::printf("  value checks at reduced sizes: %d, %d of them on a reduced mesh\n", t.reduced, t.mesh_reduced);
  std::printf("  normalization mistakes located at the head's LossScale: %d, elsewhere in the head or at the merge: %d, at a stage before the head: %d\n",
              t.located, t.near, t.mislocated);
  for (const auto& [m, c] : t.per) std::printf("  mistake x%d: %s: %d reported, %d change values, %d missed\n", c[0], m.c_str(), c[1], c[2], c[3]);
  for (const auto& [w, k] : t.unproved) std::printf("  mistake-free not proved x%d: %s\n", k, w.c_str());
}

}  // namespace

struct ReduceTally {
  int families = 0, reduced = 0, agree = 0, equivalent = 0, mismatch = 0, unknown = 0, disagree = 0, clean = 0, clean_equivalent = 0;
};

void run_reduce(ReduceTally& t, std::uint64_t seed, int n, bool verbose) {
  auto verdict_at = [](const test::ScaledProgram& sp, bool reduce, bool* was_reduced) {
    EquivOptions o;
    o.reduce = reduce;
    o.confirm = false;  // the reduced verdict itself is what is compared with the full runs
    try {
      EquivResult r = check_equivalence(load_program_string(sp.text, "reduce_gen.yaml"), o);
      if (was_reduced) *was_reduced = !r.reduction.empty();
      return r.verdict;
    } catch (const LoadError& e) {
      std::printf("reduce: generator wrote a bad program: %s\n%s\n", e.what(), sp.text.c_str());
      return EquivVerdict::Skipped;
    }
  };
  for (int i = 0; i < n; ++i) {
    std::uint64_t s = seed + static_cast<std::uint64_t>(i);
    test::ScaledProgram big = test::generate_scaled(s, 6), two = test::generate_scaled(s, 2), three = test::generate_scaled(s, 3);
    bool was = false;
    EquivVerdict a = verdict_at(big, true, &was), b = verdict_at(two, false, nullptr), c = verdict_at(three, false, nullptr);
    ++t.families;
    t.reduced += was;
    t.equivalent += a == EquivVerdict::Equivalent;
    t.mismatch += a == EquivVerdict::Mismatch;
    t.unknown += a == EquivVerdict::Unknown || a == EquivVerdict::Skipped;
    if (big.mistake.empty()) ++t.clean, t.clean_equivalent += a == EquivVerdict::Equivalent;
    // decided verdicts must agree (a full run that is only "not proved" decides nothing)
    auto decided = [](EquivVerdict v) { return v == EquivVerdict::Equivalent || v == EquivVerdict::Mismatch; };
    bool bad = (decided(a) && decided(b) && a != b) || (decided(a) && decided(c) && a != c);
    if (bad) {
      ++t.disagree;
      std::printf("reduce: family %llu (%s): reduced %s, at 2x %s, at 3x %s\n%s\n", static_cast<unsigned long long>(s),
                  big.mistake.empty() ? "no mistake" : big.mistake.c_str(), equiv_verdict_name(a), equiv_verdict_name(b), equiv_verdict_name(c),
                  big.text.c_str());
    } else if (decided(a)) {
      ++t.agree;
    }
    if (verbose)
      std::printf("family %llu: %s / %s / %s (%s)\n", static_cast<unsigned long long>(s), equiv_verdict_name(a), equiv_verdict_name(b), equiv_verdict_name(c),
                  big.mistake.c_str());
  }
  std::printf("reduce: %d families (%d reduced at 6x): %d equivalent, %d value-mismatch, %d undecided; %d agree with the full runs at 2x and 3x, %d disagree; "
              "%d mistake-free, %d of them equivalent\n",
              t.families, t.reduced, t.equivalent, t.mismatch, t.unknown, t.agree, t.disagree, t.clean, t.clean_equivalent);
}

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  int count = 10000, local = 0, train = 0, local_train = 0, reduce = 0, pipeline = 0;
  bool count_given = false, verbose = false;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--verbose") {
      verbose = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) a = "";
    if (a == "--count") count = std::atoi(argv[i + 1]), count_given = true;
    else if (a == "--local") local = std::atoi(argv[i + 1]);
    else if (a == "--train") train = std::atoi(argv[i + 1]);
    else if (a == "--local-train") local_train = std::atoi(argv[i + 1]);
    else if (a == "--reduce") reduce = std::atoi(argv[i + 1]);
    else if (a == "--pipeline") pipeline = std::atoi(argv[i + 1]);
    else if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--show-extra") show_extra = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: spmd_equiv_difftest [--count N] [--local N] [--train N] [--local-train N] [--reduce N] [--pipeline N] [--seed S] [--verbose] [--show-extra N]\n");
      return 2;
    }
  }
  if ((local > 0 || train > 0 || local_train > 0 || reduce > 0 || pipeline > 0) && !count_given) count = 0;  // --local / --train / --reduce / --pipeline alone run only those
  ReduceTally rt;
  if (reduce > 0) run_reduce(rt, seed, reduce, verbose);
  LocalTally lt;
  if (local > 0) run_local(lt, seed, local, verbose);
  TrainTally tt;
  if (train > 0) run_train(tt, seed, train, verbose);
  LocalTrainTally ltt;
  if (local_train > 0) run_local_train(ltt, seed, local_train, verbose);
  PipelineTally pt;
  if (pipeline > 0) run_pipeline(pt, seed, pipeline, verbose);
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
    if (count == 0) break;
    std::printf("%s: %d pairs: %d equivalent, %d value-mismatch, %d not proved, %d not checked; %d differ numerically; %d false equivalent\n",
                t == &own ? "plan vs its own ops" : "plan vs a mutated spec", t->pairs, t->equivalent, t->mismatch, t->unknown, t->skipped, t->differs,
                t->false_equivalent);
    for (const auto& [why, n] : t->reasons) std::printf("  not checked x%d: %s\n", n, why.c_str());
  }
  return own.false_equivalent + mutated.false_equivalent + lt.false_equivalent + lt.per_rank_false_equivalent + lt.per_rank_load_errors + tt.false_equivalent + tt.false_mismatch + tt.derived_false_equivalent + tt.derived_false_mismatch + ltt.false_equivalent + ltt.false_mismatch + ltt.missed + ltt.load_errors + ltt.truth_failed + rt.disagree + pt.false_equivalent + pt.missed + pt.mislocated ? 1 : 0;
}
