// equiv/equiv.cpp - value-level equivalence of a plan and its single-device model (docs/equivalence.md).
//
// One Runner runs the model (the spec's ops, or the plan's own ops, on a mesh of ones), another the plan on the
// real mesh; the model's inputs are the plan's inputs assembled by their declared placements (the lineage), so
// both start from the same global values. Each output the spec names is assembled from the ranks by the plan's
// declared placement and compared. On a difference the runs are repeated with every op's value recorded: a plan
// op "matches" when its value, read by some placement (R, P, or S of a dim, per axis), equals some value of the
// model; the first op on the way to the differing output whose inputs match and whose own value matches nothing
// is where the plan goes wrong. One run of both programs, with the stage cuts, is equiv/run.cpp.
#include "equiv/equiv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "equiv/equiv_impl.h"
#include "equiv/pipeline.h"
#include "equiv/training.h"
#include "interp/num.h"
#include "interp/runner.h"
#include "ir/loader.h"
#include "spatial/spatial.h"

namespace spmd {
namespace {

using namespace equiv_detail;

constexpr int kMaxAttempts = 8;
constexpr int kMinIntTrials = 3;
constexpr std::int64_t kMaxRanks = 256;
// Trials of a program whose only choices by value are MoE routing (routing_only): each draws its own routing, and
// "equivalent for the drawn routings" covers the routings drawn.
constexpr int kRoutingTrials = 3;
constexpr double kLog2Target = -40;

// log2 of one trial's false-agreement probability: per lane eps = (sum over stage tags of U_t(U_t-1)/2 + 1) D / p
// (docs/equivalence.md), two independent lanes multiply.
double trial_log2_bound(std::uint64_t degree) {
  double pairs = num::uf_pairs() + 1, d = static_cast<double>(std::max<std::uint64_t>(degree, 1));
  double total = 0;
  for (int l = 0; l < kLanes; ++l) total += std::min(0.0, std::log2(pairs) + std::log2(d) - std::log2(static_cast<double>(num::prime(l))));
  return total;
}

}  // namespace

const char* equiv_verdict_name(EquivVerdict v) {
  switch (v) {
    case EquivVerdict::Equivalent:
      return "equivalent";
    case EquivVerdict::Mismatch:
      return "value-mismatch";
    case EquivVerdict::Unknown:
      return "not proved";
    case EquivVerdict::Skipped:
      return "not checked";
  }
  return "?";
}

namespace {

// Not checked, and why; a program with a spec, which claims a comparison, gets a value-unproved warning at its spec.
EquivResult not_checked(const Program& p, const std::string& why) {
  EquivResult res;
  res.verdict = EquivVerdict::Skipped;
  res.message = "equivalence not checked: " + why;
  if (p.has_spec) {
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = p.spec_loc;
    d.message = res.message;
    res.diags.push_back(std::move(d));
  }
  return res;
}


// The check of a plan/spec pair: a forward program, or (with `pending`) the training steps of equiv/training.h, whose
// `pending` names (a pending sum at their last write) are never stage cuts.
EquivResult check_pair(const Program& p, const EquivOptions& opt, const equiv_detail::TrainingPair* pending, const Reduced* red) {
  EquivResult res;
  auto skip = [&](std::string why, Loc at = {}) {
    EquivResult r = not_checked(p, why);
    r.sizes = res.sizes;
    if (at.line)
      for (auto& d : r.diags) d.loc = at;
    return r;
  };
  if (p.schedule.present) return skip("a pipeline schedule has no single-device meaning here");
  if (p.per_rank && !p.has_spec) return skip("per-rank `programs:` need a `spec:` to be compared with (they have no single-device run of their own)");
  if (p.local_view && !p.has_spec) return skip("a local-view plan needs a `spec:` to be compared with");
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list)
      if (!has_value_kernel(p, *list, op)) return skip(fmt::format("{} (line {}) has no value semantics", op_name(op.kind), op.loc.line));
  for (const auto& t : p.tensors)
    for (std::size_t a = 0; a < p.mesh.size(); ++a)
      if (t.placement[a].is_v())
        return skip(
            fmt::format("input {} is V over {}: per-rank values with no single-device value to compare with", p.name(t.name), p.mesh[a].name));
  for (const auto& op : p.ops)
    if (op.kind == OpKind::Reinterpret)
      return skip(fmt::format("Reinterpret (line {}) relabels values without the promise a comparison needs", op.loc.line));
  Program model = model_of(p);
  // Without a spec, a LossScale stating a normalization is on one device the factor it states (training.h); a training
  // pair's spec has it already.
  if (!p.has_spec && std::any_of(p.ops.begin(), p.ops.end(), [](const Op& op) { return op.kind == OpKind::LossScale && op.attrs.axes; })) {
    SpatialTypes st;
    SpatialOptions so;
    so.types = &st;
    auto ds = check_spatial(p, so);
    if (std::none_of(ds.begin(), ds.end(), [](const Diagnostic& d) { return d.severity == Severity::Error; }))
      equiv_detail::loss_scales_on_one_device(model, p, st);
  }
  Setup s(p, std::move(model));
  if (pending) s.plan_bwd = pending->plan_bwd, s.model_bwd = pending->spec_bwd, s.pair = pending;
  s.oo.seed = opt.seed;
  if (opt.max_bytes > 0) s.oo.max_bytes = opt.max_bytes;
  s.oo.max_work = opt.max_work;
  // Ranks cost what their values and ops cost, which the byte and work budgets bound before anything is allocated
  // (the per-rank slot table included): a reduced pipeline mesh (DeepSeek-V3-671B: dp 2 x tp 8 x pp 8) may have more
  // ranks than the numeric oracle's small instantiations.
  s.oo.max_ranks = kMaxRanks;
  std::string covers;  // with a reduction: what the verdict covers
  if (red) {
    s.inst.vars = red->r.vars;
    for (const auto& ax : p.mesh) s.inst.mesh.push_back(p.exprs.eval(ax.size, s.inst.vars).value_or(1));
    if (red->r.mesh.size() == s.inst.mesh.size() && red->r.mesh != s.inst.mesh) s.value_mesh = std::exchange(s.inst.mesh, red->r.mesh);
    s.plan_real = &red->plan_real;
    s.model_real = &red->model_real;
    std::string declared;
    for (std::size_t k = 0; k < p.vars.size(); ++k)
      if (p.vars[k].general) declared += fmt::format("{}{} = {}", declared.empty() ? "" : ", ", p.vars[k].name, p.vars[k].in.front());
    std::string symbolic;
    for (std::size_t k = 0; k < p.vars.size(); ++k)
      if (!p.vars[k].general) symbolic += fmt::format("{}{} = {}", symbolic.empty() ? "" : ", ", p.vars[k].name, s.inst.vars[k]);
    covers = fmt::format(" at the declared sizes {}{} (run at reduced sizes that keep every partition: {}", declared,
                         symbolic.empty() ? "" : " and " + symbolic, red->r.text);
    for (const auto& k : red->r.kept) covers += "; kept " + k;
    covers += ")";
    std::int64_t ranks = 1;
    for (auto m : s.inst.mesh) ranks *= m;
    if (ranks > s.oo.max_ranks) return skip(fmt::format("the mesh has {} ranks, more than the interpreter's {}", ranks, s.oo.max_ranks));
    for (const auto& t : p.tensors) {
      std::int64_t elems = 1;
      for (ExprId e : t.shape) elems = std::min<std::int64_t>(elems * p.exprs.eval(e, s.inst.vars).value_or(1), s.oo.max_elements + 1);
      if (elems > s.oo.max_elements)
        return skip(fmt::format("{} has more than {} elements even at the reduced sizes ({})", p.name(t.name), s.oo.max_elements, red->r.text));
    }
  } else {
    auto insts = instantiations(p, s.oo);
    if (insts.empty()) return skip("no small instantiation of the sizes fits the interpreter");
    s.inst = insts[opt.seed % insts.size()];
  }
  for (std::size_t k = 0; k < p.vars.size(); ++k) s.sizes += (k ? ", " : "") + p.vars[k].name + " = " + std::to_string(s.inst.vars[k]);
  res.sizes = s.sizes;
  res.reduction = red ? red->r.text : "";
  // A shape-only pre-run of the model (integer inputs 0) learns the ranges integer inputs must take: the kernels
  // that read one as an index note it, so the run ends after the last op reading a declared integer input (none:
  // no run). A pipeline's stage cuts keep the spec's values, chosen by size: the sizes the types give at the reduced
  // sizes (prepare_pipeline_reduction), else the pre-run records them and runs to the end. A pipelined pair whose
  // integer inputs are read only where index_extent gives the extent from the input shapes takes the ranges from the
  // types at the reduced sizes instead (the same extents the kernels note: their global shapes are those types), and
  // makes no pre-run (DeepSeek-V3-236B: the spec's forward up to the loss, 3 s before the first trial).
  s.ranges.assign(p.names.size(), -1);
  {
    const bool pipelined = pending && !pending->family.empty();
    const bool typed_elems = pipelined && red && red->model_elems.size() == p.names.size();
    std::vector<char> int_input(p.names.size(), 0);
    for (const auto& t : s.model.tensors) int_input[static_cast<std::size_t>(t.name)] = is_int(t.dtype);
    int last_int = -1;
    bool typed_ranges = typed_elems && red->model_run.size() == s.model.ops.size();
    std::vector<std::int64_t> typed(typed_ranges ? p.names.size() : 0, -1);  // (taken only when every read gives one)
    for (std::size_t oi = 0; oi < s.model.ops.size(); ++oi) {
      const Op& op = s.model.ops[oi];
      auto ins = s.model.ins(op);
      for (std::size_t k = 0; k < ins.size(); ++k) {
        auto n = static_cast<std::size_t>(ins[k]);
        if (!int_input[n]) continue;
        last_int = static_cast<int>(oi);
        if (!typed_ranges) continue;
        const std::int64_t e = index_extent(op.kind, static_cast<int>(k), red->model_run[oi]);
        typed_ranges = e >= 0;  // (else read as no index, or against no shape's extent: the pre-run decides)
        if (typed_ranges) narrow_range(typed, ins[k], e);
      }
    }
    if (typed_ranges) s.ranges = std::move(typed), last_int = -1;
    s.model_elems.assign(p.names.size(), -1);
    if (typed_elems) s.model_elems = red->model_elems;
    struct PreDone {};
    std::int64_t w0 = 0;
    Runner pre(s.model, s.inst.vars, std::vector<std::int64_t>(s.inst.mesh.size(), 1), true, s.oo, w0, s.inst.mesh);
    pre.int_range = &s.ranges;
    pre.free_dead({});
    pre.after_op = [&](int oi, std::int64_t) {
      if (pipelined && !typed_elems)
        for (NameId n : s.model.outs(s.model.ops[static_cast<std::size_t>(oi)]))
          s.model_elems[static_cast<std::size_t>(n)] = static_cast<std::int64_t>(pre.at(0, n).t.data.size());
      else if (oi >= last_int)
        throw PreDone{};
    };
    if (last_int >= 0 || (pipelined && !typed_elems)) try {
        for (const auto& t : s.model.tensors) pre.declare(t, 1, opt.seed);
        pre.run(opt.seed);
      } catch (const PreDone&) {
      } catch (const std::runtime_error&) {}
    for (auto& r : s.ranges) r = r < 0 ? 4 : std::max<std::int64_t>(r, 1);
  }
  // What is compared: the spec's outputs with the plan's, each plan output read by its declared placement.
  std::vector<Link> links;
  auto decl_of = [&](NameId n) -> const OutputDecl* {
    for (const auto& od : p.outputs)
      if (od.name == n) return &od;
    return nullptr;
  };
  if (p.has_spec) {
    for (const auto& l : p.spec_outputs) {
      Link k{l.plan, l.spec, l.loc, {}};
      if (const OutputDecl* od = decl_of(l.plan)) {
        if (od->has_placement) k.pl = od->placement;
        k.loc = od->loc;
        k.held = od->ranks;
      }
      links.push_back(k);
    }
  } else {
    for (const auto& od : p.outputs) links.push_back({od.name, od.name, od.loc, od.has_placement ? od.placement : Placements{}, od.ranks});
  }
  if (links.empty()) return skip("nothing to compare (no outputs)");
  s.plan_keep.assign(p.names.size(), 0);
  s.model_keep.assign(p.names.size(), 0);
  for (const auto& l : links) s.plan_keep[static_cast<std::size_t>(l.plan)] = s.model_keep[static_cast<std::size_t>(l.spec)] = 1;
  // Stage cut points: names the plan and the spec both write (the spec's name through lineage:), neither a declared
  // tensor nor a compared output, nor a pending sum in the plan; each is cut at its last write in each program
  // (a gradient accumulated in place is cut once it is whole).
  {
    s.plan_last.assign(p.names.size(), -1);
    s.model_last.assign(p.names.size(), -1);
    for (std::size_t oi = 0; oi < p.ops.size(); ++oi)
      for (NameId n : p.outs(p.ops[oi])) s.plan_last[static_cast<std::size_t>(n)] = static_cast<int>(oi);
    s.plan_final = equiv_detail::final_writes(p);
    for (std::size_t oi = 0; oi < s.model.ops.size(); ++oi)
      for (NameId n : s.model.outs(s.model.ops[oi])) s.model_last[static_cast<std::size_t>(n)] = static_cast<int>(oi);
    s.plan_cut.assign(p.names.size(), -1);
    s.model_cut.assign(p.names.size(), -1);
    std::vector<char> excluded(p.names.size(), 0);
    for (const auto& t : p.tensors) excluded[static_cast<std::size_t>(t.name)] = 1;
    for (const auto& l : links) excluded[static_cast<std::size_t>(l.plan)] = excluded[static_cast<std::size_t>(l.spec)] = 1;
    if (pending)
      for (std::size_t n = 0; n < p.names.size() && n < pending->pending.size(); ++n) excluded[n] |= pending->pending[n];
    std::vector<NameId> spec_of(p.names.size());
    for (std::size_t n = 0; n < p.names.size(); ++n) spec_of[n] = static_cast<NameId>(n);
    for (const auto& l : p.lineage) spec_of[static_cast<std::size_t>(l.plan)] = l.spec;
    for (std::size_t n = 0; n < p.names.size() && p.has_spec; ++n) {
      auto m = static_cast<std::size_t>(spec_of[n]);
      if (s.plan_last[n] < 0 || s.model_last[m] < 0 || excluded[n] || excluded[m] || s.model_cut[m] >= 0) continue;
      s.plan_cut[n] = s.model_cut[m] = s.n_cuts++;
    }
    s.cut_mb.assign(static_cast<std::size_t>(s.n_cuts), 0);
    if (p.has_spec && pending && !pending->family.empty()) pipeline_cuts(s, *pending, excluded, spec_of);
    s.cut_off.assign(static_cast<std::size_t>(s.n_cuts), 0);
  }

  std::int64_t work = 0;
  auto located_failure = [&](Run& r) {
    // A run failing at reduced sizes means the reduction missed a shape relation the program relies on (a value
    // with a type error has none to see, a local-view plan is not typed): the check is then made as declared, where
    // a plan that fails while the spec runs is a finding.
    if (red) return red->run_failed = true, skip(fmt::format("the run fails at the reduced sizes {} ({})", s.sizes, r.failure));
    Diagnostic d;
    d.id = CheckId::ValueMismatch;
    if (!r.plan_failed) {  // the spec itself cannot run: an error in the model, not a counterexample
      d.id = CheckId::ShapeMismatch;
      const auto& list = s.model.ops;
      d.loc = r.failed_op >= 0 && static_cast<std::size_t>(r.failed_op) < list.size() ? list[static_cast<std::size_t>(r.failed_op)].loc : p.spec_loc;
      d.message = r.failure + " (the spec must run on one device with the declared global shapes)";
      res.verdict = EquivVerdict::Skipped;
      res.message = d.message;
      res.diags.push_back(std::move(d));
      return res;
    }
    const auto& list = r.plan_failed ? p.ops : s.model.ops;
    d.loc = r.failed_op >= 0 && static_cast<std::size_t>(r.failed_op) < list.size() ? list[static_cast<std::size_t>(r.failed_op)].loc : p.spec_loc;
    d.op = r.plan_failed ? r.failed_op : -1;
    d.message = r.failure;
    res.verdict = EquivVerdict::Mismatch;
    res.message = r.failure;
    res.diags.push_back(std::move(d));
    return res;
  };
  // An explicit lineage pair must fit: some placement reads the plan's value with the spec's shape.
  if (!p.lineage.empty()) {
    std::unique_ptr<Run> rec;
    try {
      rec = run_once(s, opt.seed, false, true, work);
    } catch (const BudgetError& e) {
      return skip(e.what(), e.loc);
    }
    if (!rec->failure.empty()) return located_failure(*rec);
    for (const auto& l : p.lineage) {
      const Val& g = rec->model->at(0, l.spec);
      int w = s.plan_last[static_cast<std::size_t>(l.plan)];
      if (!g.defined || w < 0) continue;  // an input, or a name the loader already checked
      const Op& op = p.ops[static_cast<std::size_t>(w)];
      std::size_t k = 0;
      while (k < op.n_out && p.outs(op)[k] != l.plan) ++k;
      const auto& ranks = rec->plan_vals[static_cast<std::size_t>(w)][k];
      bool fits = false;
      try {
        fits = any_reading(s, ranks, true, s.oo, [&](const Tensor& t) { return t.shape == g.t.shape; });
      } catch (const BudgetError& e) {
        return skip(e.what(), e.loc);
      }
      if (fits) continue;
      Diagnostic d;
      d.id = CheckId::ShapeMismatch;
      d.loc = l.loc;
      d.tensor = p.name(l.plan);
      d.message = fmt::format("lineage {} -> {}: the plan's {} (shape {} on rank 0) cannot be read as the spec's {} (shape {}) by any placement",
                              p.name(l.plan), p.name(l.spec), p.name(l.plan), shape_text(ranks[0].t.shape), p.name(l.spec), shape_text(g.t.shape));
      d.notes.push_back({op.loc, "the plan computes " + p.name(l.plan) + " here: " + op_text(p, op)});
      res.verdict = EquivVerdict::Skipped;
      res.message = d.message;
      res.diags.push_back(std::move(d));
      return res;
    }
  }
  // Trials: each draws fresh primes, random functions and inputs; the error bound of agreeing trials multiplies.
  // A trial whose field arithmetic hit a zero divisor does not count.
  struct Tally {
    double log2_bound = 0;  // log2 of the probability that every agreeing trial agreed by chance
    int trials = 0;
    bool staged = false;
    int points = 0;  // the lineage points verified in every staged trial
    std::uint64_t max_degree = 0, max_uf = 0;
    const Op* choice = nullptr;  // a choice by value: static (routing, max/min), or met by a mask of float data in a run
    bool routing = false;        // every choice met is MoE routing (routing_only, and no other in the runs)
  } tally;
  tally.choice = value_choice(p);
  tally.routing = tally.choice && routing_only(p);
  // A pipeline's integer inputs cut into microbatches (labels, ids): the verdict holds for the drawn values, and a
  // shuffled or dropped microbatch of few small labels can leave one draw unchanged; three draws at least.
  int min_trials = 1;
  // At reduced sizes integer inputs have fewer elements and a smaller range, so a draw that hides a difference (every
  // id alike, keys equal at every position) is likelier: three draws at least there too.
  if (red && std::any_of(p.tensors.begin(), p.tensors.end(), [](const TensorDecl& t) { return is_int(t.dtype); })) min_trials = kMinIntTrials;
  if (s.pair)
    for (const auto& mb : s.pair->microbatches)
      for (const auto& t : p.tensors)
        if (t.name == mb.name && is_int(t.dtype)) min_trials = kMinIntTrials;
  if (tally.routing) min_trials = std::max(min_trials, kRoutingTrials);
  // One trial on the calling thread (its lanes, its allocation limits) with the setup `ss` (its cut switches) and the
  // work counter `w`: what the tally and the verdict need, none of the run's values (freed on that thread).
  struct Outcome {
    std::uint64_t ts = 0;
    std::optional<std::pair<std::string, Loc>> budget;  // a BudgetError: too large to run
    bool budget_split = false;  // that error was the bytes held at once, by a run whose spec ran beside its plan
    std::exception_ptr error;                           // any other exception, rethrown when the trial is taken
    Run failed;                                         // a failed run's failure, failed_op and plan_failed
    bool field_failed = false, sets_full = false;
    std::optional<Difference> diff;
    int points = 0;  // the lineage points verified (0: none)
    CutCulprit cut;  // where the run with every cut first went wrong (for a difference whose recording is too large)
    std::optional<std::vector<char>> held_off;  // the cuts of a run whose every cut point held (the difference is past them)
    int plan_choice = -1, model_choice = -1;
    std::uint64_t degree = 0, uf = 0;
    double log2 = 0;
    std::int64_t peak = 0, used = 0;  // the most bytes of values live at once, the work it took
  };
  // The run without cuts (its difference, when it runs, into `into`), and what an outcome takes from a run: its
  // failure, the field arithmetic's, the choices by value.
  auto run_uncut = [&](Setup& su, std::uint64_t ts, std::int64_t& w, Outcome& into) {
    num::clear_failed();
    std::unique_ptr<Run> r = run_once(su, ts, false, false, w);
    if (r->failure.empty() && !num::trial_failed()) into.diff = compare(su, *r, links, into.degree);
    return r;
  };
  auto read_run = [](const Run& r, Outcome& into) {
    into.failed.failure = r.failure, into.failed.failed_op = r.failed_op, into.failed.plan_failed = r.plan_failed;
    into.field_failed = num::trial_failed();
    if (r.failure.empty()) into.plan_choice = r.plan->inexact_choice, into.model_choice = r.model->inexact_choice;
  };
  // Whether a run without cuts (read into `u`) shows a real difference: the verdict, whatever the cuts say (the doubles
  // do not depend on them).
  auto real_difference = [](const Outcome& u) {
    return !u.error && u.failed.failure.empty() && !u.field_failed && u.diff && u.diff->kind == DiffKind::Real;
  };
  // The trial's outcome `o` from such a run's `u` (the trial's work: from `w0` down to `w`).
  auto take_real = [](Outcome& o, Outcome& u, std::int64_t w0, std::int64_t w) {
    o.diff = std::move(u.diff), o.degree = u.degree;
    o.plan_choice = u.plan_choice, o.model_choice = u.model_choice;
    o.uf = num::uf_evaluations(), o.log2 = trial_log2_bound(o.degree);
    o.peak = peak_bytes();
    o.used = w0 - w;
    return std::move(o);
  };
  // `alone`: no other trial runs at once, so a run without cuts may go on a second thread (below).
  // `split`: its runs may run the spec beside the plan (Setup::split).
  auto trial_with = [&](Setup& ss, std::uint64_t ts, bool sets, std::int64_t& w, bool alone, bool split) {
    Outcome o;
    o.ts = ts;
    const std::int64_t w0 = w;
    ss.split_ran = false;
    try {
      num::Lanes guard({ts, sets});
      reset_peak_bytes();
      ss.split = split;
      std::unique_ptr<Run> run;
      // With stage cuts first; a cut that does not hold (or a difference in the lanes) is decided without them. A
      // point found not to hold while the plan ran (a per-microbatch loss, not a part of the spec's whole-batch one)
      // is left uncut and the run is made once more with the others first.
      std::fill(ss.cut_off.begin(), ss.cut_off.end(), 0);
      run = run_once(ss, ts, false, false, w, true);
      // A run without cuts on a second thread while the cuts are tried again (a trial alone): a wrong plan fails the
      // cuts again, and that run's real difference is the verdict (anything else it gives is not taken: the run is
      // made here as before, so a verdict's error bound counts this thread's evaluations only). Its values are freed
      // on its thread: each thread counts the bytes it holds.
      Outcome ahead;
      std::optional<std::thread> ahead_th;
      std::optional<Setup> ahead_s;  // its own setup, as a paired trial's
      std::int64_t ahead_w = w;
      const std::int64_t ahead_w0 = w;
      if (run->failure.empty() && !num::trial_failed() && run->first_failed_cut >= 0) {
        o.cut = first_cut_failure(ss, *run);
        ss.cut_off[static_cast<std::size_t>(run->first_failed_cut)] = 1;
        num::clear_failed();
        if (alone && opt.parallel && 2 * peak_bytes() <= s.oo.max_bytes) {  // (two runs at once: both within the budget)
          run.reset();
          ahead_s.emplace(ss);
          ahead_s->split = false;  // (one thread each: this one and the retry beside it)
          try {
            ahead_th.emplace([&, ts, sets] {
              try {
                num::Lanes g({ts, sets});
                read_run(*run_uncut(*ahead_s, ts, ahead_w, ahead), ahead);
              } catch (...) {
                ahead.error = std::current_exception();
              }
            });
          } catch (const std::system_error&) {  // no second thread: as before
          }
        }
        if (!ahead_th) {
          // One run at a time: the run without cuts first. A real difference there is the verdict (the doubles do not
          // depend on the cuts, so the cuts would fail again and this run decide); anything else, the cuts are tried
          // again as before. A wrong step is found one run sooner.
          run.reset();
          Outcome first;
          const std::vector<std::uint64_t> evals = num::tag_evaluations();  // (put back when this run is not taken)
          std::unique_ptr<Run> uncut = run_uncut(ss, ts, w, first);
          read_run(*uncut, first);
          uncut.reset();
          if (real_difference(first)) return take_real(o, first, w0, w);
          num::clear_failed();
          num::restore_evaluations(evals);
        }
        std::unique_ptr<Run> again;
        if (ahead_th) ss.split = false;  // (the second core runs the run without cuts)
        try {
          again = run_once(ss, ts, false, false, w, true);
        } catch (...) {
          if (ahead_th) ahead_th->join();
          throw;
        }
        run = std::move(again);
      }
      if (ahead_th) {
        ahead_th->join();
        ss.split = split;
        const bool cuts_fail = !(run->failure.empty() && !num::trial_failed() && cuts_hold(ss, *run));
        if (cuts_fail && real_difference(ahead)) {
          w += ahead_w - ahead_w0;
          run.reset();
          return take_real(o, ahead, w0, w);
        }
      }
      if (run->failure.empty() && !num::trial_failed() && cuts_hold(ss, *run)) {
        if (ss.n_cuts > 0) o.held_off = ss.cut_off;
        o.diff = compare(ss, *run, links, o.degree);
        if (!o.diff || o.diff->kind != DiffKind::Lanes)
          o.points = ss.n_cuts - static_cast<int>(std::count(ss.cut_off.begin(), ss.cut_off.end(), 1));
        else
          run.reset();
      } else {
        run.reset();
      }
      if (!run) run = run_uncut(ss, ts, w, o);
      read_run(*run, o);
      o.sets_full = num::sets_full();
      o.uf = num::uf_evaluations(), o.log2 = trial_log2_bound(o.degree);
      run.reset();
      o.peak = peak_bytes();
    } catch (const BudgetError& e) {
      o.budget.emplace(e.what(), e.loc);
      o.budget_split = e.bytes && ss.split_ran;
    } catch (...) {
      o.error = std::current_exception();
    }
    o.used = w0 - w;
    return o;
  };
  // A trial alone runs its spec beside its plan (on the second core); their values together may pass the byte
  // budget where one after the other they would not: such a trial is made again one run at a time (only then: the
  // work limit, a tensor's elements, or the bytes of a run that never split are the same either way).
  auto trial = [&](Setup& ss, std::uint64_t ts, bool sets, std::int64_t& w, bool alone) {
    const std::int64_t w0 = w;
    Outcome o = trial_with(ss, ts, sets, w, alone, alone && opt.parallel);
    if (o.budget_split && alone && opt.parallel) w = w0, o = trial_with(ss, ts, sets, w, alone, false);
    return o;
  };
  // The trials; `sets`: max and min reductions as functions of sets (interp/num.h, set_extreme), the pass that
  // proves a program whose only choices by value are those reductions. A result to return at once, or none.
  // Trials are independent (each its own seed, primes, inputs and cut switches), so once the first has shown what one
  // takes, two that the loop is sure to need run at once on two threads when half the work budget holds one with room
  // to spare (each run within the byte budget); they are then taken in order exactly as if run one after the other
  // (a trial the loop turns out not to need is dropped, one that runs out of its half is run again alone).
  auto run_trials = [&](bool sets) -> std::optional<EquivResult> {
    auto seed_of = [&](int attempt) {
      return attempt == 0 ? opt.seed : mix(opt.seed ^ (0x7e57ULL + static_cast<std::uint64_t>(attempt)));
    };
    // (a choice that is routing only needs the bound and kRoutingTrials routings; any other, every attempt)
    auto wanted = [&] { return tally.log2_bound > kLog2Target || (tally.choice && !tally.routing) || tally.trials < min_trials; };
    // whether the loop still runs after one more trial that agrees as `o` did
    auto wanted_after = [&](const Outcome& o) {
      return tally.log2_bound + o.log2 > kLog2Target || (tally.choice && !tally.routing) || tally.trials + 1 < min_trials;
    };
    // a trial alone, with the budget left (as the loop always ran them)
    auto alone = [&](int at) {
      std::int64_t w = work;
      return trial(s, seed_of(at), sets, w, true);
    };
    // Takes one outcome in order: a result to return, or none (counted, or a trial that does not count).
    auto take = [&](Outcome& o) -> std::optional<EquivResult> {
      if (o.error) std::rethrow_exception(o.error);
      if (o.budget) return skip(o.budget->first, o.budget->second);
      work -= o.used;
      if (o.points > 0) tally.points = tally.staged ? std::min(tally.points, o.points) : o.points, tally.staged = true;
      // the set pass proves or gives up (a difference there may be no difference of the extremes)
      if (sets && (!o.failed.failure.empty() || o.diff || o.sets_full)) return EquivResult{};
      if (!o.failed.failure.empty()) return located_failure(o.failed);
      if (o.field_failed) return std::nullopt;
      if (o.diff) {
        num::Lanes guard({o.ts, sets});  // the trial's lanes again (deterministic in its seed) for the search
        return report_difference(s, links, *o.diff, o.ts, work, res, o.cut, o.peak > s.oo.max_bytes / 8, o.held_off ? &*o.held_off : nullptr);
      }
      if (!tally.choice && o.plan_choice >= 0) tally.choice = &p.ops[static_cast<std::size_t>(o.plan_choice)];
      if (!tally.choice && o.model_choice >= 0) tally.choice = &s.model.ops[static_cast<std::size_t>(o.model_choice)];
      if (o.plan_choice >= 0 && !is_routing(p.ops[static_cast<std::size_t>(o.plan_choice)].kind)) tally.routing = false;
      if (o.model_choice >= 0 && !is_routing(s.model.ops[static_cast<std::size_t>(o.model_choice)].kind)) tally.routing = false;
      ++tally.trials;
      tally.max_degree = std::max(tally.max_degree, o.degree), tally.max_uf = std::max(tally.max_uf, o.uf);
      tally.log2_bound += o.log2;
      return std::nullopt;
    };
    std::optional<Outcome> last;  // the previous trial taken: what one takes
    int attempt = 0;
    while (attempt < kMaxAttempts && wanted()) {
      // (each trial holds at most the byte budget, so two at once hold at most twice it: --max-memory is per trial; two
      // trials whose peaks together are over it run one at a time instead, each with its spec beside its plan)
      const bool pair = opt.parallel && last && attempt + 1 < kMaxAttempts && wanted_after(*last) && work >= 4 * last->used &&
                        2 * last->peak <= s.oo.max_bytes;
      std::optional<Setup> s2;  // the second trial's (its own cut switches)
      std::optional<std::thread> th;
      Outcome b;
      std::int64_t w2 = work / 2;
      if (pair) {
        s2.emplace(s);
        try {
          th.emplace([&] { b = trial(*s2, seed_of(attempt + 1), sets, w2, false); });
        } catch (const std::system_error&) {  // no second thread: one after the other, below
        }
      }
      if (th) {
        std::int64_t w1 = work / 2;
        Outcome a = trial(s, seed_of(attempt), sets, w1, !th);
        th->join();
        if (a.budget) a = alone(attempt);  // out of its half of the work: alone, as it would have run
        if (auto r = take(a)) return r;
        ++attempt;
        if (!(attempt < kMaxAttempts && wanted())) break;  // (b was not needed)
        // alone with what is left after a: out of its half, or past what a left it (a trial with a redo can take more
        // than the first one did), it runs as it would have, to the same end
        if (b.budget || b.used >= work) b = alone(attempt);
        if (auto r = take(b)) return r;
        last = std::move(b);
        ++attempt;
        continue;
      }
      Outcome o = alone(attempt);
      if (auto r = take(o)) return r;
      last = std::move(o);
      ++attempt;
    }
    return std::nullopt;
  };
  if (auto r = run_trials(false)) return *r;
  // The choices were max / min reductions only (and the runs met no other): as sets, every trial proves the identity
  // whatever element is the largest. A difference, a failure or another choice there leaves the verdict of the trials
  // above (a set can differ where the extremes agree: max over {x, -inf} against max over {x}).
  bool by_sets = false;
  if (tally.choice && !value_choice(p, true)) {
    const Tally first = tally;
    tally = Tally{};
    std::optional<EquivResult> r;
    try {
      r = run_trials(true);
    } catch (const std::exception&) {
      r = EquivResult{};
    }
    if (r || tally.choice) tally = first;
    else by_sets = true;
  }
  std::string scope = scope_text(p);
  if (by_sets) scope += "; max and min reductions as functions of the set of their operands, so for every order of the values";
  // MoE routing only, over kRoutingTrials draws: with each drawn routing held fixed the lanes prove the identity, so
  // the verdict is "equivalent for the drawn routings" (said so, and a value-unproved warning for the others).
  const bool drawn_routings = tally.choice && tally.routing && tally.trials >= kRoutingTrials;
  if (tally.choice && !drawn_routings) {
    // The exact lanes follow the branch the doubles take, so they cannot see a choice made on the wrong values when
    // the drawn inputs happen to lead both programs to the same branch: equal on every trial is evidence, not proof.
    res.verdict = EquivVerdict::Unknown;
    res.message = fmt::format(
        "equal to the spec on {} trials of drawn inputs{}, but not proved: {} (line {}) chooses by value, and the exact arithmetic "
        "follows the choice the drawn values make",
        tally.trials, covers, op_name(tally.choice->kind), tally.choice->loc.line);
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = tally.choice->loc;
    d.message = "equivalence not proved: " + res.message;
    res.diags.push_back(std::move(d));
    return res;
  }
  if (tally.staged) scope += fmt::format("; verified in stages at {} lineage point{}", tally.points, tally.points == 1 ? "" : "s");
  if (tally.log2_bound > kLog2Target) {
    res.verdict = EquivVerdict::Unknown;
    res.message =
        fmt::format("equal to the spec in {} trial{}{}, but the error bound 2^{:.0f} is above 2^{} (degree bound {}, {} random-function evaluations)",
                    tally.trials, tally.trials == 1 ? "" : "s", covers, tally.log2_bound, kLog2Target, tally.max_degree, tally.max_uf);
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = links[0].loc;
    d.message = "equivalence not proved: " + res.message;
    d.notes.push_back(
        {p.spec_loc,
         "fix: name intermediate values alike in the plan and the spec (or list them under lineage:) so the check can verify stage by stage"});
    res.diags.push_back(std::move(d));
    return res;
  }
  res.verdict = EquivVerdict::Equivalent;
  res.error_bound = std::exp2(tally.log2_bound);
  std::string inputs = "all real inputs";
  if (drawn_routings) {
    res.drawn_routings = true;
    inputs = fmt::format("all real inputs routed as one of the {} drawn inputs", tally.trials);
    scope += fmt::format("; {} (line {}) chooses the experts by value", op_name(tally.choice->kind), tally.choice->loc.line);
  }
  res.message = fmt::format(
      "{} output{} equal to the spec for {}{}{} (error probability below 2^{:.0f}: {} trial{}, degree bound {}, {} random-function "
      "evaluations; real arithmetic, floating-point rounding out of scope)",
      links.size(), links.size() == 1 ? "" : "s", inputs,
      !covers.empty()   ? covers
      : s.sizes.empty() ? ""
                        : " at " + s.sizes,
      scope, tally.log2_bound, tally.trials, tally.trials == 1 ? "" : "s", tally.max_degree, tally.max_uf);
  if (drawn_routings) {
    Diagnostic d;
    d.id = CheckId::ValueUnproved;
    d.severity = Severity::Warning;
    d.loc = tally.choice->loc;
    d.message = "equivalent for the drawn routings only: " + res.message + "; a routing no trial drew is not proved";
    res.diags.push_back(std::move(d));
  }
  return res;
}

}  // namespace

EquivResult check_built_pair(const equiv_detail::TrainingPair& tp, const EquivOptions& opt) { return check_pair(tp.program, opt, &tp, nullptr); }

EquivResult check_equivalence(const Program& p, const EquivOptions& opt) {
  bool pipelined = p.schedule.present && !p.schedule.stages.empty();
  bool training = p.loss >= 0 && (p.train || p.has_backward);
  // Shape reduction: the program with its sizes as variables, run at the smallest sizes with its partition structure
  // (not yet for per-rank programs: those run at their declared sizes; nor a local-view training step: its
  // hand-written backward has no types to reduce by).
  std::vector<std::int64_t> base;
  std::optional<Program> g = opt.reduce && !p.per_rank && !(p.local_view && training) ? generalized(p, opt, base) : std::nullopt;
  Reduced red;
  equiv_detail::TrainingPair tp;
  bool reduced = false;
  if (g) {
    // every size at one value (the declared ones, symbolic ones at their instantiation): the checks below decide
    // their claims by evaluation, never by the solver
    g = equiv_detail::at_sizes(*g, base);
    if (pipelined) {  // the lowered schedule of the program with its sizes as variables (equiv/pipeline.h)
      tp = equiv_detail::pipeline_pair(*g);
      reduced = tp.ok && prepare_pipeline_reduction(*g, base, tp, red);
    } else {
      if (training) tp = equiv_detail::training_pair(*g);
      // a training step that does not build with its sizes as variables is checked as declared (where it may)
      reduced = !(training && !tp.ok) && prepare_reduction(*g, base, training ? &tp : nullptr, red);
    }
    if (!reduced) tp = equiv_detail::TrainingPair{};
  }
  const Program& q = reduced ? *g : p;
  const Reduced* rp = reduced ? &red : nullptr;
  // The check at reduced sizes, then as declared where it must be (`as_declared(o)` runs it with options o, nullopt
  // when the declared pair cannot be built): when a run fails at the reduced sizes, within the usual limits; and to
  // confirm a difference found there, within 64 MiB of values: an identity the declared sizes make exact (the
  // normalized values of a LayerNorm sum to 0) is not exact over fewer elements divided by the declared count, so a
  // plan that differs from its spec only inside such an identity would be a false alarm. Too large as declared: the
  // reduced counterexample stands.
  EquivOptions confirm_opt = opt;
  confirm_opt.max_bytes = opt.max_bytes > 0 ? std::min<std::int64_t>(opt.max_bytes, 64 << 20) : 64 << 20;
  auto checked = [&](EquivResult res, auto&& as_declared) {
    if (!reduced) return res;
    if (red.run_failed) return as_declared(opt).value_or(res);
    if (!opt.confirm || res.verdict != EquivVerdict::Mismatch) return res;
    std::optional<EquivResult> c = as_declared(confirm_opt);
    return c && c->verdict != EquivVerdict::Skipped ? *c : res;
  };
  auto forward_as_declared = [&](const EquivOptions& o) -> std::optional<EquivResult> { return check_pair(p, o, nullptr, nullptr); };
  if (!pipelined && !training) return checked(check_pair(q, opt, nullptr, rp), forward_as_declared);
  // A training program: the plan's training step against the spec's (its gradients compared too). A pipelined
  // schedule: its per-rank programs with each stage's forward and backward per microbatch (equiv/pipeline.h).
  if (pipelined) {
    if (!reduced) tp = equiv_detail::pipeline_pair(p);
  } else if (p.per_rank)
    tp.why = "the backward of per-rank `programs:` is not derived (a pipeline's is: write it as a `schedule:` with stages)";
  else if (p.local_view)
    tp = equiv_detail::local_training_pair(p);
  else if (!reduced)
    tp = equiv_detail::training_pair(p);
  if ((pipelined || p.local_view) && !tp.ok) return not_checked(p, tp.why);
  if (tp.ok) {
    EquivResult res = checked(check_pair(tp.program, opt, &tp, rp), [&](const EquivOptions& o) -> std::optional<EquivResult> {
      tp = pipelined ? equiv_detail::pipeline_pair(p) : equiv_detail::training_pair(p);
      if (!tp.ok) return std::nullopt;
      return check_pair(tp.program, o, &tp, nullptr);
    });
    // A parameter the spec's loss depends on that no plan gradient reaches is never updated: a mismatch whatever
    // the compared values say.
    for (const auto& m : tp.missing) {
      Diagnostic d;
      d.id = CheckId::ValueMismatch;
      d.loc = m.loc;
      d.tensor = p.name(m.param);
      d.message = fmt::format(
          "no gradient reaches parameter {} in the plan's backward, but the spec's loss depends on it (the spec's backward writes {}.grad)",
          p.name(m.param), p.name(m.param));
      d.notes.push_back({p.loss_loc, "the loss the gradients are taken of"});
      if (res.verdict != EquivVerdict::Mismatch) res.verdict = EquivVerdict::Mismatch, res.message = d.message, res.diags.clear(), res.drawn_routings = false;
      res.diags.push_back(std::move(d));
    }
    return res;
  }
  EquivResult res = checked(check_pair(q, opt, nullptr, rp), forward_as_declared);
  if (res.verdict == EquivVerdict::Skipped && p.outputs.empty() && p.spec_outputs.empty()) {  // nothing but the gradients to compare
    res.message += "; the gradients are not compared: " + tp.why;
    for (auto& d : res.diags) d.message = res.message;
  }
  if (res.verdict != EquivVerdict::Equivalent) return res;
  res.verdict = EquivVerdict::Unknown;
  res.drawn_routings = false;
  res.message = "the forward's outputs equal the spec's, but the gradients are not compared: " + tp.why;
  Diagnostic d;
  d.id = CheckId::ValueUnproved;
  d.severity = Severity::Warning;
  d.loc = p.loss_loc;
  d.message = "equivalence not proved: " + res.message;
  res.diags.push_back(std::move(d));
  return res;
}

}  // namespace spmd
