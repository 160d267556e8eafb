// spatial/rules_fp8.cpp - placement and shape rules of the FP8 ops, and the agreement of FP8 scales
//
// Ops: AmaxUpdate, AmaxHistory, FP8Scale, FP8Quantize, FP8Dequantize (dispatched from Checker::apply() in
// rules.cpp). FP8 data is described by the placement of the value it encodes; Value::fp8_local adds the axes
// over which its ranks encode with different (per-rank) scales. Such data may stay local and be decoded with
// the same scale, but no collective may exchange it (fp8_exchange_ok) and it is no program output: every rank
// would decode the other ranks' data with its own scale. docs/semantics.md, "FP8 scales", says why.
#include "ir/op_table.h"
#include "spatial/checker.h"

namespace spmd::detail {

namespace {

void clear_fp8(Value& v) {
  v.fp8_scale = -1;
  v.fp8_qop = -1;
  v.fp8_amax = -1;
  v.fp8_amax_op = -1;
  v.fp8_amax_pmax = 0;
  v.fp8_local = 0;
  v.fp8_under = 0;
}

bool fp8_family(OpKind k) {
  return k == OpKind::FP8Quantize || k == OpKind::FP8Dequantize || k == OpKind::AmaxUpdate || k == OpKind::AmaxHistory || k == OpKind::FP8Scale;
}

}  // namespace

// Every other op's output carries what its inputs carry: the axes of per-rank units (a sum, a matmul or a
// reshape of per-rank-scaled data is still in per-rank units), the scale, and the amax a scale came from.
// Inputs of different scales (or one in per-rank units next to other data) mix: no scale decodes the result.
void Checker::fp8_carry(Value& v) const {
  if (fp8_family(op_->kind) || op_->kind == OpKind::Recv) return;  // they set their own; a Recv takes its Send's
  clear_fp8(v);
  const Value* first = nullptr;
  bool mixed = false;
  for (const Value* x : in_) {
    if (v.fp8_amax == -1) v.fp8_amax = x->fp8_amax, v.fp8_amax_op = x->fp8_amax_op, v.fp8_amax_pmax = x->fp8_amax_pmax;
    if (x->fp8_scale == -1 && !x->fp8_local) continue;
    if (!first)
      first = x;
    else
      mixed |= x->fp8_scale != first->fp8_scale || x->fp8_local != first->fp8_local || x->fp8_qop != first->fp8_qop;
    v.fp8_local |= x->fp8_local;
    v.fp8_under |= x->fp8_under;
  }
  if (!first) return;
  v.fp8_scale = mixed ? -3 : first->fp8_scale;
  v.fp8_qop = first->fp8_qop;
}

std::string Checker::fp8_amax_fix(const Value& v, std::uint32_t mask) const {
  std::string axs;
  int n = 0;
  for (int a = 0; a < axes(); ++a)
    if (mask & (1u << a)) axs += (n++ ? ", " : "") + axn(a);
  if (n > 1) axs = "[" + axs + "]";
  if (v.fp8_amax < 0)
    return fmt::format(
        "quantize with a scale computed from an amax all-reduced with max over {} (the ranks that exchange the data must share one scale)", axs);
  const std::string& m = p_.name(static_cast<NameId>(v.fp8_amax));
  return fmt::format(
      "reduce the amax over {} before the scale is computed from it: insert {{op: AllReduce, in: [{}], out: {}, axis: {}, reduce: max}} "
      "after the op that computes {} (TransformerEngine's amax reduction group; torchao's precompute_float8_dynamic_scale_for_fsdp)",
      axs, m, m, axs, m);
}

// The machine-readable form of fp8_amax_fix: an AllReduce(max) over `mask` right after the AmaxUpdate, when
// that amax was P(max) over all of `mask` there (otherwise the fix stays a note).
Fix Checker::fp8_machine_fix(const Value& v, std::uint32_t mask) const {
  if (v.fp8_amax_op < 0 || (mask & ~v.fp8_amax_pmax) || p_.per_rank) return {};
  const Op& op = p_.ops[static_cast<std::size_t>(v.fp8_amax_op)];
  std::string axs;
  int n = 0;
  for (int a = 0; a < axes(); ++a)
    if (mask & (1u << a)) axs += (n++ ? ", " : "") + axn(a);
  if (n > 1) axs = "[" + axs + "]";
  const std::string& m = p_.name(p_.outs(op)[0]);
  return {FixKind::InsertAfter, v.fp8_amax_op, op.loc.line, "",
          fmt::format("{{op: AllReduce, in: [{}], out: {}, axis: {}, reduce: max}}", m, m, axs)};
}

// AmaxUpdate: max |x| as a scalar. A sharded x gives each rank its own max: P(max).
void Checker::amax() {
  Value& o = out() = in(0);
  clear_fp8(o);
  o.fp8_local = in(0).fp8_local;  // the amax of data in per-rank units is in per-rank units
  o.rank = 0;
  o.dtype = DType::F32;
  o.fp8_amax = static_cast<std::int32_t>(p_.outs(*op_)[0]);
  o.fp8_amax_op = op_idx_;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "the max of a pending sum is not the max of its summands");
    if (p.is_s()) {
      set_new(o, a, Placement::p(ReduceOp::Max), fmt::format("AmaxUpdate of a tensor sharded {} over {} is each rank's own max", ps(p), axn(a)));
      o.fp8_amax_pmax |= 1u << a;
    }
  }
}

// AmaxHistory(history[L], amax) -> [amax, history[0..L-2]]: the window holds maxima, so P(max) in either
// input (the other R or P(max)) leaves the new window P(max); the window dim must be whole.
void Checker::amax_history() {
  const Value& h = in(0);
  const Value& m = in(1);
  if (h.rank != 1)
    return report(CheckId::ShapeMismatch,
                  fmt::format("AmaxHistory takes a history of rank 1 (the window), but {} has shape {}", iname(0), sstr(h.dims())), iname(0),
                  {fix("declare the history as a vector, e.g. shape: [16]")});
  if (m.rank != 0)
    return report(CheckId::ShapeMismatch, fmt::format("AmaxHistory takes a scalar amax, but {} has shape {}", iname(1), sstr(m.dims())), iname(1),
                  {fix(fmt::format("compute it with {{op: AmaxUpdate, in: [x], out: {}}}", iname(1)))});
  if (!invariant_ok({0, 1})) return;
  Value& o = out() = h;
  clear_fp8(o);
  o.fp8_local = h.fp8_local | m.fp8_local;
  o.dtype = DType::F32;
  o.fp8_amax = m.fp8_amax >= 0 ? m.fp8_amax : static_cast<std::int32_t>(p_.ins(*op_)[1]);
  if (m.fp8_amax >= 0) o.fp8_amax_op = m.fp8_amax_op, o.fp8_amax_pmax = m.fp8_amax_pmax;
  for (int a = 0; a < axes(); ++a) {
    Placement ph = pin(0, a), pm = pin(1, a);
    if (ph.is_s()) return sharded_dim(0, a, 0, "the window of an amax history is one rank's list of recent maxima");
    for (int i : {0, 1}) {
      Placement p = pin(i, a);
      if (p.is_p() && p.linear_partial()) return partial_misuse(i, a, "an amax history holds maxima, and a pending sum is not one");
    }
    if (ph == pm || pm.is_r()) continue;  // o has h's placement
    if (ph.is_r() && (pm.is_p() || pm.is_v())) {
      set_from(o, a, pm, 1);
      continue;
    }
    if (ph.is_p() && pm.is_p())
      return partial_misuse(1, a,
                            fmt::format("the history is {} over {}; a window cannot hold both a pending max and a pending min", ps(ph), axn(a)));
    int pi = ph.is_p() ? 0 : 1;  // a pending reduction next to per-rank values (V)
    return partial_misuse(pi, a, fmt::format("the window would hold pending values next to per-rank ones ({} is V over {})", iname(1 - pi), axn(a)),
                          fix_allreduce(iname(pi), a, pin(pi, a)));
  }
}

// FP8Scale(amax or history): fp8_max / (a * 2^margin), decreasing in a, so a pending max becomes a pending
// min: each rank's own scale, which only a reduction of the amax makes one.
void Checker::fp8_scale() {
  const Value& x = in(0);
  if (x.rank > 1)
    return report(CheckId::ShapeMismatch,
                  fmt::format("FP8Scale takes a scalar amax or a rank-1 amax history, but {} has shape {}", iname(0), sstr(x.dims())), iname(0),
                  {fix("compute the amax with AmaxUpdate, the window with AmaxHistory")});
  Value& o = out() = x;
  clear_fp8(o);
  o.fp8_local = x.fp8_local;
  o.rank = 0;
  o.dtype = DType::F32;
  o.fp8_amax = x.fp8_amax >= 0 ? x.fp8_amax : static_cast<std::int32_t>(p_.ins(*op_)[0]);
  if (x.fp8_amax >= 0) o.fp8_amax_op = x.fp8_amax_op, o.fp8_amax_pmax = x.fp8_amax_pmax;
  bool window_max = x.rank == 1 && at().choice != 1;  // algo: max (the default) takes the window's max
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_s()) return sharded_dim(0, a, 0, "the scale is computed from the whole amax window");
    if (window_max && p == Placement::p(ReduceOp::Min))
      return partial_misuse(0, a, "the max over the window of a pending min is not the pending min of the windows' maxima");
  }
  map_partials(o, 0, PointwiseMap::monotone_down(), "FP8Scale (fp8_max / amax, decreasing in the amax)");
}

// The scale operand `i` of FP8Quantize/FP8Dequantize: a scalar; `per_rank` gets the axes on which the ranks
// hold different scales (P(max), P(min): each rank's own; a V from per-rank values). A pending sum is no scale.
bool Checker::fp8_scale_ok(int i, std::uint32_t& per_rank) {
  const Value& s = in(i);
  if (s.rank != 0) {
    report(CheckId::ShapeMismatch,
           fmt::format("{} takes a scalar scale (per-tensor scaling), but {} has shape {}", opname(), iname(i), sstr(s.dims())), iname(i),
           {fix(fmt::format("compute it with {{op: FP8Scale, in: [amax], out: {}}}", iname(i)))});
    return false;
  }
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(i, a);
    if (p.is_p() && p.linear_partial()) {
      partial_misuse(i, a, "a scale pending a sum is a summand on each rank, not the scale");
      return false;
    }
    if (p.is_p() || (p.is_v() && !whole_v(s, a))) per_rank |= 1u << a;
  }
  per_rank |= s.fp8_local;  // a scale computed from data in per-rank units
  return true;
}

// FP8Quantize(x, [scale]): round x to fp8 (opaque: P x is an error), times the scale (none: 1). The output
// has x's placements; the scale's per-rank axes are remembered (fp8_local).
void Checker::fp8_quantize() {
  Value& o = out() = in(0);
  clear_fp8(o);
  o.dtype = at().has_dtype ? at().dtype : DType::FP8E4M3;
  if (!map_partials(o, 0, PointwiseMap::opaque(), "FP8Quantize (rounding to fp8)")) return;
  std::uint32_t per_rank = 0;
  if (n_in() == 2 && !fp8_scale_ok(1, per_rank)) return;
  o.fp8_scale = n_in() == 2 ? in(1).def : -2;
  if (n_in() == 2) o.fp8_amax = in(1).fp8_amax, o.fp8_amax_op = in(1).fp8_amax_op, o.fp8_amax_pmax = in(1).fp8_amax_pmax;
  o.fp8_local = per_rank | in(0).fp8_local;
  o.fp8_under = in(0).fp8_local;
  o.fp8_qop = op_idx_;
}

// FP8Dequantize(q, [scale]): q / scale, linear in q, so every placement passes. The scale must be the one q
// was quantized with (the same tensor; none with none). A per-rank scale decodes only data quantized with it.
void Checker::fp8_dequantize() {
  const Value& q = in(0);
  std::uint32_t per_rank = 0;
  if (n_in() == 2 && !fp8_scale_ok(1, per_rank)) return;
  std::int32_t want = n_in() == 2 ? in(1).def : -2;
  std::string sname = n_in() == 2 ? iname(1) : "";
  if (q.fp8_scale != -1 && q.fp8_scale != want) {
    std::vector<Note> notes;
    std::string qs;
    if (q.fp8_qop >= 0) {
      const Op& qop = p_.ops[static_cast<std::size_t>(q.fp8_qop)];
      qs = qop.n_in == 2 ? p_.name(p_.ins(qop)[1]) : "";
      notes.push_back({qop.loc, qs.empty() ? fmt::format("{} is quantized here with no scale (a plain cast)", iname(0))
                                           : fmt::format("{} is quantized here with the scale {}", iname(0), qs)});
    }
    std::string fix_text = q.fp8_scale == -3   ? "dequantize each FP8 tensor with its own scale before combining them"
                           : q.fp8_scale == -2 ? fmt::format("drop the scale: {{op: FP8Dequantize, in: [{}]}}", iname(0))
                           : qs.empty()        ? "dequantize with the scale the data was quantized with"
                                               : fmt::format("dequantize with the scale it was quantized with: in: [{}, {}]", iname(0), qs);
    notes.push_back(fix(fix_text));
    std::string used = n_in() == 2 ? fmt::format("the scale {}", sname) : "no scale";
    std::string had = q.fp8_scale == -3   ? "several scales (it mixes FP8 data of different scales or units)"
                      : q.fp8_scale == -2 ? "no scale (a plain cast)"
                      : qs.empty()        ? "another scale"
                                          : fmt::format("the scale {}", qs);
    return report(CheckId::LayoutConflict,
                  fmt::format("FP8Dequantize decodes {} with {}, but it was quantized with {}: a scale updated or recomputed in between "
                              "(delayed scaling) decodes with the wrong factor",
                              iname(0), used, had),
                  iname(0), std::move(notes));
  }
  if (q.fp8_scale == -1 && per_rank) {
    int a = std::countr_zero(per_rank);
    std::vector<Note> notes;
    origin_note(notes, in(1), a);
    notes.push_back(fix(fp8_amax_fix(in(1), per_rank)));
    return report(
        CheckId::LayoutConflict,
        fmt::format("FP8Dequantize decodes {} with {}, which is {} over {}: a per-rank scale, but {} was not quantized with it here, so the "
                    "ranks decode one tensor with different factors",
                    iname(0), sname, ps(pin(1, a)), axn(a), iname(0)),
        iname(0), std::move(notes));
  }
  Value& o = out() = q;
  clear_fp8(o);
  // Decoded with its own scale: back in the units of what was quantized (unknown data: only its marks).
  o.fp8_local = q.fp8_scale == -1 ? q.fp8_local : q.fp8_under;
  o.fp8_scale = -1;
  o.dtype = at().has_dtype ? at().dtype : DType::F32;
}

// A collective over an axis on which its input's FP8 data was quantized with per-rank scales: the receivers
// decode it with their own scales (FSDP2's FP8 all-gather with a per-rank scale is the classic bug).
bool Checker::fp8_exchange_ok() {
  if (op_info(op_->kind).category != OpCategory::collective || n_in() == 0) return true;
  const Value& x = in(0);
  std::uint32_t bad = x.fp8_local & at().axes;
  if (!bad) return true;
  int a = std::countr_zero(bad);
  std::vector<Note> notes;
  std::string s = "its scale";
  if (x.fp8_qop >= 0) {
    const Op& qop = p_.ops[static_cast<std::size_t>(x.fp8_qop)];
    if (qop.n_in == 2) s = p_.name(p_.ins(qop)[1]);
    notes.push_back({qop.loc, fmt::format("quantized here with {}, which is per-rank over {} (each rank's own amax)", s, mask_names(bad))});
  }
  notes.push_back(fix(fp8_amax_fix(x, bad)));
  report(CheckId::IllegalCollective,
         fmt::format("{} over {} exchanges {}, FP8 data quantized with {}, which is per-rank over {}: every rank decodes the data it receives "
                     "with its own scale",
                     opname(), axn(a), iname(0), s, axn(a)),
         iname(0), std::move(notes));
  diags_.back().fix = fp8_machine_fix(x, bad);
  return false;
}

// An output in per-rank units: its ranks' parts do not assemble into one tensor (unless declared V there).
bool Checker::fp8_output_ok(const OutputDecl& od, const Value& v) {
  std::uint32_t bad = v.fp8_local;
  for (int a = 0; a < axes(); ++a)
    if (od.has_placement && od.placement[static_cast<std::size_t>(a)].is_v()) bad &= ~(1u << a);
  if (!bad) return true;
  const std::string& name = p_.name(od.name);
  Diagnostic d;
  d.id = CheckId::PlacementMismatch;
  d.loc = od.loc;
  d.tensor = name;
  d.message = fmt::format(
      "output {} is FP8 data quantized with a scale that is per-rank over {}: its ranks hold values in different units, which "
      "do not assemble into one tensor",
      name, mask_names(bad));
  if (v.fp8_qop >= 0) d.notes.push_back({p_.ops[static_cast<std::size_t>(v.fp8_qop)].loc, "quantized here"});
  d.notes.push_back({od.loc, "fix: dequantize it with its scale before it leaves the program, or " + fp8_amax_fix(v, bad)});
  diags_.push_back(std::move(d));
  return false;
}

}  // namespace spmd::detail
