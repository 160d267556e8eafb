// tests/mutation.cpp - mutation testing of the value-level check (ctest `mutation`; docs/reliability.md).
//
// From each fixed example (a plan equal to its spec) it makes every mutant of these kinds: one constant changed
// (a `scalar`/`number` attribute doubled, or 0 made 1; a per-rank `scalar` of axis_index plus one), one comparison's
// strictness flipped (Ge <-> Gt, Le <-> Lt), one AllToAll's split sizes skewed by one piece, one Slice / Arange / Pad
// offset shifted by one, two Concat blocks swapped,
// one collective dropped (its output renamed to its input downstream), one collective's axis swapped for another, one
// AllReduce / ReduceScatter's reduce op swapped (sum <-> avg), one RingRotate's or LoadBalance's direction flipped. The ops of a training program's hand-written `backward:`
// and of its `grad_sync:` are mutated as the forward's are (a dropped gradient AllReduce, its axis or reduce op, a
// scale constant); a training program's value check compares its synchronized gradients with the spec's.
// A mutant "changes values" when a numeric run with independent draws (three other seeds) finds its outputs
// different from the spec's, or the mutant no longer runs; every such mutant must be reported by the checks a
// user runs (`spmdcheck check`: the type checks, the temporal checks, then the value check). The tool prints one
// line per missed mutant and a summary; exit 1 when a value-changing mutant was missed.
//
// A pipelined schedule (`stages:`) gets the constants of its stages' ops and its grad_sync mutated as above, and its
// lowered per-rank programs (equiv/pipeline.h) three more kinds: one microbatch's gradient accumulation dropped, a
// gradient reduction moved before the stage's last accumulation, and two sends of a rank swapped. Those are checked
// as the value check sees them (the lowered pair, with the temporal checks of its programs); their ground truth is
// the same numeric run with other seeds.
//
// Usage: spmd_mutation FILE_OR_DIR...   (directories: every *_fixed.yaml / *_ok.yaml under them)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "equiv/equiv.h"
#include "equiv/pipeline.h"
#include "ir/loader.h"
#include "spatial/spatial.h"
#include "temporal/temporal.h"
#include "tests/equiv_train.h"

namespace fs = std::filesystem;
using namespace spmd;

namespace {

struct Mutant {
  std::string what;
  Program p;
};

bool is_collective(const Op& op) { return op_info(op.kind).category == OpCategory::collective; }

// The op lists a mutant may change: the forward, a hand-written backward, the gradient synchronization and the
// optimizer step.
using OpList = std::vector<Op> Program::*;
constexpr OpList kLists[] = {&Program::ops, &Program::backward, &Program::grad_sync, &Program::optimizer};
const char* const kListNames[] = {"", "backward ", "grad_sync ", "optimizer "};

// Renames every later read of `from` to `to` (ops after `after` in list `li`, then the later lists; outputs, spec links).
void rename_reads(Program& p, std::size_t li, std::size_t after, NameId from, NameId to) {
  for (std::size_t l = li; l < std::size(kLists); ++l) {
    const std::vector<Op>& ops = p.*kLists[l];
    for (std::size_t oi = l == li ? after : 0; oi < ops.size(); ++oi) {
      const Op& op = ops[oi];
      for (std::uint32_t i = 0; i < op.n_in; ++i)
        if (p.operands[op.first + i] == from) p.operands[op.first + i] = to;
    }
  }
  for (auto& od : p.outputs)
    if (od.name == from) od.name = to;
  for (auto& l : p.spec_outputs)
    if (l.plan == from) l.plan = to;
}

std::string where(const Op& op, std::size_t li) { return fmt::format("{}{} at line {}", kListNames[li], op_name(op.kind), op.loc.line); }

// A pipelined schedule: the constants of its stages' ops.
void stage_mutants(const Program& base, std::vector<Mutant>& out) {
  for (std::size_t k = 0; k < base.schedule.stages.size(); ++k)
    for (std::size_t oi = 0; oi < base.schedule.stages[k].ops.size(); ++oi) {
      const Op& op = base.schedule.stages[k].ops[oi];
      if (!op.attrs.has_number) continue;
      Mutant m{fmt::format("constant of stage {} {} at line {}", k, op_name(op.kind), op.loc.line), base};
      double& x = m.p.schedule.stages[k].ops[oi].attrs.number;
      x = x == 0 ? 1 : 2 * x;
      out.push_back(std::move(m));
    }
}

// A pipeline's lowered programs (the pair the value check runs): a microbatch's accumulation dropped, a gradient
// reduction moved before the stage's last accumulation, two sends of one rank swapped.
struct PairMutant {
  std::string what;
  equiv_detail::TrainingPair tp;
};
std::vector<PairMutant> lowered_mutants(const equiv_detail::TrainingPair& base) {
  std::vector<PairMutant> out;
  const Program& p = base.program;
  for (std::size_t r = 0; r < p.programs.size(); ++r) {
    const RankProgram& rp = p.programs[r];
    auto in_rank = [&](std::uint32_t i) { return i >= rp.first_op && i < rp.first_op + rp.n_ops; };
    bool dropped = false, moved = false, swapped = false;
    for (std::uint32_t i = rp.first_op; i < rp.first_op + rp.n_ops; ++i) {
      const Op& op = p.ops[i];
      bool accumulation = i < base.generated.size() && base.generated[i] && op.kind == OpKind::Add && op.n_in == 2;
      if (accumulation && !dropped) {  // w.grad = w.grad + w.grad@mbK, gone
        PairMutant m{fmt::format("rank {}: the accumulation of {} dropped", r, p.name(p.ins(op)[1])), base};
        m.tp.program.ops[i].attrs.number = 0;
        m.tp.program.ops[i].attrs.has_number = true;
        m.tp.program.ops[i].n_in = 1;  // w.grad = w.grad + 0: the operand after the first is the output
        m.tp.program.operands[op.first + 1] = p.outs(op)[0];
        out.push_back(std::move(m));
        dropped = true;
      }
      if (op.kind == OpKind::AllReduce && !moved && op.n_out == 1) {  // a gradient reduction, before the last accumulation of its gradient
        NameId g = p.outs(op)[0];
        std::uint32_t last = 0;
        for (std::uint32_t j = rp.first_op; j < i; ++j)
          if (j < base.generated.size() && base.generated[j] && p.ops[j].n_out && p.outs(p.ops[j])[0] == g) last = j;
        if (last > rp.first_op && in_rank(last)) {
          PairMutant m{fmt::format("rank {}: the reduction of {} moved before its last accumulation", r, p.name(g)), base};
          auto& ops = m.tp.program.ops;
          Op moved_op = ops[i];
          ops.erase(ops.begin() + i);
          ops.insert(ops.begin() + last, moved_op);
          out.push_back(std::move(m));
          moved = true;
        }
      }
      if (op.kind == OpKind::Send && !swapped)
        for (std::uint32_t j = i + 1; j < rp.first_op + rp.n_ops; ++j)
          if (p.ops[j].kind == OpKind::Send && p.ops[j].attrs.coords == op.attrs.coords && p.ins(p.ops[j])[0] != p.ins(op)[0]) {
            PairMutant m{fmt::format("rank {}: sends of {} and {} swapped", r, p.name(p.ins(op)[0]), p.name(p.ins(p.ops[j])[0])), base};
            std::swap(m.tp.program.operands[op.first], m.tp.program.operands[p.ops[j].first]);
            out.push_back(std::move(m));
            swapped = true;
            break;
          }
    }
  }
  return out;
}

std::vector<Mutant> mutants_of(const Program& base) {
  std::vector<Mutant> out;
  stage_mutants(base, out);
  for (std::size_t li = 0; li < std::size(kLists); ++li) {
    const std::vector<Op>& ops = base.*kLists[li];
    for (std::size_t oi = 0; oi < ops.size(); ++oi) {
      const Op& op = ops[oi];
      auto mop = [&](Mutant& m) -> Op& { return (m.p.*kLists[li])[oi]; };
      if (op.attrs.has_number && op.attrs.scalar_expr) {  // a per-rank scalar (axis_index): one more
        Mutant m{"per-rank scalar of " + where(op, li) + " plus one", base};
        ExprId& e = m.p.shapes[op.attrs.sizes][0];
        e = m.p.exprs.add(e, m.p.exprs.constant(1));
        out.push_back(std::move(m));
      } else if (op.attrs.has_number) {
        Mutant m{"constant of " + where(op, li), base};
        double& x = mop(m).attrs.number;
        x = x == 0 ? 1 : 2 * x;
        out.push_back(std::move(m));
      }
      if (op.attrs.numbers != kNoIndex)  // the optimizer ops' several numbers (lr, betas, momentum, max_norm...)
        for (std::size_t k = 0; k < base.number_lists[op.attrs.numbers].size(); ++k) {
          if (std::isnan(base.number_lists[op.attrs.numbers][k])) continue;
          Mutant m{fmt::format("number {} of {}", k, where(op, li)), base};
          double& x = m.p.number_lists[op.attrs.numbers][k];
          x = x == 0 ? 0.5 : 2 * x;
          out.push_back(std::move(m));
        }
      if (op.kind == OpKind::AdamWUpdate) {  // the bias corrections of another step; the two states swapped
        Mutant m{"step of " + where(op, li) + " plus one", base};
        mop(m).attrs.k = std::max(1, op.attrs.k) + 1;
        out.push_back(std::move(m));
        Mutant s2{"states of " + where(op, li) + " swapped", base};
        std::swap(s2.p.operands[op.first + 2], s2.p.operands[op.first + 3]);
        out.push_back(std::move(s2));
      }
      if (op.kind == OpKind::GradNormSq)  // the norm double-counted (a listed axis more) or left local (one fewer)
        for (std::size_t a = 0; a < base.mesh.size(); ++a) {
          Mutant m{fmt::format("axis {} of {} {}", base.mesh[a].name, where(op, li), op.attrs.axes & (1u << a) ? "dropped" : "added"), base};
          mop(m).attrs.axes ^= 1u << a;
          out.push_back(std::move(m));
        }
      if ((op.kind == OpKind::ReduceScatter || op.kind == OpKind::AllGather) && op.attrs.dim != kUnset) {  // another shard: the wrong gradient shard
        Mutant m{"dim of " + where(op, li) + " changed", base};
        mop(m).attrs.dim = static_cast<std::int16_t>(op.attrs.dim == 0 ? 1 : 0);
        out.push_back(std::move(m));
      }
      if (op.kind == OpKind::Ge || op.kind == OpKind::Gt || op.kind == OpKind::Le || op.kind == OpKind::Lt) {  // a bound off by one
        Mutant m{"strictness of " + where(op, li) + " flipped", base};
        OpKind& k = mop(m).kind;
        k = k == OpKind::Ge ? OpKind::Gt : k == OpKind::Gt ? OpKind::Ge : k == OpKind::Le ? OpKind::Lt : OpKind::Le;
        out.push_back(std::move(m));
      }
      if (op.kind == OpKind::AllToAll && op.attrs.shape != kNoIndex && base.shapes[op.attrs.shape].size() >= 2) {  // one piece moved
        Mutant m{"split sizes of " + where(op, li) + " skewed by one", base};
        auto& sizes = m.p.shapes[op.attrs.shape];
        sizes[0] = m.p.exprs.add(sizes[0], m.p.exprs.constant(1));
        sizes[1] = m.p.exprs.sub(sizes[1], m.p.exprs.constant(1));
        out.push_back(std::move(m));
      }
      if (op.kind == OpKind::Slice || op.kind == OpKind::Arange) {  // the window (or the positions) moves by one
        ExprId start = base.size_attr(op, "start"), end = base.size_attr(op, "end");
        if (end >= 0) {
          Mutant m{"offset of " + where(op, li) + " shifted by one", base};
          ExprId one = m.p.exprs.constant(1);
          m.p.set_size_attr(mop(m), "start", start >= 0 ? m.p.exprs.add(start, one) : one);
          m.p.set_size_attr(mop(m), "end", m.p.exprs.add(end, one));
          out.push_back(std::move(m));
        }
      }
      if (op.kind == OpKind::Pad) {  // one more element before, one fewer after (the same size)
        ExprId before = base.size_attr(op, "before"), after = base.size_attr(op, "after");
        if (after >= 0 && !(base.exprs.is_const(after) && base.exprs.value(after) == 0)) {
          Mutant m{"padding of " + where(op, li) + " shifted by one", base};
          ExprId one = m.p.exprs.constant(1);
          m.p.set_size_attr(mop(m), "before", before >= 0 ? m.p.exprs.add(before, one) : one);
          m.p.set_size_attr(mop(m), "after", m.p.exprs.sub(after, one));
          out.push_back(std::move(m));
        }
      }
      if (op.kind == OpKind::Concat && op.n_in >= 2 && base.ins(op)[0] != base.ins(op)[1]) {
        Mutant m{"first two blocks of " + where(op, li) + " swapped", base};
        std::swap(m.p.operands[op.first], m.p.operands[op.first + 1]);
        out.push_back(std::move(m));
      }
      if (is_collective(op) && op.n_in == 1 && op.n_out == 1 && op.attrs.handle < 0) {
        Mutant m{where(op, li) + " dropped", base};
        NameId in = base.ins(op)[0], o = base.outs(op)[0];
        std::vector<Op>& mops = m.p.*kLists[li];
        mops.erase(mops.begin() + static_cast<std::ptrdiff_t>(oi));
        if (&mops == &m.p.ops)  // per-rank programs: the op ranges after it move down by one
          for (auto& rp : m.p.programs) {
            if (oi >= rp.first_op && oi < rp.first_op + rp.n_ops) --rp.n_ops;
            else if (rp.first_op > oi) --rp.first_op;
          }
        if (o != in) rename_reads(m.p, li, oi, o, in);
        out.push_back(std::move(m));
      }
      if (is_collective(op) && std::popcount(op.attrs.axes) == 1 && base.mesh.size() >= 2)
        for (std::size_t a = 0; a < base.mesh.size(); ++a) {
          if (op.attrs.axes & (1u << a)) continue;
          Mutant m{fmt::format("axis of {} swapped for {}", where(op, li), base.mesh[a].name), base};
          mop(m).attrs.axes = 1u << a;
          out.push_back(std::move(m));
        }
      if (op.kind == OpKind::RingRotate || op.kind == OpKind::LoadBalance) {  // the ring the other way, the zigzag undone (issue 23)
        Mutant m{"direction of " + where(op, li) + " flipped", base};
        std::uint8_t& c = mop(m).attrs.choice;
        c = c == 1 ? 0 : 1;
        out.push_back(std::move(m));
      }
      if (op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter) {  // sum <-> avg (a gradient N times off)
        Mutant m{"reduce op of " + where(op, li) + " swapped", base};
        ReduceOp& r = mop(m).attrs.rop;
        r = r == ReduceOp::Sum ? ReduceOp::Avg : ReduceOp::Sum;
        out.push_back(std::move(m));
      }
    }
  }
  return out;
}

bool has_error(const std::vector<Diagnostic>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const Diagnostic& d) { return d.severity == Severity::Error; });
}

// What the type checks of `spmdcheck check` report: the spatial and temporal checks, and for a training program the
// checks of its training step (backward, grad_sync: unsynced-gradient, gradient-duality, loss-scaling...).
bool types_report(const Program& p) {
  SpatialOptions so;
  so.z3_timeout_ms = 10000;
  if (has_error(check_spatial(p, so)) || has_error(check_temporal(p))) return true;
  if (p.loss >= 0 && (p.train || p.has_backward) && !p.local_view) {  // a local-view backward is checked by value only
    try {
      TrainingCheck t = check_training(p);
      if (has_error(t.diags)) return true;
      if (t.built)
        for (const auto& d : check_temporal(t.program))
          if (d.op >= static_cast<int>(t.first_backward) && d.severity == Severity::Error) return true;
    } catch (const LoadError&) {
      return true;  // a located error, exit 2
    }
  }
  return false;
}

int reduced_runs = 0;  // value checks that ran at reduced sizes (docs/equivalence.md, "Shape reduction")

// What `spmdcheck check` reports on the program: any error. The value check runs as `check` runs it, with shape
// reduction (the programs are loaded with their sizes as variables, so every mutant is reduced as its text would be).
bool reported(const Program& p) {
  if (types_report(p)) return true;
  EquivResult r = check_equivalence(p);
  reduced_runs += !r.reduction.empty();
  return r.verdict == EquivVerdict::Mismatch;
}

// Independent draws: any of three other seeds finds a difference (or the run fails). For a training program also
// its synchronized gradients against finite differences of the spec's forward (tests/equiv_train.h), which holds
// whether or not the mutant's training step type-checks (the value check compares gradients only when it does).
bool changes_values(const Program& p) {
  for (std::uint64_t seed : {101, 202, 303}) {
    EquivOptions o;
    o.seed = seed;
    o.reduce = false;  // the ground truth runs at the declared sizes
    if (check_equivalence(p, o).verdict == EquivVerdict::Mismatch) return true;
  }
  // 8 elements of each gradient, spread evenly: a mutant that changes a gradient changes many of its elements
  if (!(p.has_spec && p.loss >= 0 && (p.train || p.has_backward))) return false;
  test::Truth tr = test::gradient_truth(p, 8);
  if (tr.differs && std::getenv("SPMD_MUTATION_DEBUG")) std::cout << "  ground truth: " << tr.what << "\n";
  return tr.differs;
}

bool is_fixed(const fs::path& f) {
  std::string n = f.filename().string();
  return f.extension() == ".yaml" && (n.ends_with("_fixed.yaml") || n.ends_with("_ok.yaml"));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path a = argv[i];
    if (fs::is_directory(a)) {
      for (const auto& e : fs::recursive_directory_iterator(a))
        if (e.is_regular_file() && is_fixed(e.path())) files.push_back(e.path());
    } else {
      files.push_back(a);
    }
  }
  std::sort(files.begin(), files.end());
  int total = 0, changing = 0, caught = 0, missed = 0, equal = 0, caught_by_values = 0, bad_base = 0;
  for (const auto& f : files) {
    Program base;
    try {
      LoadOptions lo;
      lo.generalize_sizes = true;  // mutants of this program are reduced by the value check (reported())
      base = load_program_file(f.string(), lo);
      // a pipeline's batch is cut into microbatches at its declared size (the reduction is not made for pipelines)
      if (base.schedule.present) base = load_program_file(f.string());
    } catch (const LoadError& e) {
      std::cout << f.string() << ":" << e.loc.line << ":" << e.loc.col << ": error: " << e.what() << "\n";
      ++bad_base;
      continue;
    }
    if (!base.has_spec) continue;
    if (reported(base)) {
      std::cout << f.string() << ": error: the fixed program itself is reported\n";
      ++bad_base;
      continue;
    }
    if (changes_values(base)) {  // the ground truth must hold on the unmutated program, or it judges nothing
      std::cout << f.string() << ": error: the ground truth finds the fixed program itself different from its spec\n";
      ++bad_base;
      continue;
    }
    int n = 0, c = 0;
    // One mutant judged: `types` says whether the checks before the value check report it (called only when needed).
    auto judge = [&](const std::string& what, bool ch, bool rep, auto&& types) {
      ++total, ++n;
      if (!ch) return void(++equal);
      ++changing;
      if (rep) {
        ++caught, ++c;
        if (!types()) ++caught_by_values;
      } else {
        ++missed;
        std::cout << f.string() << ": missed mutant: " << what << "\n";
      }
    };
    for (auto& m : mutants_of(base)) judge(m.what, changes_values(m.p), reported(m.p), [&] { return types_report(m.p); });
    // A pipeline: mutants of the lowered per-rank programs, checked as the value check and the temporal checks see them.
    if (base.schedule.present && !base.schedule.stages.empty()) {
      equiv_detail::TrainingPair tp = equiv_detail::pipeline_pair(base);
      if (!tp.ok) {
        std::cout << f.string() << ": error: the pipeline cannot be lowered: " << tp.why << "\n";
        ++bad_base;
        continue;
      }
      for (auto& m : lowered_mutants(tp)) {
        bool ch = false;
        for (std::uint64_t seed : {101, 202, 303}) {
          EquivOptions o;
          o.seed = seed;
          ch |= check_built_pair(m.tp, o).verdict == EquivVerdict::Mismatch;
        }
        bool temporal = has_error(check_temporal(m.tp.program));
        judge(m.what, ch, temporal || check_built_pair(m.tp).verdict == EquivVerdict::Mismatch, [&] { return temporal; });
      }
    }
    std::cout << f.filename().string() << ": " << n << " mutants, " << c << " value-changing reported\n";
  }
  std::cout << fmt::format(
      "{} files, {} mutants: {} change values, {} of them reported ({} only by the value check), {} missed; {} leave every output equal; {} value "
      "checks ran at reduced sizes\n",
      files.size(), total, changing, caught, caught_by_values, missed, equal, reduced_runs);
  return missed || bad_base ? 1 : 0;
}
