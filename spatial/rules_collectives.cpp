// spatial/rules_collectives.cpp - placement and shape rules of the collectives and point-to-point
//
// Ops: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, Scatter, Gather, Recv (its Send),
// and the cross-program comparison of matched collectives. Dispatched from Checker::apply() in rules.cpp.
#include "ir/printer.h"
#include "spatial/checker.h"

namespace spmd::detail {

std::vector<int> Checker::coll_axes(bool innermost_first) const {
  std::vector<int> v;
  for (int a = 0; a < axes(); ++a)
    if (at().axes & (1u << a)) v.push_back(a);
  if (innermost_first) std::reverse(v.begin(), v.end());
  return v;
}

// Adding a shard of axis a to dim d keeps mesh order only if a is inner to every axis already there.
bool Checker::can_add_shard(const Value& v, int d, int a) {
  // FSDP2 shards the local shard: a ZeRO op appends its axis innermost to the dim's shard order, whatever the
  // mesh order (DTensor's _StridedShard; set_new records the order)
  if (op_->kind == OpKind::ZeROScatterGrad || op_->kind == OpKind::ZeROPartitionOptState) return true;
  int ord[kMaxAxes];
  int k = shard_order(v.pl.data(), axes(), d, ord);
  if (k >= 2 && pl_of(v, ord[0]).ord) {  // conservative: a shard is added only to a dim cut in mesh order
    illegal(fmt::format("{} over {} would shard dim {} of {} again, but that dim is cut in a shard order other than mesh order ({} major); adding a "
                        "shard to it is not supported",
                        opname(), axn(a), d, iname(0), axn(ord[0])),
            -1, fmt::format("gather over {} first", axn(ord[k - 1])));
    return false;
  }
  std::uint32_t m = shard_mask(v, d);
  for (int b = a + 1; b < axes(); ++b)
    if (m & (1u << b)) {
      illegal(fmt::format("{} over {} would shard dim {} of {} outside mesh order: dim {} is already sharded over {}, which is inner to {}; "
                          "the pieces would interleave (a strided layout no placement describes)",
                          opname(), axn(a), d, iname(0), d, axn(b), axn(a)),
              -1, fmt::format("shard over {} first, or gather over {} before this op", axn(a), axn(b)));
      return false;
    }
  return true;
}

bool Checker::can_remove_shard(const Value& v, int d, int a) {
  int ord[kMaxAxes];
  int k = shard_order(v.pl.data(), axes(), d, ord);
  if (k >= 2 && pl_of(v, ord[0]).ord) {  // a shard order other than mesh order: only its innermost (last) axis comes off
    if (ord[k - 1] == a) return true;
    std::string order;
    for (int i = 0; i < k; ++i) order += (i ? ", " : "") + axn(ord[i]);
    illegal(fmt::format("{} over {} gathers dim {} of {}, whose shard order is [{}] (major first): {} is not the innermost axis of that order, so the "
                        "gathered pieces would not be contiguous (a strided result, DTensor's _StridedShard)",
                        opname(), axn(a), d, iname(0), order, axn(a)),
            -1, fmt::format("gather over {} first", axn(ord[k - 1])));
    return false;
  }
  std::uint32_t m = shard_mask(v, d);
  for (int b = a + 1; b < axes(); ++b)
    if (m & (1u << b)) {
      illegal(fmt::format("{} over {} gathers dim {} of {}, which is also sharded over the inner axis {}: the gathered pieces would not be "
                          "contiguous",
                          opname(), axn(a), d, iname(0), axn(b)),
              -1, fmt::format("gather over {} first (or over both axes at once)", axn(b)));
      return false;
    }
  return true;
}

// The root rank (`src` of Broadcast/Scatter, `dst` of Reduce/Gather) indexes the op's whole group: its axes
// in mesh order (rank = row-major coordinate), as the interpreter and torch.distributed's group ranks do. With
// a symbolic axis size the bound is an obligation (rank < group size for every allowed size).
bool Checker::rank_in_group() {
  if (at().rank < 0) return true;
  ExprId n = mask_size(at().axes);
  std::string group = mask_names(at().axes);
  const char* attr = op_->kind == OpKind::Reduce || op_->kind == OpKind::Gather ? "dst" : "src";
  ExprId room = pool_.sub(n, pool_.constant(at().rank));  // n - rank >= 1
  Decision dec = obl_.decide(OblKind::Positive, room, room);
  if (dec == Decision::Fails) {
    auto k = obl_.concrete(n);
    report(CheckId::IllegalCollective,
           fmt::format("{} names rank {} of {} (`{}: {}`), which has only {} ranks", opname(), at().rank,
                       std::popcount(at().axes) > 1 ? "the group " + group : "axis " + group, attr, at().rank, k ? std::to_string(*k) : dstr(n)),
           iname(0));
    return false;
  }
  if (dec == Decision::Deferred && obl_.first_time(OblKind::Positive, room, room))
    obl_.push({OblKind::Positive, room, room, CheckId::IllegalCollective, here(), op_idx_, iname(0),
               fmt::format("{} names rank {} (`{}: {}`) of {}, which must have more than {} ranks ({} - {} must be positive)", opname(), at().rank, attr,
                           at().rank, group, at().rank, dstr(n), at().rank),
               {}});
  return true;
}

// A reduction with `rop` over axis a (of the op's axes) of input 0. A value pending over several axes means
// the reduction of the innermost axis first (docs/semantics.md, section 1), so an inner axis (not reduced by
// this op) that is still P(op2) must commute with rop (ir/placement.h, reductions_commute). A V whose ranks
// hold the whole value (made from a replicated one) is not a set of summands: a sum counts it once per
// rank. False after a report.
bool Checker::reduction_ok(int a, ReduceOp rop) {
  Placement p = pin(0, a);
  if (p.is_p())
    for (int b = a + 1; b < axes(); ++b) {
      Placement q = pin(0, b);
      if ((at().axes >> b) & 1u || !q.is_p() || reductions_commute(rop, q.op)) continue;
      std::vector<Note> notes;
      origin_note(notes, in(0), b);
      notes.push_back(fix(fmt::format("reduce over the inner axis first: insert {{op: AllReduce, in: [{}], out: {}_{}, axis: {}, reduce: {}}} "
                                      "before this op",
                                      iname(0), iname(0), axn(b), axn(b), reduce_name(q.op))));
      report(CheckId::IllegalCollective,
             fmt::format("{}({}) over {} of {}, which is also {} over {}: a value pending over both axes is the {} over {} of the {} over the inner "
                         "axis {}, and reducing {} first computes the {} of {}s instead, which differs",
                         opname(), reduce_name(rop), axn(a), iname(0), ps(q), axn(b), reduce_name(rop), axn(a), reduce_name(q.op), axn(b), axn(a),
                         reduce_name(q.op), reduce_name(rop)),
             iname(0), std::move(notes));
      return false;
    }
  if (rop == ReduceOp::Sum && whole_v(in(0), a)) {
    illegal(fmt::format("{}(sum) over {} of {}, which is V over {} but holds the whole value on every rank (it was made from a replicated value): "
                        "reading the copies as summands counts it {} times",
                        opname(), axn(a), iname(0), axn(a), axsize(a)),
            a, "reduce with `reduce: avg` (or max, min), which keeps the value, or do not convert the replicated value to V");
    return false;
  }
  return true;
}

void Checker::all_reduce() {
  Value& o = out() = in(0);
  ReduceOp rop = at().rop;
  // When the input is whole or sharded on this axis but pending on another, the axis is the likely mistake.
  std::uint32_t pending_mask = 0;
  auto wrong_axis = [&]() -> std::string {
    std::vector<std::string> pend;
    pending_mask = 0;
    for (int b = 0; b < axes(); ++b)
      if (pin(0, b).is_p() && !(at().axes & (1u << b))) {
        pend.push_back(axn(b));
        pending_mask |= 1u << b;
      }
    if (pend.empty()) return "";
    std::string list = pend[0];
    for (std::size_t k = 1; k < pend.size(); ++k) list += ", " + pend[k];
    return fmt::format("{} is pending over {}: reduce over that instead, `axis: {}`", iname(0), list, pend.size() == 1 ? list : "[" + list + "]");
  };
  // ... and the fix, in machine-readable form: this op with its axis replaced.
  auto retarget = [&](const std::string& w) {
    if (w.empty() || diags_.empty()) return;
    Op changed = *op_;
    changed.attrs.axes = pending_mask;
    diags_.back().fix = {FixKind::Replace, op_idx_, op_->loc.line, "", print_op(p_, changed)};
  };
  for (int a : coll_axes(false)) {
    Placement p = pin(0, a);
    Placement dst = at().dst_invariant ? Placement::i() : Placement::r();
    std::string why = fmt::format("AllReduce({}) over {}", reduce_name(rop), axn(a));
    if (p.is_p()) {
      if (p.op != rop)
        return illegal(fmt::format("AllReduce({}) of {}, which is {} over {}: the reduce op must match the pending reduction", reduce_name(rop),
                                   iname(0), ps(p), axn(a)),
                       a, fmt::format("use `reduce: {}`", reduce_name(p.op)));
      if (!reduction_ok(a, rop)) return;
      set_new(o, a, dst, why);
    } else if (p.is_v()) {
      if (!reduction_ok(a, rop)) return;
      set_new(o, a, dst, why);
    } else if (p.is_s()) {
      std::string w = wrong_axis();
      illegal(fmt::format("AllReduce of {}, which is S({}) over {}: its shards are different pieces of one tensor, not summands", iname(0), p.dim, axn(a)), a,
              w.empty() ? fmt::format("use {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} to assemble the pieces", iname(0), iname(0), axn(a), p.dim)
                        : w);
      return retarget(w);
    } else if (rop == ReduceOp::Sum) {
      std::string w = wrong_axis();
      illegal(fmt::format("AllReduce of {}, which is already {} over {}: all-reducing a replicated value multiplies it by {}", iname(0), ps(p), axn(a),
                          axsize(a)),
              a, w.empty() ? std::string("remove this AllReduce (the value is already whole on every rank)") : w);
      return retarget(w);
    } else {
      set_from(o, a, p.is_i() && !at().dst_invariant ? Placement::r() : p, 0);  // avg/max/min of a replicated value is that value
    }
  }
}

void Checker::all_gather() {
  Value& o = out() = in(0);
  int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a : coll_axes(true)) {
    Placement p = pl_of(o, a);
    if (!p.is_s(d)) {
      std::string fix_text = p.is_s() ? fmt::format("gather the dim it is sharded on: `dim: {}`", p.dim)
                             : p.is_p() ? fmt::format("a pending sum needs {{op: AllReduce, in: [{}], out: {}_reduced, axis: {}}}", iname(0), iname(0), axn(a))
                             : p.is_v() ? "declare the pieces' layout (S(d)) with Convert or SPMDGuard first"
                                        : "remove this AllGather: the value is already whole on every rank";
      return illegal(fmt::format("AllGather over {} along dim {} of {}, which is {} over {}: AllGather assembles a tensor sharded S({})", axn(a), d,
                                 iname(0), ps(p), axn(a), d),
                     a, fix_text);
    }
    if (!can_remove_shard(o, d, a)) return;
    set_new(o, a, at().dst_invariant ? Placement::i() : Placement::r(), fmt::format("AllGather over {}", axn(a)));
  }
}

void Checker::reduce_scatter() {
  Value& o = out() = in(0);
  int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a : coll_axes(false)) {
    Placement p = pl_of(o, a);
    if (p.is_p() && p.op != at().rop)
      return illegal(fmt::format("ReduceScatter({}) of {}, which is {} over {}: the reduce op must match", reduce_name(at().rop), iname(0), ps(p), axn(a)),
                     a, fmt::format("use `reduce: {}`", reduce_name(p.op)));
    // avg, max and min of equal copies are the value: a replicated input is reduced to itself and sliced
    bool copies = (p.is_r() || p.is_i()) && at().rop != ReduceOp::Sum;
    if (!(p.is_p() || p.is_v() || copies))
      return illegal(fmt::format("ReduceScatter({}) over {} of {}, which is {} over {}: ReduceScatter takes a pending reduction (P) or per-rank "
                                 "summands (V){}",
                                 reduce_name(at().rop), axn(a), iname(0), ps(p), axn(a),
                                 p.is_r() || p.is_i() ? fmt::format("; a sum of the {} equal copies is {} times the value", axsize(a), axsize(a)) : ""),
                     a, p.is_r() || p.is_i() ? fmt::format("to split a replicated value use {{op: Convert, in: [{}], out: {}_shard, axis: {}, to: S({})}}",
                                                           iname(0), iname(0), axn(a), d)
                                             : "");
    if (!reduction_ok(a, at().rop)) return;
    if (!can_add_shard(o, d, a)) return;
    set_new(o, a, Placement::s(d), fmt::format("ReduceScatter over {} along dim {}", axn(a), d));
  }
}

void Checker::broadcast() {
  Value& o = out() = in(0);
  if (!rank_in_group()) return;
  for (int a : coll_axes(false)) {
    Placement p = pin(0, a);
    if (p.is_p() || p.is_s())
      return illegal(fmt::format("Broadcast over {} of {}, which is {} over {}: the source rank holds only {}, not the whole value", axn(a), iname(0),
                                 ps(p), axn(a), p.is_p() ? "a summand" : "a shard"),
                     a, p.is_p() ? fix_allreduce(iname(0), a, p) : fix_allgather(iname(0), a, p.dim));
    set_new(o, a, Placement::r(), fmt::format("Broadcast over {}", axn(a)));
  }
}

void Checker::reduce() {
  Value& o = out() = in(0);
  if (!rank_in_group()) return;
  for (int a : coll_axes(false)) {
    Placement p = pin(0, a);
    if (p.is_p() && p.op != at().rop)
      return illegal(fmt::format("Reduce({}) of {}, which is {} over {}: the reduce op must match", reduce_name(at().rop), iname(0), ps(p), axn(a)), a,
                     fmt::format("use `reduce: {}`", reduce_name(p.op)));
    bool copies = (p.is_r() || p.is_i()) && at().rop != ReduceOp::Sum;  // avg, max, min of equal copies: the value
    if (!(p.is_p() || p.is_v() || copies))
      return illegal(fmt::format("Reduce over {} of {}, which is {} over {}: Reduce takes a pending reduction (P) or per-rank summands (V)", axn(a),
                                 iname(0), ps(p), axn(a)),
                     a, p.is_s() ? fmt::format("use {{op: Gather, in: [{}], axis: {}, dim: {}}} to assemble the shards", iname(0), axn(a), p.dim)
                                 : "remove this Reduce: the value is already whole on every rank");
    if (!reduction_ok(a, at().rop)) return;
    set_new(o, a, Placement::v(), fmt::format("Reduce over {} leaves the result on rank {} only", axn(a), std::max(0, at().rank)));
    o.fresh |= 1u << a;
  }
}

void Checker::all_to_all() {
  Value& o = out() = in(0);
  int s = norm_dim(at().dim, in(0).rank, "split_dim", iname(0));
  if (s < 0) return;
  int c = norm_dim(at().dim2, in(0).rank, "concat_dim", iname(0));
  if (c < 0) return;
  if (at().shape != kNoIndex && !split_sizes_ok(s)) return;  // rules_mask.cpp
  // A list of axes is one group whose ranks are in mesh order (section 4): the shard of every listed axis
  // leaves concat_dim (they must be its innermost axes), then joins split_dim (inner to every axis already there).
  std::vector<int> moved;
  for (int a : coll_axes(true)) {
    Placement p = pl_of(o, a);
    if (p.is_v()) {
      // per-rank values stay per-rank (e.g. MoE token exchange), but each rank's split dim shrinks and its concat dim grows;
      // each rank now holds pieces of every rank's values, so even copies of one value become per-rank values
      o.fresh |= 1u << a;
      if (s == c) continue;
      ExprId n = axis_size(a), ds = o.shape[static_cast<std::size_t>(s)];
      std::string what = fmt::format("AllToAll over {} splits dim {} of {} ({}) into {} pieces, so it must be divisible by {}", axn(a), s, iname(0), dstr(ds),
                                     axsize(a), axsize(a));
      Decision dec = obl_.decide(OblKind::Divisible, ds, n);
      if (dec == Decision::Fails) return report(CheckId::ShapeMismatch, what + ", but it is not", iname(0));
      if (dec == Decision::Deferred && obl_.first_time(OblKind::Divisible, ds, n))
        obl_.push({OblKind::Divisible, ds, n, CheckId::ShapeMismatch, here(), op_idx_, iname(0), what, {}});
      o.shape[static_cast<std::size_t>(s)] = pool_.div(ds, n);
      o.shape[static_cast<std::size_t>(c)] = pool_.mul(o.shape[static_cast<std::size_t>(c)], n);
      continue;
    }
    if (!p.is_s(c) || s == c)
      return illegal(fmt::format("AllToAll over {} (split_dim {}, concat_dim {}) of {}, which is {} over {}: AllToAll turns S(concat_dim) into "
                                 "S(split_dim)",
                                 axn(a), s, c, iname(0), ps(p), axn(a)),
                     a, p.is_s() && s != p.dim ? fmt::format("use `concat_dim: {}`", p.dim)
                        : p.is_p()               ? fix_allreduce(iname(0), a, p)
                                                 : fmt::format("AllToAll needs the input sharded on concat_dim: make {} S({}) over {} first", iname(0), c, axn(a)));
    if (!can_remove_shard(o, c, a)) return;
    o.pl[static_cast<std::size_t>(a)] = Placement::r();
    moved.push_back(a);
  }
  if (!moved.empty() && moved.size() != coll_axes(true).size())
    return illegal(fmt::format("AllToAll over several axes of {}, which is V over some of them and S({}) over others: one group cannot both "
                               "exchange per-rank values and move a shard",
                               iname(0), c),
                   -1, "split it into one AllToAll per axis");
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) {  // outer axes first
    int a = *it;
    if (!can_add_shard(o, s, a)) return;
    set_new(o, a, Placement::s(s), fmt::format("AllToAll over {} from S({}) to S({})", axn(a), c, s));
  }
}

void Checker::scatter() {
  Value& o = out() = in(0);
  int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
  if (d < 0) return;
  if (!rank_in_group()) return;
  for (int a : coll_axes(false)) {
    Placement p = pl_of(o, a);
    if (p.is_p() || p.is_s())
      return illegal(fmt::format("Scatter over {} of {}, which is {} over {}: the source rank must hold the whole value", axn(a), iname(0), ps(p), axn(a)),
                     a, "");
    if (!can_add_shard(o, d, a)) return;
    set_new(o, a, Placement::s(d), fmt::format("Scatter over {} along dim {}", axn(a), d));
  }
}

void Checker::gather() {
  Value& o = out() = in(0);
  int d = norm_dim(at().dim, in(0).rank, "dim", iname(0));
  if (d < 0) return;
  if (!rank_in_group()) return;
  for (int a : coll_axes(true)) {
    Placement p = pl_of(o, a);
    if (!p.is_s(d))
      return illegal(fmt::format("Gather over {} along dim {} of {}, which is {} over {}: Gather assembles a tensor sharded S({})", axn(a), d, iname(0),
                                 ps(p), axn(a), d),
                     a, "");
    if (!can_remove_shard(o, d, a)) return;
    set_new(o, a, Placement::v(), fmt::format("Gather over {} leaves the whole tensor on rank {} only", axn(a), std::max(0, at().rank)));
    o.fresh |= 1u << a;
  }
}

// A Recv waits (in the round-robin over programs) until one of its Sends has been reached.
bool Checker::recv_waits(int i) const {
  if (p_.ops[static_cast<std::size_t>(i)].kind != OpKind::Recv) return false;
  auto it = recv_sends_.find(i);
  if (it == recv_sends_.end()) return false;
  return std::none_of(it->second.begin(), it->second.end(), [&](int s) { return sent_.count(s) > 0; });
}

// A Recv takes the type of its matching Send (every Send it pairs with, on every rank running
// it, must agree); a declared shape, dtype or placement is checked against it (p2p-mismatch).
// Without a reached Send (unmatched, or a deadlock) the declared type stands in, else nothing.
void Checker::recv() {
  Value& o = out();
  const Value* sent = nullptr;
  int send_op = -1;
  if (auto it = recv_sends_.find(op_idx_); it != recv_sends_.end())
    for (int s : it->second)
      if (auto v = sent_.find(s); v != sent_.end()) {
        if (!sent) {
          sent = &v->second;
          send_op = s;
        } else if (!sent->poisoned && !v->second.poisoned) {
          std::string why = type_difference(*sent, v->second);
          if (!why.empty())
            return report(CheckId::P2PMismatch,
                          fmt::format("Recv of {} pairs with Sends that disagree on different ranks: the Send at line {} sends {}, the Send at line {} "
                                      "sends {} ({})",
                                      oname(0), line_of(send_op), type_str(*sent), line_of(s), type_str(v->second), why),
                          oname(0), {{p_.ops[static_cast<std::size_t>(send_op)].loc, "one Send is here"}, {p_.ops[static_cast<std::size_t>(s)].loc, "the other Send is here"}});
        }
      }
  if (sent && sent->poisoned) {
    failed_ = true;  // the sent value already has an error: no cascade
    return;
  }
  if (sent) {
    o.rank = sent->rank;
    o.shape = sent->shape;
    o.dtype = sent->dtype;
    o.uneven = sent->uneven;
    for (int a = 0; a < axes(); ++a) {
      Placement pl = sent->pl[static_cast<std::size_t>(a)];
      o.pl[static_cast<std::size_t>(a)] = pl;
      if (!pl.is_r())
        o.origin[static_cast<std::size_t>(a)] =
            new_origin(here(), oid(0), pl, a, fmt::format("received from the Send at line {}", line_of(send_op)));
    }
    check_declared(*sent, send_op);
    return;
  }
  if (at().shape == kNoIndex) {
    failed_ = true;  // no Send reached it and no declared type: unmatched-p2p or a deadlock says why
    return;
  }
  set_shape(o, p_.shapes[at().shape]);
  if (at().has_dtype) o.dtype = at().dtype;
  if (at().placements != kNoIndex) {
    const Placements& pm = p_.placement_maps[at().placements];
    for (int a = 0; a < axes(); ++a) {
      Placement pl = pm[static_cast<std::size_t>(a)];
      if (pl.is_s()) {
        int d = norm_dim(pl.dim, o.rank, "placement dim", oname(0));
        if (d < 0) return;
        pl.dim = static_cast<std::int16_t>(d);
      }
      set_new(o, a, pl, fmt::format("declared {} by this Recv", ps(pl)));
    }
  }
}

std::string Checker::type_str(const Value& v) const {
  std::string pl;
  for (int a = 0; a < axes(); ++a) pl += (a ? ", " : "") + axn(a) + ": " + ps(v.pl[static_cast<std::size_t>(a)]);
  return fmt::format("{} {} {{{}}}", sstr(v.dims()), dtype_name(v.dtype), pl);
}

// Why two values differ (empty: they agree, or their dims differ only symbolically, left to the solver).
std::string Checker::type_difference(const Value& a, const Value& b, bool placements) {
  if (a.rank != b.rank) return fmt::format("rank {} vs {}", a.rank, b.rank);
  for (std::size_t d = 0; d < a.rank; ++d)
    if (obl_.decide(OblKind::Equal, a.shape[d], b.shape[d]) == Decision::Fails)
      return fmt::format("dim {} is {} vs {}", d, dstr(a.shape[d]), dstr(b.shape[d]));
  if (a.dtype != b.dtype) return fmt::format("dtype {} vs {}", dtype_name(a.dtype), dtype_name(b.dtype));
  if (placements)
    for (int x = 0; x < axes(); ++x)
      if (!(a.pl[static_cast<std::size_t>(x)] == b.pl[static_cast<std::size_t>(x)]))
        return fmt::format("{} vs {} over {}", ps(a.pl[static_cast<std::size_t>(x)]), ps(b.pl[static_cast<std::size_t>(x)]), axn(x));
  return "";
}

// Symbolic dims that may differ: an obligation, proved (or refuted with a counterexample) by Z3.
void Checker::defer_equal(const Value& a, const Value& b, CheckId id, const std::string& what_a, const std::string& what_b) {
  if (a.rank != b.rank) return;
  for (std::size_t d = 0; d < a.rank; ++d)
    if (obl_.decide(OblKind::Equal, a.shape[d], b.shape[d]) == Decision::Deferred && obl_.first_time(OblKind::Equal, a.shape[d], b.shape[d]))
      obl_.push({OblKind::Equal, a.shape[d], b.shape[d], id, here(), op_idx_, oname(0),
                 fmt::format("dim {} of {} ({}) must equal dim {} of {} ({})", d, what_b, dstr(b.shape[d]), d, what_a, dstr(a.shape[d])), {}});
}

// The Recv's declared shape, dtype and placement against what its Send sends.
void Checker::check_declared(const Value& sent, int send_op) {
  std::vector<Note> notes{{p_.ops[static_cast<std::size_t>(send_op)].loc, fmt::format("the matching Send (FIFO order per sender and receiver) is here")}};
  if (at().shape != kNoIndex) {
    Value want;
    set_shape(want, p_.shapes[at().shape]);
    want.dtype = sent.dtype;
    std::string why = type_difference(sent, want, false);
    if (!why.empty())
      return report(CheckId::P2PMismatch,
                    fmt::format("Recv of {} declares shape {}, but its matching Send sends {} ({})", oname(0), sstr(want.dims()), type_str(sent), why),
                    oname(0), notes);
    defer_equal(sent, want, CheckId::P2PMismatch, fmt::format("the value the Send at line {} sends", line_of(send_op)), "the declared shape of " + oname(0));
  }
  if (at().has_dtype && at().dtype != sent.dtype)
    return report(CheckId::P2PMismatch,
                  fmt::format("Recv of {} declares dtype {}, but its matching Send sends {}", oname(0), dtype_name(at().dtype), type_str(sent)), oname(0),
                  notes);
  if (at().placements != kNoIndex) {
    const Placements& pm = p_.placement_maps[at().placements];
    for (int a = 0; a < axes(); ++a) {
      Placement want = pm[static_cast<std::size_t>(a)];
      if (want.is_s() && want.dim < 0) want.dim = static_cast<std::int16_t>(want.dim + sent.rank);
      if (!(want == sent.pl[static_cast<std::size_t>(a)]))
        return report(CheckId::P2PMismatch,
                      fmt::format("Recv of {} declares {} over {}, but its matching Send sends {}", oname(0), ps(want), axn(a), type_str(sent)),
                      oname(0), notes);
    }
  }
}

// Matched collectives of different programs must agree on shape and dtype (kind, axis and
// reduce op are the temporal checker's: it reports those).
void Checker::compare_collectives(const std::vector<CollectivePair>& pairs, const RankSpace& space) {
  std::set<std::pair<int, int>> seen;
  for (const auto& c : pairs) {
    const Op& a = p_.ops[static_cast<std::size_t>(c.op_a)];
    const Op& b = p_.ops[static_cast<std::size_t>(c.op_b)];
    if (a.kind != b.kind || a.attrs.axes != b.attrs.axes || a.attrs.rop != b.attrs.rop) continue;
    if (!seen.insert({c.op_a, c.op_b}).second) continue;
    const Value& va = watched_[c.op_a];
    const Value& vb = watched_[c.op_b];
    if (va.poisoned || vb.poisoned || !va.defined || !vb.defined) continue;
    op_ = &b;
    op_idx_ = c.op_b;
    std::string why = type_difference(va, vb, false);
    std::string an = p_.name(p_.ins(a)[0]), bn = p_.name(p_.ins(b)[0]);
    if (!why.empty()) {
      Diagnostic d;
      d.id = CheckId::CollectiveMismatch;
      d.loc = b.loc;
      d.op = c.op_b;
      d.tensor = bn;
      d.message = fmt::format("{} is the {} collective of its group on rank {} with {} {}, but rank {} issues it with {} {} ({}): the ranks of a "
                              "group must exchange tensors of one shape and dtype",
                              op_name(b.kind), ordinal(c.seq + 1), space.label(p_, c.rank_b), bn, type_str(vb), space.label(p_, c.rank_a), an,
                              type_str(va), why);
      d.notes.push_back({a.loc, fmt::format("rank {} issues it here", space.label(p_, c.rank_a))});
      d.ranks = {space.label(p_, c.rank_a), space.label(p_, c.rank_b)};
      diags_.push_back(std::move(d));
      continue;
    }
    defer_equal(va, vb, CheckId::CollectiveMismatch, fmt::format("{} on rank {} (line {})", an, space.label(p_, c.rank_a), a.loc.line),
                fmt::format("{} on rank {}", bn, space.label(p_, c.rank_b)));
  }
}

}  // namespace spmd::detail
