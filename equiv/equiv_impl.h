// equiv/equiv_impl.h - what the value check's own files share (not an interface): the comparison of values and
// the first op that goes wrong (localize.cpp), the state of one check (Setup) and of one run (Run), and the shape
// reduction's preparation (reduce_check.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "equiv/equiv.h"
#include "equiv/per_rank.h"
#include "equiv/reduce.h"
#include "equiv/training.h"
#include "interp/assembly.h"
#include "interp/runner.h"

namespace spmd::equiv_detail {

using namespace interp;

constexpr double kRtol = 1e-6, kAtol = 1e-9;

inline double dbl(const Num& x) { return x.d; }
bool close_to(double a, double b, double tol);
double max_abs_of(const Tensor& t);
// The first element where `a` and `b` differ in doubles (-1: none; -2: shapes differ).
std::int64_t first_difference(const Tensor& a, const Tensor& b);
// The first element where the doubles of `a` and `b` differ beyond the tolerance and the field lanes differ too (or
// are off): a counterexample. Where every lane agrees the two exact values are equal (with the check's error bound),
// so doubles apart there are rounding (a deep step summing microbatches in another order than the spec's whole
// batch), out of scope as everywhere. -2: shapes differ; -1: none.
std::int64_t first_real_difference(const Tensor& a, const Tensor& b);
// The first element where the field lanes of `a` and `b` differ (-1: none, or lanes off; shapes must agree).
std::int64_t first_lane_difference(const Tensor& a, const Tensor& b);
// Equal in doubles and in every lane.
bool same_value(const Tensor& a, const Tensor& b);
std::string num_text(double x);
// A tensor's values as nested brackets (at most `cap` elements, then "...").
std::string values_text(const Tensor& t, std::size_t cap = 16);

// The cuts made of one point on the ranks so far, a few distinct values (a value replicated over an axis is cut on
// every rank that holds it, bit for bit the same).
struct CutMemo {
  std::vector<std::pair<Tensor, Tensor>> done;  // (value before the cut, after it)
  std::size_t next = 0;                         // the entry to replace when full
  std::int64_t mb = -1;                         // a pipeline's point: the microbatch of the values kept
};

// A pipeline's cut point in one run (Setup::cut_mb), checked one microbatch at a time: the instances of microbatch k
// are kept until every rank that holds the point has written its own, then read over the ranks (each reading of the
// first instance) and compared with microbatch k's part of the spec's value under every arrangement still alive:
// the same value in every microbatch (a weight's transpose), or part k of each rank block of dim d (the microbatch
// split). The point holds when every microbatch was checked and some (reading, arrangement) matched them all.
struct MbCut {
  std::vector<std::vector<Val>> inst;  // [microbatch][rank]
  std::vector<std::int64_t> left;      // [microbatch] holders yet to write it
  std::vector<Placements> readings;    // of the first microbatch checked
  std::vector<char> live;              // [reading * (1 + rank) + arrangement]: equal so far
  std::int64_t checked = 0;            // microbatches checked
  bool failed = false;
};

// What one run of model and plan gives.
struct Run {
  std::unique_ptr<Runner> plan, model;
  std::string failure;  // a run failed: why
  int failed_op = -1;
  bool plan_failed = false;
  // Recorded when asked: every op output, model: [op][k] global; plan: [op][k][rank] local.
  std::vector<std::vector<Tensor>> model_vals;
  std::vector<std::vector<std::vector<Val>>> plan_vals;
  std::vector<int> plan_order;  // recorded: plan ops in the order they first ran (a topological order across ranks)
  // The per-rank slots themselves (a recorded op's, a held microbatch instance of a stage cut: ranks of them each),
  // charged to the byte budget with the values.
  std::int64_t record_bytes = 0;
  // Stage cuts (staged verification): each cut point's value before the cut, model global, plan per rank, kept until
  // every rank has written the point; then it is checked (cut_ok) and dropped. A point only some ranks write (per-rank
  // programs) is checked after the run (cuts_hold).
  std::vector<Tensor> model_cut;
  std::vector<std::vector<Val>> plan_cut;
  std::vector<MbCut> plan_cut_mb;  // a pipeline's point (Setup::cut_mb), checked microbatch by microbatch
  std::vector<std::int64_t> cut_left;  // ranks (a pipeline's point: rank x instance writes) yet to write each point
  std::vector<char> cut_ok;
  int first_failed_cut = -1;  // the first point found not to hold while the plan ran (-1: none)
  bool windowed = false;      // recorded for Setup::record_plan only: an op not recorded is taken to be right
  std::vector<CutMemo> cut_memo;  // the plan's, per point while some rank has yet to write it
  std::int64_t model_work = 0;    // the spec's work counter when it runs on its own thread (Setup::split)
};

struct Setup {
  Setup(const Program& plan, Program m) : p(plan), model(std::move(m)) {}
  const Program& p;
  Program model;
  Instantiation inst;
  OracleOptions oo;
  std::vector<std::int64_t> ranges;
  std::string sizes;
  // Stage cut points: a value written once by the plan and once by the spec under one name (or a lineage pair);
  // NameId -> cut index or -1, for the plan's names and the model's.
  std::vector<int> plan_cut, model_cut;
  std::vector<int> plan_last, model_last;  // NameId -> the last op writing it (-1: none)
  std::vector<char> plan_final;            // per operand slot of a plan op's output: its program's last write of the name
  // Training pairs: the ops [first, last) of each program that are a derived backward (for messages).
  std::pair<std::size_t, std::size_t> plan_bwd{0, 0}, model_bwd{0, 0};
  int n_cuts = 0;
  // Per cut point: 1 when the plan's side is a pipeline's instances `<name>@mb<k>` (one per microbatch, written by
  // the instances of one op of the one-microbatch step), read together as the spec sees the value (cut_holds_mb).
  std::vector<char> cut_mb;
  std::vector<char> cut_off;  // per cut point: not cut in this trial's runs (it did not hold in an earlier run)
  // A run with stage cuts runs the spec on a second thread beside the plan (run_once): set for a trial that runs
  // alone, with the second core to itself. `split_ran`: set by a run that did (a run in sets, or recording, does not).
  bool split = false;
  bool split_ran = false;
  std::int64_t n_mb = 0;  // a pipeline's microbatches (steps x microbatches)
  std::vector<std::int64_t> model_elems;  // a pipeline's: per NameId, the elements of the spec's value (-1: unknown)
  // Shape reduction (equiv/reduce.h): the real global shapes of each op's inputs, for the plan and the model.
  const std::vector<std::vector<Shape>>* plan_real = nullptr;
  const std::vector<std::vector<Shape>>* model_real = nullptr;
  // NameId -> 1 for the values read after a run (the compared outputs): a run without records frees the others
  // once dead (Runner::free_dead).
  std::vector<char> plan_keep, model_keep;
  // A recording of some ops only (per op of the plan and the model; empty: every op): the ops around the first cut
  // point that differs (first_cut_failure), the rest freed when dead as in a run without recording.
  std::vector<char> record_plan, record_model;
  const TrainingPair* pair = nullptr;  // a training pair: microbatch inputs and op families of a pipeline
  // On a reduced mesh (equiv/reduce.h, choose_mesh): the declared mesh, the plan runner's value_sizes; else empty.
  std::vector<std::int64_t> value_mesh;
};

struct SpecValue {
  const Tensor* t;
  int op;  // producing model op; -1: a declared input
  NameId name;
};

// Placements to read a plan value by: a dim the runner tracks as sharded by an axis is S(dim) there; any other axis
// may be R or a pending sum (global view); in local view any axis may also be S(d) of any dim.
std::vector<Placements> readings(const Program& p, const Val& v0, bool pending = true);

// Assembles the per-rank `ranks` by every reading (with or without pending sums) until `found` accepts one.
// Per-rank plans: only the ranks that hold the value (the ranks of the programs that compute it) are read.
template <class Found>
bool any_reading(const Setup& s, const std::vector<Val>& ranks, bool pending, const OracleOptions& o, Found&& found) {
  std::vector<Tensor> held;
  std::vector<std::int64_t> sizes;
  const Val* first = nullptr;
  if (!held_pieces(s.inst.mesh, ranks, held, sizes, &first)) return false;
  for (const Placements& pl : readings(s.p, *first, pending)) {
    Assembled a = assemble_pieces(s.p, sizes, held, pl, o);
    if (!a.ok) continue;
    if constexpr (std::is_invocable_v<Found, const Tensor&, const Placements&>) {
      if (found(a.t, pl)) return true;
    } else if (found(a.t)) {
      return true;
    }
  }
  return false;
}

// A stage cut holds (checked as soon as every rank has written it; one only some ranks write after the run).
bool cut_holds(const Setup& s, const std::vector<Val>& ranks, const Tensor& want);
bool cuts_hold(const Setup& s, const Run& run);
// Checks microbatch k of `m` (every holder has written it) against the spec's value `want`, then drops its instances.
void mb_cut_step(const Setup& s, MbCut& m, std::size_t k, const Tensor& want);

// One run of the plan and the model (equiv/run.cpp) on the inputs drawn from `seed`: with `small_ints` the real
// inputs rounded to small integers (a readable counterexample), with `record` every op's value kept for
// localization, with `cut` the stage cuts of `s` applied where plan and spec agree. A run that fails keeps the
// reason in Run::failure; a BudgetError goes to the caller (too large to run: not checked).
std::unique_ptr<Run> run_once(Setup& s, std::uint64_t seed, bool small_ints, bool record, std::int64_t& work, bool cut = false);
// The stage cut points of a pipelined plan (docs/equivalence.md, "Pipelines"), added to `s`: the names the spec also
// writes (`spec_of`), not `excluded`, whose microbatch instances are whole; the smallest first within a quarter of
// the run's byte budget.
void pipeline_cuts(Setup& s, const TrainingPair& tp, const std::vector<char>& excluded, const std::vector<NameId>& spec_of);

struct Culprit {
  int op = -1;        // plan op
  int spec_op = -1;   // the model op it should have matched
  int frontier = -1;  // the first op on the way whose value matches no model value, when it is not `op`
  NameId named = -1;  // when `op` is a lineage point: the model's name it differs from
  // An input of `op` that matches a model value only as a pending sum (a missing reduction before `op`).
  NameId pending_in = -1, pending_spec = -1;
  std::string pending_axes;
  bool by_cuts = false;  // found by the stage cuts (first_cut_failure)
  std::vector<int> way;  // then: the ops computing its value from points that hold
};

// The first op on the way to `output` that goes wrong (and the model op it should have matched), from a recorded run.
Culprit localize(Setup& s, Run& run, NameId output, const std::vector<std::pair<NameId, NameId>>& links);

// Where a run with every stage cut first goes wrong, without recording a value (a deep pipelined step whose recording
// is over the byte budget): the plan op writing a cut point that does not hold while every cut point its value comes
// from (through ops that write none) holds. Cut points are random functions of their values, so a difference stays
// one downstream; the earliest such op (in program order) is taken. None when no cut fails that way.
struct CutCulprit {
  int op = -1;           // the plan op (an instance of a pipeline's op: its first)
  NameId plan = -1;      // the point it writes
  NameId spec = -1;      // the spec's name of the point
  std::vector<int> way;  // the ops computing it from points that hold (not constants), in program order
};
CutCulprit first_cut_failure(const Setup& s, const Run& run);
// An op a pipeline's lowering made (gradient accumulation, merges over microbatches): correct by construction.
bool generated_op(const Setup& s, int oi);
// A pipeline's Recv of a microbatch's value (an instance of its writer's family): a copy of the value on the next
// stage's ranks, not a piece of it.
bool received_copy(const Setup& s, int oi);
// Sets Setup::record_plan / record_model to the ops around `c`: the plan's way to the point (with every microbatch's
// instance of each), and the spec's ops computing its counterpart from the spec's cut points.
void record_around(Setup& s, const CutCulprit& c);
// The ops that compute the compared output `plan` (the spec's `spec`) from the stage cut points of the cut switches
// `off`: every op writing it and, back from those, every op up to a cut point (in program order). For a run with
// those switches in which every cut point held, they are where a difference of that output arises (record_around
// records them).
CutCulprit way_to(const Setup& s, const std::vector<char>& off, NameId plan, NameId spec);
std::string op_text(const Program& p, const Op& op);
// The same, saying when the op is part of a derived backward (its line is the forward op's).
std::string op_text(const Setup& s, bool model, const Op& op);

// A run at reduced sizes (equiv/reduce.h): the sizes, the real shapes the value-using kernels read, and what the verdict covers.
struct Reduced {
  Reduction r;
  std::vector<std::vector<Shape>> plan_real, model_real;
  // A pipelined pair's spec: per name, the elements of its last write at the reduced sizes as typed (-1: not known);
  // empty when not computed. The stage cuts are chosen by it (Setup::model_elems) without running the spec first.
  std::vector<std::int64_t> model_elems;
  // And per op of its spec, per input, the global shape it reads at the reduced sizes as typed (empty: not known):
  // the ranges its integer inputs take (interp index_extent) without a pre-run.
  std::vector<std::vector<Shape>> model_run;
  mutable bool run_failed = false;  // set by check_pair when a run fails at the reduced sizes (then: as declared)
};

// `p` with its concrete sizes as variables (LoadOptions::generalize_sizes) and the value each variable has without a
// reduction (declared, or the small instantiation of a symbolic size); nullopt when it cannot be had (a program built
// in code, one edited after it was loaded, no concrete size to reduce).
std::optional<Program> generalized(const Program& p, const EquivOptions& opt, std::vector<std::int64_t>& base);
// The reduction of `g` (its forward typed here, the training pair's steps when `tp`), checked: the program at the
// reduced sizes must type-check exactly as at the declared ones (the same findings, the same placement for every
// value), or it is not used. False: nothing to reduce, or the reduction does not hold.
bool prepare_reduction(const Program& g, const std::vector<std::int64_t>& base, const TrainingPair* tp, Reduced& red);
// The same for a pipelined schedule (`g` with `stages:`, `tp` its pipeline_pair): the facts are the one-microbatch
// step's (pipeline_step_forward, typed on the mesh without the pipeline axis, which choose_mesh may reduce; the
// pipeline axis and the microbatch count are kept) and the spec's; each lowered op reads the real extents of the step
// op it is an instance of (TrainingPair::family).
bool prepare_pipeline_reduction(const Program& g, const std::vector<std::int64_t>& base, const TrainingPair& tp, Reduced& red);

// One compared output that differs.
enum class DiffKind { Form, Real, Lanes };  // shape / assembly; the doubles; only the field lanes
struct Difference {
  std::size_t link = 0;  // index into the links
  std::string what;      // the element and both values, or why it cannot be compared
  DiffKind kind = DiffKind::Form;
};

struct Link {
  NameId plan, spec;
  Loc loc;
  Placements pl{};
  std::vector<std::pair<int, std::int64_t>> held{};  // an output's `ranks:` (per-rank plans): read from those ranks only
};

// Compares every link; `degree` receives the largest degree bound of the compared elements (plan + spec).
std::optional<Difference> compare(Setup& s, Run& run, const std::vector<Link>& links, std::uint64_t& degree);
// A difference found in trial `ts` (equiv/report.cpp): value-mismatch (the doubles differ: a counterexample, the first
// plan op that goes wrong), or value-unproved (only the field lanes differ). `cut`: where the trial's run with every
// stage cut first went wrong; `large`: the run's peak held an eighth of the byte budget (recording every value is not
// tried when a cut says where to look); `held_off`: the cut switches of a run whose every cut point held.
EquivResult& report_difference(Setup& s, const std::vector<Link>& links, const Difference& diff, std::uint64_t ts, std::int64_t& work,
                               EquivResult& res, const CutCulprit& cut, bool large, const std::vector<char>* held_off);

// What an `equivalent` verdict covers beyond the real inputs: ", for the drawn integer inputs (...)" and dropout masks
// (equiv/choices.cpp), or "".
std::string scope_text(const Program& p);
// Whether op `k` is MoE routing: TopKGate picks each token's experts by value, MoEDispatch fills capacity slots by
// those indices.
bool is_routing(OpKind k);
// The first op of the plan or the spec whose result depends on a choice made by comparing values (routing, a max/min
// reduction, an input pending a max or min, an FP8 amax), or null; `sets`: max and min reductions read as functions of
// sets (interp/num.h, set_extreme) are no choice.
const Op* value_choice(const Program& p, bool sets = false);
// Whether the plan's and the spec's static choices by value are all MoE routing, at least one.
bool routing_only(const Program& p);

}  // namespace spmd::equiv_detail
