// spatial/rules_tensor.cpp - placement and shape rules of the tensor ops of issue 10
//
// Ops: Slice, Split, Concat, Stack, Pad (offsets and lengths are size expressions), Arange, RoPE,
// IndexSelect, IndexAdd. Dispatched from Checker::apply() in rules.cpp; docs/semantics.md, "Tensor ops",
// says why each rule holds. Like DTensor's strategies (torch/distributed/tensor/_ops/_tensor_ops.py), a dim
// that is cut, joined, padded or indexed must be whole unless the op provably keeps it as it is; unlike
// DTensor nothing is redistributed implicitly, so a sharded one is an error with the gather as the fix.
#include "spatial/checker.h"

namespace spmd::detail {

ExprId Checker::size_arg(const char* attr, ExprId dflt) {
  ExprId e = p_.size_attr(*op_, attr);
  if (e < 0) return dflt;
  check_expr(e, here(), fmt::format("`{}` of {}", attr, opname()));
  return e;
}

// Claims lo <= hi; false after a shape-mismatch report (symbolic claims become obligations).
bool Checker::at_most(ExprId lo, ExprId hi, const std::string& what, const std::string& tensor) {
  ExprId e = pool_.add(pool_.sub(hi, lo), pool_.constant(1));
  Decision d = obl_.decide(OblKind::Positive, e, e);
  if (d == Decision::Holds) return true;
  if (d == Decision::Fails) {
    report(CheckId::ShapeMismatch, fmt::format("{}: {} > {}", what, dstr(lo), dstr(hi)), tensor);
    return false;
  }
  if (obl_.first_time(OblKind::Positive, e, e))
    obl_.push({OblKind::Positive, e, e, CheckId::ShapeMismatch, here(), op_idx_, tensor, fmt::format("{} ({} <= {}) must hold", what, dstr(lo), dstr(hi)), {}});
  return true;
}

// Dim d of input i is cut, joined or padded by this op: it must not be sharded on any axis. `extra`: a
// sentence for the fix (e.g. the fused-QKV reshape). False after a report.
bool Checker::dim_whole(int i, int d, const std::string& why, const std::string& extra) {
  for (int a = 0; a < axes(); ++a) {
    if (!pin(i, a).is_s(d)) continue;
    std::vector<Note> notes;
    origin_note(notes, in(i), a);
    notes.push_back(fix(fix_allgather(iname(i), a, d) + extra));
    report(CheckId::ShardedReductionDim,
           fmt::format("{} needs dim {} of {} whole, but it is sharded {} over {}; {}", opname(), d, iname(i), ps(pin(i, a)), axn(a), why), iname(i),
           std::move(notes));
    return false;
  }
  return true;
}

// Placements of inputs `which` (equal rank ro, or mapped to it by `dim_of`) combined per axis as an op that
// copies elements into the output (Concat, Stack): a pending reduction passes when every input has the same
// one, or when the others are R and it is avg, max or min (R is all of those); a pending sum with R would
// count the R part once per rank. Otherwise as in Add. False after a report.
bool Checker::join_layout(Value& o, const std::vector<int>& which, int ro, const std::function<Placement(int, int)>& pl) {
  for (int a = 0; a < axes(); ++a) {
    int pi = -1;
    for (int i : which)
      if (pl(i, a).is_p()) pi = i;
    if (pi >= 0) {
      Placement part = pl(pi, a);
      for (int i : which) {
        Placement x = pl(i, a);
        if (x == part || (x.is_r() && part.op != ReduceOp::Sum)) continue;
        if (x.is_r()) {
          partial_misuse(pi, a, fmt::format("{} is R, and every rank copies it into its summand, so the pending sum counts it {} times", iname(i), axsize(a)));
          return false;
        }
        partial_misuse(pi, a,
                       fmt::format("{} is {}; joining it with a pending {} is not the {} of the joined pieces", iname(i), ps(pin(i, a)), reduce_name(part.op),
                                   reduce_name(part.op)),
                       fmt::format("reduce the pending operands first (AllReduce over {}), then {}", axn(a), opname()));
        return false;
      }
      set_from(o, a, part, pi);
      continue;
    }
    int ci = which.front();
    Placement cur = pl(ci, a);
    set_from(o, a, cur, ci);
    for (std::size_t k = 1; k < which.size(); ++k) {
      int j = which[k];
      if (!combine_layout(o, a, ci, cur, j, pl(j, a), ro)) return false;
      Placement now = pl_of(o, a);
      if (!(now == cur)) ci = j;
      cur = now;
    }
  }
  return true;
}

void Checker::slice_op() {
  const Value& x = in(0);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  ExprId n = x.shape[static_cast<std::size_t>(d)];
  ExprId start = size_arg("start", pool_.constant(0)), end = size_arg("end", n);
  std::string what = fmt::format("Slice of {} along dim {} (size {}) from {} to {}", iname(0), d, dstr(n), dstr(start), dstr(end));
  if (!at_most(start, end, what + ": start must not exceed end", iname(0)) || !at_most(end, n, what + ": end must not exceed the dim", iname(0))) return;
  bool whole = obl_.decide(OblKind::Equal, start, pool_.constant(0)) == Decision::Holds && obl_.decide(OblKind::Equal, end, n) == Decision::Holds;
  if (!whole &&
      !dim_whole(0, d, fmt::format("a rank holds a contiguous block of the {} elements, and the slice [{}, {}) is not the whole dim, so its blocks are "
                                   "not the blocks of the ranks' pieces (a local slice of each shard would interleave them)",
                                   dstr(n), dstr(start), dstr(end))))
    return;
  Value& o = out() = x;
  o.shape[static_cast<std::size_t>(d)] = pool_.sub(end, start);
}

void Checker::split_op() {
  const Value& x = in(0);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  int k = static_cast<int>(p_.outs(*op_).size());
  ExprId n = x.shape[static_cast<std::size_t>(d)];
  std::vector<ExprId> sizes;
  if (at().shape != kNoIndex) {
    sizes = p_.shapes[at().shape];
    if (static_cast<int>(sizes.size()) != k)
      return report(CheckId::ShapeMismatch, fmt::format("Split of {} has {} `sizes` but {} outputs", iname(0), sizes.size(), k), iname(0));
    ExprId total = pool_.constant(0);
    for (ExprId e : sizes) total = pool_.add(total, e);
    if (!same_dim(total, n, fmt::format("Split of {} along dim {}: the sizes must add up to the dim", iname(0), d), iname(0))) return;
  } else {
    ExprId piece = pool_.div(n, pool_.constant(k));
    check_expr(piece, here(), fmt::format("Split of {} into {} equal pieces along dim {}", iname(0), k, d));
    sizes.assign(static_cast<std::size_t>(k), piece);
  }
  if (k > 1 &&
      !dim_whole(0, d,
                 fmt::format("each rank holds a contiguous block of the {} elements, so the pieces {} are not the pieces of the ranks' blocks (a fused "
                             "weight whose columns are [q | k | v] gives each rank parts of q and k, not its heads of each)",
                             dstr(n), sstr(sizes)),
                 fmt::format("; or lay the fused dim out per rank: Reshape {} to put a dim of the shard count before the {} pieces (e.g. [..., tp, {}, "
                             "{}/({}*tp)]: Megatron's per-rank interleave), split the unsharded pieces dim and reshape back",
                             iname(0), k, k, dstr(n), k)))
    return;
  for (int j = 0; j < k; ++j) {
    Value& o = out(j) = x;
    o.shape[static_cast<std::size_t>(d)] = sizes[static_cast<std::size_t>(j)];
  }
}

void Checker::concat_op(bool stack) {
  const Value& x = in(0);
  int ro = stack ? x.rank + 1 : x.rank;
  int d = norm_dim(at().dim, ro, "dim", iname(0));
  if (d < 0) return;
  std::vector<int> which;
  for (int i = 0; i < n_in(); ++i) which.push_back(i);
  if (!invariant_ok({0, 1, 2, 3, 4, 5, 6, 7})) return;
  Value& o = out();
  o.rank = static_cast<std::uint8_t>(ro);
  o.dtype = x.dtype;
  ExprId total = pool_.constant(0);
  for (int i = 0; i < n_in(); ++i) {
    const Value& y = in(i);
    o.uneven |= y.uneven;
    if (y.rank != x.rank)
      return report(CheckId::ShapeMismatch, fmt::format("{} joins {} (rank {}) with {} (rank {}); the ranks must be equal", opname(), iname(0), x.rank, iname(i), y.rank),
                    iname(i));
    for (int e = 0; e < x.rank; ++e) {
      if (!stack && e == d) continue;
      if (!same_dim(y.shape[static_cast<std::size_t>(e)], x.shape[static_cast<std::size_t>(e)],
                    fmt::format("{} joins {} and {}: dim {} must be equal", opname(), iname(0), iname(i), e), iname(i)))
        return;
    }
    if (!stack) {
      total = pool_.add(total, y.shape[static_cast<std::size_t>(d)]);
      if (n_in() > 1 &&
          !dim_whole(i, d,
                     "each rank would join its own blocks, which interleaves the inputs instead of putting one after the other (concatenating "
                     "along a sharded dim is never the concatenation of the shards)"))
        return;
    }
  }
  for (int e = 0; e < ro; ++e) {
    int src = stack ? (e < d ? e : e - 1) : e;
    o.shape[static_cast<std::size_t>(e)] = stack && e == d ? pool_.constant(n_in()) : !stack && e == d ? total : x.shape[static_cast<std::size_t>(src)];
  }
  // Stack: combine in the inputs' dims, then move shards of dims at or after the new one up by one.
  if (!join_layout(o, which, x.rank, [&](int i, int a) { return pin(i, a); }) || !stack) return;
  for (auto& p : o.pl)
    if (p.is_s() && p.dim >= d) p.dim = static_cast<std::int16_t>(p.dim + 1);
}

void Checker::pad_op() {
  const Value& x = in(0);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  ExprId zero = pool_.constant(0);
  ExprId before = size_arg("before", zero), after = size_arg("after", zero);
  bool none = obl_.decide(OblKind::Equal, before, zero) == Decision::Holds && obl_.decide(OblKind::Equal, after, zero) == Decision::Holds;
  if (!none && !dim_whole(0, d,
                          "every rank would pad its own block, which puts padding between the shards instead of at the ends of the dim"))
    return;
  double value = at().has_number ? at().number : 0.0;
  Value& o = out() = x;
  o.shape[static_cast<std::size_t>(d)] = pool_.add(pool_.add(before, x.shape[static_cast<std::size_t>(d)]), after);
  if (none || value == 0) return;  // zeros: the sum, average, max and min of zeros over the ranks are zero
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p() && pin(0, a).op == ReduceOp::Sum)
      return partial_misuse(0, a, fmt::format("every rank pads with {}, so the pending sum makes the padding {} times {}", value, axsize(a), value),
                            fmt::format("pad with 0, or reduce first: {}", fix_allreduce(iname(0), a)));
}

void Checker::arange() {
  Value& o = out();
  ExprId start = size_arg("start", pool_.constant(0)), end = size_arg("end", pool_.constant(0));
  if (!at_most(start, end, "Arange: start must not exceed end", oname(0))) return;
  o.rank = 1;
  o.shape[0] = pool_.sub(end, start);
  o.dtype = at().has_dtype ? at().dtype : DType::I64;
  for (int a = 0; a < axes(); ++a) o.pl[static_cast<std::size_t>(a)] = Placement::r();
}

// Full: a constant of the given shape, the same on every rank.
void Checker::full() {
  Value& o = out();
  set_shape(o, p_.shapes[at().shape]);
  o.dtype = at().has_dtype ? at().dtype : DType::F32;
  for (int a = 0; a < axes(); ++a) o.pl[static_cast<std::size_t>(a)] = Placement::r();
}

// Positions and indices carry no gradient, so an I one is as good as R (no invariant-mix with them).
void Checker::rope() {
  const Value& x = in(0);
  const Value& pos = in(1);
  if (x.rank < 2) return report(CheckId::ShapeMismatch, fmt::format("RoPE needs x of rank 2 or more ([..., S, ..., D]), {} has rank {}", iname(0), x.rank), iname(0));
  int d = norm_dim(at().dim == kUnset ? (x.rank >= 3 ? -3 : -2) : at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  int last = x.rank - 1;
  if (d == last) return report(CheckId::ShapeMismatch, fmt::format("RoPE's sequence dim {} is the rotated (last) dim of {}", d, iname(0)), iname(0));
  if (pos.rank != 1)
    return report(CheckId::ShapeMismatch, fmt::format("RoPE takes positions of rank 1 ([S]), {} has rank {}", iname(1), pos.rank), iname(1));
  ExprId D = x.shape[static_cast<std::size_t>(last)];
  if (auto cd = obl_.concrete(D); cd && *cd % 2)
    return report(CheckId::ShapeMismatch, fmt::format("RoPE rotates pairs of the last dim of {}, which has odd size {}", iname(0), dstr(D)), iname(0));
  ExprId s = x.shape[static_cast<std::size_t>(d)];
  int zz = zz_of(0, d);  // tokens reordered by LoadBalance: the positions must be reordered alike
  if (!same_dim(pos.shape[0], s,
                fmt::format("RoPE of {} at positions {}: the positions must be the global positions of all {} tokens of dim {} (under sequence or "
                            "context parallelism a rank using 0..{}/N-1 instead of its global offsets is the classic bug; take Arange(end: {}){} and let "
                            "RoPE read each rank's slice)",
                            iname(0), iname(1), dstr(s), d, dstr(s), dstr(s),
                            zz >= 0 ? fmt::format(", reorder it with {{op: LoadBalance, axis: {}, dim: 0}} as the tokens were (dim {} of {} is in zigzag order)",
                                                  axn(zz), d, iname(0))
                                    : ""),
                iname(1)))
    return;
  if (!same_order(0, d, 1, 0)) return;
  Value& o = out() = x;
  for (int a = 0; a < axes(); ++a) {
    Placement xp = pin(0, a), pp = pin(1, a);
    if (pp.is_i()) pp = Placement::r();
    if (pp.is_p())
      return partial_misuse(1, a, "the rotation angle is not linear in the positions, so each rank would rotate by its own summand");
    if (xp.is_s(last)) {
      std::vector<Note> notes;
      origin_note(notes, x, a);
      notes.push_back(fix(fix_allgather(iname(0), a, last) + "; or shard the heads instead"));
      return report(CheckId::ShardedReductionDim,
                    fmt::format("RoPE needs dim {} of {} whole, but it is sharded {} over {}; rotate-half pairs element i with element i + D/2, which "
                                "another rank holds",
                                last, iname(0), ps(xp), axn(a)),
                    iname(0), std::move(notes));
    }
    if (xp.is_p()) {
      if (!pp.is_r())
        return partial_misuse(0, a, fmt::format("the positions {} are {} over {}; rotating each summand at per-rank positions is not the rotation of the sum",
                                                iname(1), ps(pp), axn(a)));
      auto r = reduce_through(PointwiseMap::times_unknown_sign(), xp.op);
      if (!r)
        return partial_misuse(0, a, fmt::format("a rotation mixes pairs of elements with signs, so it does not commute with a pending {}", reduce_name(xp.op)));
      set_from(o, a, Placement::p(*r), 0);
      continue;
    }
    if (pp.is_s()) {  // S(0) of the positions lines up with S(d) of x
      if (xp.is_s(d)) continue;
      if (xp.is_r() || xp.is_v()) {
        if (!slice_ok(0, a, d, 1)) return;
        set_from(o, a, Placement::s(d), 1);
        continue;
      }
      return layout_conflict(fmt::format("RoPE of {} ({} over {}) at positions {} (S(0) over {}): the positions are split along x's dim {}, x is not, so "
                                         "the local pieces do not line up",
                                         iname(0), ps(xp), axn(a), iname(1), axn(a), d),
                             iname(1), 1, a, fix_allgather(iname(1), a, 0));
    }
    // R (or V) positions against x S(dim) are read as their slice of x's block: no inner axis may cut them already
    if (xp.is_s(d) && (pp.is_r() || pp.is_v()) && !slice_ok(1, a, 0, 0)) return;
    if (pp.is_v() && (xp.is_r() || xp.is_i())) set_new(o, a, Placement::v(), fmt::format("RoPE at per-rank positions {} (V over {})", iname(1), axn(a)));
    // positions R (sliced to x's block when x is S(d)) or V with x V or S: x's placement stays
  }
}

void Checker::index_select() {
  const Value& x = in(0);
  const Value& idx = in(1);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  if (idx.rank != 1)
    return report(CheckId::ShapeMismatch, fmt::format("IndexSelect takes a 1-D index ([k]), {} has rank {}", iname(1), idx.rank), iname(1));
  if (!dim_whole(0, d, "the indices are global, and a rank holds only its block of the indexed dim (a vocab-sharded table is Embedding's masked lookup)"))
    return;
  Value& o = out() = x;
  o.shape[static_cast<std::size_t>(d)] = idx.shape[0];
  for (int a = 0; a < axes(); ++a) {
    Placement xp = pin(0, a), ip = pin(1, a);
    if (ip.is_i()) ip = Placement::r();
    if (ip.is_p()) return partial_misuse(1, a, "an index pending a reduction is not an index yet: each rank would select with its own summand");
    if (ip.is_r()) continue;  // selection commutes with every pending reduction and keeps other dims' shards
    if (ip.is_s()) {          // each rank selects its own indices: S(d) of the output, if x is whole on this axis
      if (xp.is_r()) {
        set_from(o, a, Placement::s(d), 1);
        continue;
      }
      if (xp.is_p())
        return partial_misuse(0, a, fmt::format("the index {} is {} over {}, so each rank selects different rows of its own summand", iname(1), ps(ip), axn(a)));
      return layout_conflict(fmt::format("IndexSelect of {} ({} over {}) with the index {} sharded over {}: each rank needs the whole of {} to select "
                                         "its own indices from",
                                         iname(0), ps(xp), axn(a), iname(1), axn(a), iname(0)),
                             iname(0), 0, a, xp.is_s() ? fix_allgather(iname(0), a, xp.dim) : "make the table R over " + axn(a));
    }
    // V index (per-rank indices): a per-rank selection
    if (xp.is_p()) return partial_misuse(0, a, fmt::format("the index {} is per-rank (V over {}), so each rank selects different rows of its own summand", iname(1), axn(a)));
    set_new(o, a, Placement::v(), fmt::format("IndexSelect at per-rank indices {} (V over {})", iname(1), axn(a)));
  }
}

void Checker::index_add() {
  const Value& x = in(0);
  const Value& idx = in(1);
  const Value& src = in(2);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  if (idx.rank != 1) return report(CheckId::ShapeMismatch, fmt::format("IndexAdd takes a 1-D index ([k]), {} has rank {}", iname(1), idx.rank), iname(1));
  if (src.rank != x.rank)
    return report(CheckId::ShapeMismatch, fmt::format("IndexAdd adds {} (rank {}) into {} (rank {}); the ranks must be equal", iname(2), src.rank, iname(0), x.rank),
                  iname(2));
  for (int e = 0; e < x.rank; ++e)
    if (!same_dim(src.shape[static_cast<std::size_t>(e)], e == d ? idx.shape[0] : x.shape[static_cast<std::size_t>(e)],
                  fmt::format("IndexAdd of {} into {}: dim {} of the source must be {}", iname(2), iname(0), e, e == d ? "the index length" : "x's"), iname(2)))
      return;
  if (!invariant_ok({0, 2})) return;
  if (!dim_whole(0, d, "the indices are global, and a rank holds only its block of the indexed dim")) return;
  // A local scatter: the index and the source cut alike along the index (each rank holds its own rows and their
  // indices, e.g. its routed tokens) into a target whole along dim d. Each rank adds its rows into its own copy:
  // the ranks' results are partial sums of the scatter (Megatron's tokens-per-expert count, then an AllReduce).
  std::uint32_t local = shard_mask(src, d);
  if (shard_mask(idx, 0) != local) local = 0;
  else
    for (int a = 0; a < axes(); ++a)
      if ((local >> a) & 1u && !(pin(1, a).is_s(0) && pin(1, a).ord == pin(2, a).ord)) local = 0;
  if (local != shard_mask(src, d) &&
      !dim_whole(2, d, "each source row goes to the row its index names, and this rank holds only some of the source's rows but every index (cut "
                       "the index along with the source for a per-rank scatter into a whole target)"))
    return;
  Value& o = out() = x;
  o.uneven = x.uneven || src.uneven;
  for (int a = 0; a < axes(); ++a) {
    Placement xp = pin(0, a), ip = pin(1, a), sp = pin(2, a);
    if (ip.is_i()) ip = Placement::r();
    if ((local >> a) & 1u) {
      // x + sum over ranks of (this rank's rows scattered): a pending sum when x is one (each rank holds a summand)
      // or per-rank values when x is; a replicated x would be counted once per rank
      if (xp.is_v()) {
        set_new(o, a, Placement::v(), fmt::format("IndexAdd of this rank's rows of {} (S({}) over {}) into its own {}", iname(2), d, axn(a), iname(0)));
        o.fresh |= 1u << a;
      } else if (xp.is_p() && xp.op == ReduceOp::Sum) {
        set_from(o, a, xp, 0);
      } else if (xp.is_p() || xp.is_s()) {
        return partial_misuse(0, a, fmt::format("each rank adds its own rows of {} (S({}) over {}) into {}, which is {}: the results are partial sums, "
                                                "which only a pending sum or per-rank values take",
                                                iname(2), d, axn(a), iname(0), ps(xp)));
      } else {
        std::vector<Note> notes;
        notes.push_back(fix(fmt::format("scatter into a per-rank buffer: declare {} `P` over {} (each rank's zeros are a summand of zero) or `V` "
                                        "(per-rank values), and add a replicated starting value after the AllReduce",
                                        iname(0), axn(a))));
        report(CheckId::PartialMisuse,
               fmt::format("IndexAdd adds this rank's rows of {} (S({}) over {}, with their indices {}) into {}, which is {} over {}: each rank holds {} plus "
                           "its partial scatter, so summing the ranks' results counts {} {} times",
                           iname(2), d, axn(a), iname(1), iname(0), ps(xp), axn(a), iname(0), iname(0), axsize(a)),
               iname(0), std::move(notes));
        return;
      }
      continue;
    }
    if (ip.is_p()) return partial_misuse(1, a, "an index pending a reduction is not an index yet");
    if (!ip.is_r()) {
      if (ip.is_v() && (xp.is_v() || xp.is_r()) && (sp.is_v() || sp.is_r())) {
        set_new(o, a, Placement::v(), fmt::format("IndexAdd at per-rank indices {} (V over {})", iname(1), axn(a)));
        continue;
      }
      return layout_conflict(fmt::format("IndexAdd into {} with the index {} {} over {}: every rank must add its rows at the same places (a sharded "
                                         "index with a sharded source is a scatter across ranks: AllGather both first)",
                                         iname(0), iname(1), ps(ip), axn(a)),
                             iname(1), 1, a, ip.is_s() ? fix_allgather(iname(1), a, 0) : "make the index R over " + axn(a));
    }
    // out = x + scatter(src): linear in (x, src), so it combines like Add of x and src
    if (xp.is_p() || sp.is_p()) {
      if (xp == sp && xp.linear_partial()) {
        set_from(o, a, xp, 0);
        continue;
      }
      int pi = xp.is_p() ? 0 : 2, oi = 2 - pi;
      Placement part = pin(pi, a), other = pin(oi, a);
      if (other.is_r() && part.op != ReduceOp::Sum && part.linear_partial()) {  // avg with R: every rank adds the same, which avg keeps
        set_from(o, a, part, pi);
        continue;
      }
      return partial_misuse(pi, a,
                            other.is_r() ? fmt::format("every rank adds {} (R), so the pending sum counts it {} times", iname(oi), axsize(a))
                                         : fmt::format("{} is {}; only two pending sums (or averages) add up", iname(oi), ps(other)));
    }
    if (!combine_layout(o, a, 0, xp, 2, sp, o.rank)) return;
  }
}

}  // namespace spmd::detail
