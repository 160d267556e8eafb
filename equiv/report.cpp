// equiv/report.cpp - what a difference between plan and spec is reported as: the compared outputs (compare), and for
// the first that differs, a counterexample and the first plan op that goes wrong (report_difference): from a run
// recording every value, or, when that is too large, from the stage cuts and a run recording the ops around the point
// that differs (docs/equivalence.md, "What a mismatch says").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "equiv/equiv_impl.h"
#include "interp/num.h"
#include "interp/runner.h"

namespace spmd::equiv_detail {

namespace {

// Every value the spec computed in run `r` and both sides of the compared link are real numbers (no inf or
// NaN): a counterexample whose inputs divide by zero somewhere shows no real difference.
bool stays_real(Setup& s, Run& r, const Link& l) {
  auto finite = [](const Tensor& t) { return std::all_of(t.data.begin(), t.data.end(), [](const Num& e) { return std::isfinite(e.d); }); };
  for (const auto& op : r.model_vals)
    for (const auto& t : op)
      if (!finite(t)) return false;
  Assembled a = assemble(s.p, *r.plan, l.plan, l.pl, s.oo);
  return (!a.ok || finite(a.t)) && finite(r.model->at(0, l.spec).t);
}

// A difference found in trial `ts`: value-mismatch (the doubles differ: a counterexample, the first plan op that goes
// wrong), or value-unproved (only the field lanes differ).
// The axes on which the plan's output of `l`, read as a pending sum there, equals the spec's value ("" when none
// does, or the run fails): a missing reduction.
std::string pending_axes(Setup& s, const Link& l, std::uint64_t ts, std::int64_t& work) {
  int w = s.plan_last[static_cast<std::size_t>(l.plan)];
  if (w < 0) return {};
  std::unique_ptr<Run> rec;
  try {
    rec = run_once(s, ts, false, true, work);
  } catch (const BudgetError&) {
    return {};
  }
  if (!rec->failure.empty() || static_cast<std::size_t>(w) >= rec->plan_vals.size()) return {};
  auto outs = s.p.outs(s.p.ops[static_cast<std::size_t>(w)]);
  const Val& want = rec->model->at(0, l.spec);
  if (!want.defined) return {};
  for (std::size_t k = 0; k < outs.size() && k < rec->plan_vals[static_cast<std::size_t>(w)].size(); ++k) {
    if (outs[k] != l.plan) continue;
    const auto& ranks = rec->plan_vals[static_cast<std::size_t>(w)][k];
    OracleOptions quiet = s.oo;
    quiet.rtol = kRtol, quiet.atol = kAtol;
    std::string found;
    any_reading(s, ranks, true, quiet, [&](const Tensor& t, const Placements& pl) {
      std::string axes;
      for (std::size_t a = 0; a < s.p.mesh.size(); ++a)
        if (pl[a].is_p()) axes += (axes.empty() ? "" : ", ") + s.p.mesh[a].name;
      if (axes.empty() || t.shape != want.t.shape || !same_value(t, want.t)) return false;
      found = axes;
      return true;
    });
    if (!found.empty()) return found;
  }
  return {};
}

}  // namespace

std::optional<Difference> compare(Setup& s, Run& run, const std::vector<Link>& links, std::uint64_t& degree) {
  degree = 0;
  // The first output that differs in the lanes only (its doubles agree): a later output whose doubles differ too is
  // a counterexample, and wins (a deep step's loss can agree to rounding while a gradient shows the bug).
  std::optional<Difference> lanes_only;
  for (std::size_t k = 0; k < links.size(); ++k) {
    const Link& l = links[k];
    const std::string& name = s.p.name(l.plan);
    const Val& g = run.model->at(0, l.spec);
    const Assembled a = assemble(s.p, *run.plan, l.plan, l.pl, s.oo, l.held);  // (const: reading a shared buffer never copies it)
    Difference d;
    d.link = k;
    if (!g.defined) return d.what = "the spec never computes " + s.p.name(l.spec), d;
    if (!a.ok) {
      if (a.undefined) continue;
      d.kind = a.disagree ? DiffKind::Real : DiffKind::Form;  // ranks holding different values: a counterexample, located
      return d.what = "the plan's " + name + " cannot be assembled by its placement: " + a.problem, d;
    }
    std::int64_t e = first_real_difference(a.t, g.t);
    if (e == -2)
      return d.what = fmt::format("the plan's {} assembles to shape {} but the spec's {} has shape {}", name, shape_text(a.t.shape), s.p.name(l.spec),
                                  shape_text(g.t.shape)),
             d;
    d.kind = DiffKind::Real;
    if (e < 0) e = first_lane_difference(a.t, g.t), d.kind = DiffKind::Lanes;
    if (e >= 0) {
      d.what = fmt::format("{}{} is {} in the plan and {} in the spec", name, index_text(g.t.shape, e),
                           num_text(dbl(a.t.data[static_cast<std::size_t>(e)])), num_text(dbl(g.t.data[static_cast<std::size_t>(e)])));
      if (d.kind == DiffKind::Real) return d;
      if (!lanes_only) lanes_only = std::move(d);
      continue;
    }
    for (std::size_t i = 0; i < a.t.data.size(); ++i) degree = std::max<std::uint64_t>(degree, std::uint64_t{a.t.data[i].deg} + g.t.data[i].deg);
  }
  return lanes_only;
}

EquivResult& report_difference(Setup& s, const std::vector<Link>& links, const Difference& diff, std::uint64_t ts, std::int64_t& work,
                               EquivResult& res, const CutCulprit& cut, bool large, const std::vector<char>* held_off) {
  const Program& p = s.p;
  const Link& bad = links[diff.link];
  Diagnostic d;
  d.id = CheckId::ValueMismatch;
  d.loc = bad.loc;
  d.tensor = p.name(bad.plan);
  if (diff.kind == DiffKind::Form) {
    d.message = diff.what;
    // An output the ranks hold as summands of the spec's value (a row-parallel layer without its all-reduce): the
    // reduction is missing after the op that wrote it, which is where the diagnostic goes.
    if (std::string axes = pending_axes(s, bad, ts, work); !axes.empty()) {
      int w = s.plan_last[static_cast<std::size_t>(bad.plan)];
      const Op& op = p.ops[static_cast<std::size_t>(w)];
      d.loc = op.loc;
      d.op = w;
      d.message =
          fmt::format("{}; the ranks hold summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing after {}",
                      diff.what, p.name(bad.spec), axes, axes, op_text(s, false, op));
      if (int m = s.model_last[static_cast<std::size_t>(bad.spec)]; m >= 0)
        d.notes.push_back({s.model.ops[static_cast<std::size_t>(m)].loc,
                           "the spec computes it whole here: " + op_text(s, true, s.model.ops[static_cast<std::size_t>(m)])});
      d.notes.push_back({bad.loc, fmt::format("output {} is compared here, read by its placement", p.name(bad.plan))});
    }
    res.verdict = EquivVerdict::Mismatch;
    res.message = d.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  // A counterexample with small integer inputs when one exists, else the drawn reals; then where it goes wrong.
  std::unique_ptr<Run> rec;
  std::optional<Difference> rdiff;
  // (a run holding an eighth of the byte budget at its peak holds far more in all: with a stage cut to start from,
  // recording every value is not tried)
  bool ints = false, too_large = large && cut.op >= 0;
  std::uint64_t degree = 0;
  if (!too_large) {
    try {
      if (diff.kind == DiffKind::Real) {
        rec = run_once(s, ts, true, true, work);
        if (rec->failure.empty()) rdiff = compare(s, *rec, links, degree);
        // small integers can hit a zero divisor (x / 0, log 0): such a run has no real value, so the drawn reals
        // give the counterexample instead
        ints = rdiff && rdiff->kind == DiffKind::Real && stays_real(s, *rec, links[rdiff->link]);
      }
      if (!ints) {
        rec = run_once(s, ts, false, true, work);
        rdiff = rec->failure.empty() ? compare(s, *rec, links, degree) : std::nullopt;
      }
    } catch (const BudgetError&) {
      rec.reset(), too_large = true;  // recording every value is over the budget (a deep pipelined step)
    }
  }
  if (!rec || !rdiff) rdiff = diff, rec.reset();
  const Link& shown = links[rdiff->link];
  std::vector<std::pair<NameId, NameId>> pairs;
  for (const auto& l : links) pairs.emplace_back(l.plan, l.spec);
  // A run recording the ops of `around` only (record_around), searched from `output`; none when it fails or is too
  // large.
  auto search_around = [&](const CutCulprit& around, NameId output) {
    Culprit found;
    record_around(s, around);
    try {
      std::unique_ptr<Run> near = run_once(s, ts, false, true, work);
      if (near->failure.empty() && output >= 0) found = localize(s, *near, output, pairs);
    } catch (const BudgetError&) {
      found = Culprit{};
    }
    s.record_plan.clear(), s.record_model.clear();
    return found;
  };
  Culprit c;
  if (rec) {
    try {
      c = localize(s, *rec, shown.plan, pairs);
    } catch (const BudgetError&) {  // reading the recorded values by every placement is too large: no place named
      c = Culprit{};
    }
  }
  // Recording every value is over the budget: the trial's run with every stage cut says where it first went wrong, and
  // a run recording the ops around that point only searches there.
  if (too_large && cut.op >= 0) {
    c = search_around(cut, cut.plan);
    if (c.op < 0) {  // the point itself, and the ops on its way
      c.op = cut.op, c.named = cut.spec, c.by_cuts = true, c.way = cut.way;
      if (cut.spec >= 0) c.spec_op = s.model_last[static_cast<std::size_t>(cut.spec)];
    }
  } else if (too_large && held_off && s.plan_last[static_cast<std::size_t>(bad.plan)] >= 0) {
    // Every stage cut point held in the trial's run: the difference arises on the way from them to the output (a
    // gradient all-reduced before its last microbatch's backward was added), and those ops, recorded alone, are searched.
    c = search_around(way_to(s, *held_off, bad.plan, bad.spec), bad.plan);
  }
  // The compared output held as summands of the spec's value (ranks that disagree on an R output: a row-parallel
  // layer, a norm's weight gradient without its all-reduce): the reduction is missing after the op that wrote it,
  // which is the op to name, whatever came before it.
  std::string out_axes;
  // (pending_axes records every value too: over the budget when the search's run was)
  if (diff.kind == DiffKind::Real && c.pending_in < 0 && !too_large) out_axes = pending_axes(s, shown, ts, work);
  if (!out_axes.empty()) {
    c.op = s.plan_last[static_cast<std::size_t>(shown.plan)], c.named = -1, c.frontier = -1;
    if (int m = s.model_last[static_cast<std::size_t>(shown.spec)]; m >= 0) c.spec_op = m;
  }
  if (diff.kind == DiffKind::Lanes) {
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.message = fmt::format(
        "equivalence not proved: the plan equals the spec in real numbers on the drawn inputs, but not in exact arithmetic ({}); the number domain "
        "lacks an "
        "identity the plan relies on (docs/equivalence.md)",
        rdiff->what);
    if (c.op >= 0) {
      const Op& op = p.ops[static_cast<std::size_t>(c.op)];
      d.notes.push_back({op.loc, "the first plan op whose exact value matches no spec value: " + op_text(s, false, op)});
    }
    res.verdict = EquivVerdict::Unknown;
    res.message = d.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  std::string cex;
  if (rec)
    for (const auto& t : p.tensors) {
      if (s.pair && std::any_of(s.pair->microbatches.begin(), s.pair->microbatches.end(), [&](const auto& m) { return m.name == t.name; })) continue;
      const Val& v = rec->model->at(0, t.name);
      cex += fmt::format("{}{} = {}", cex.empty() ? "" : "; ", p.name(t.name), values_text(v.t));
    }
  res.verdict = EquivVerdict::Mismatch;
  if (c.op >= 0) {
    const Op& op = p.ops[static_cast<std::size_t>(c.op)];
    d.loc = op.loc;
    d.op = c.op;
    d.tensor = p.outs(op).empty() ? d.tensor : p.name(p.outs(op)[0]);
    d.message =
        fmt::format("the plan's output differs from the spec: {}; the first plan op that goes wrong is {}, {}", rdiff->what, op_text(s, false, op),
                    c.named >= 0 ? "whose value differs from the spec's " + p.name(c.named) + " by every placement"
                                 : std::string("whose value matches no value of the spec"));
    if (c.pending_in >= 0)
      d.message += fmt::format(
          "; it reads {}, which holds summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing before it",
          p.name(c.pending_in), p.name(c.pending_spec), c.pending_axes, c.pending_axes);
    // The compared output's writer holding summands of the spec's value (ranks that disagree on an R output, a
    // row-parallel layer without its all-reduce): the reduction is missing after it.
    if (!out_axes.empty())
      d.message +=
          fmt::format("; the ranks hold summands of the spec's {} (a pending sum over {}): a reduction (AllReduce over {}) is missing after {}",
                      p.name(shown.spec), out_axes, out_axes, op_text(s, false, op));
    // an op reading a batch input that the schedule's `batch: order` hands out otherwise (a dropped or shuffled microbatch)
    if (s.pair)
      for (NameId n : p.ins(op))
        for (const auto& mb : s.pair->microbatches)
          if (mb.name == n && mb.order_loc.line) {
            d.notes.push_back(
                {mb.order_loc, fmt::format("it reads the microbatches of {}, and the schedule's `batch:` {}", p.name(mb.source), mb.order_text)});
            break;
          }
    if (c.spec_op >= 0) {
      const Op& mo = s.model.ops[static_cast<std::size_t>(c.spec_op)];
      d.notes.push_back({mo.loc, (out_axes.empty() ? "the spec computes it here: " : "the spec computes it whole here: ") + op_text(s, true, mo)});
    }
    if (c.by_cuts) {
      if (!c.way.empty())
        d.message +=
            fmt::format(", or one of the {} op{} that compute it from values equal to the spec's", c.way.size(), c.way.size() == 1 ? "" : "s");
      d.message += " (the first lineage point that differs; recording every value to search further is over the byte budget)";
      constexpr std::size_t kShown = 8;
      for (std::size_t k = 0; k < c.way.size() && k < kShown; ++k) {
        const Op& wo = p.ops[static_cast<std::size_t>(c.way[k])];
        d.notes.push_back({wo.loc, fmt::format("on the way: {}", op_text(s, false, wo))});
      }
      if (c.way.size() > kShown) d.notes.back().message += fmt::format(" (and {} more)", c.way.size() - kShown);
    } else if (c.frontier >= 0 && c.pending_in < 0) {  // (a pending input already says where: the reduction before op)
      const Op& fo = p.ops[static_cast<std::size_t>(c.frontier)];
      d.notes.push_back(
          {fo.loc, fmt::format("the first value on the way with no counterpart in the spec is {}: the difference arises between there and line {}",
                               op_text(s, false, fo), op.loc.line)});
    }
    d.notes.push_back({shown.loc, fmt::format("output {} is compared here, read by its placement", p.name(shown.plan))});
  } else {
    d.message = "the plan's output differs from the spec: " + rdiff->what;
  }
  if (!cex.empty())
    d.notes.push_back({p.tensors.empty() ? Loc{} : p.tensors[0].loc, fmt::format("counterexample ({} inputs{}): {}", ints ? "small integer" : "drawn",
                                                                                 s.sizes.empty() ? "" : ", " + s.sizes, cex)});
  res.message = d.message;
  res.diags.push_back(std::move(d));
  return res;
}

}  // namespace spmd::equiv_detail
