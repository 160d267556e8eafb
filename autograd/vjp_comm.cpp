// autograd/vjp_comm.cpp - the VJPs of collectives and placement conversions (see deriver.h).
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

// AllReduce: P -> R is self-dual; P -> I (Megatron's g) has the identity backward, typed I -> R.
void Deriver::all_reduce() {
  const OpAttrs& at = op_->attrs;
  Placements have = want_in(0);
  Placements g = dy_pl();
  std::uint32_t reduce_axes = 0, invariant_axes = 0;
  for (int a : coll_axes()) {
    Placement x = tin(0).pl[static_cast<std::size_t>(a)];
    Placement d = g[static_cast<std::size_t>(a)];
    if (d.is_p()) reduce_axes |= 1u << a;
    else if (d.is_i()) invariant_axes |= 1u << a;
    have[static_cast<std::size_t>(a)] = x.is_p() || x.is_v() ? Placement::r() : Placement::p();
    if (!(x.is_p() || x.is_v())) reduce_axes &= ~(1u << a);  // avg/max/min of a whole value: the identity
  }
  bool concrete = true;
  std::int64_t n = axes_size(reduce_axes, concrete);
  contribute_in(0, have, [&](NameId dst) {
    NameId cur = dy();
    std::vector<std::function<NameId(NameId, NameId)>> steps;
    if (invariant_axes) {
      steps.push_back([&](NameId in, NameId out) {
        Op c = make(OpKind::Convert);
        c.attrs.axes = invariant_axes;
        c.attrs.to = Placement::r();
        c.attrs.has_to = true;
        return emit(c, {in}, out);
      });
    }
    if (reduce_axes) {
      steps.push_back([&](NameId in, NameId out) {
        Op r = make(OpKind::AllReduce);
        r.attrs.axes = reduce_axes;
        return emit(r, {in}, out);
      });
      if (at.rop == ReduceOp::Avg && concrete && n > 1)
        steps.push_back([&](NameId in, NameId out) {
          Op m = make(OpKind::Multiply);
          m.attrs.number = 1.0 / static_cast<double>(n);
          m.attrs.has_number = true;
          return emit(m, {in}, out);
        });
    }
    if (steps.empty()) return cast_to(cur, tin(0).dtype, dst);
    for (std::size_t i = 0; i < steps.size(); ++i) cur = steps[i](cur, i + 1 == steps.size() ? dst : tmp(dst, "s"));
  });
}

void Deriver::all_gather() {
  int d = norm_dim(op_->attrs.dim, tin(0).rank);
  contribute_in(0, exact(0), [&](NameId dst) {
    if (!op_->attrs.dst_invariant) {
      Op rs = coll(OpKind::ReduceScatter);
      rs.attrs.dim = static_cast<std::int16_t>(d);
      emit(rs, {dy()}, dst);
      return;
    }
    Op c = coll(OpKind::Convert);  // AllGather(S(d) -> I): the backward is the local slice, I -> R -> S(d)
    c.attrs.to = Placement::r();
    c.attrs.has_to = true;
    NameId r = emit(c, {dy()}, tmp(dst, "r"));
    Op s = coll(OpKind::Convert);
    s.attrs.to = Placement::s(d);
    s.attrs.has_to = true;
    emit(s, {r}, dst);
  });
}

void Deriver::reduce_scatter() {
  Placements have = want_in(0);
  for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::r();
  contribute_in(0, have, [&](NameId dst) {
    Op ag = coll(OpKind::AllGather);
    ag.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
    emit(ag, {dy()}, dst);
  });
}

void Deriver::all_to_all() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op t = coll(OpKind::AllToAll);
    t.attrs.dim = op_->attrs.dim2;
    t.attrs.dim2 = op_->attrs.dim;
    emit(t, {dy()}, dst);
  });
}

void Deriver::broadcast() {
  bool inv = false;
  for (int a : coll_axes()) inv |= tin(0).pl[static_cast<std::size_t>(a)].is_i();
  Placements have = want_in(0);
  for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = inv ? Placement::i() : Placement::v();
  contribute_in(0, have, [&](NameId dst) {
    if (inv) {  // broadcasting an invariant value changes nothing; its gradient is made invariant
      Op r = coll(OpKind::AllReduce);
      r.attrs.dst_invariant = true;
      emit(r, {dy()}, dst);
      return;
    }
    Op r = coll(OpKind::Reduce);
    r.attrs.rank = op_->attrs.rank;
    emit(r, {dy()}, dst);
  });
}

void Deriver::reduce() {
  Placements have = want_in(0);
  for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::r();
  contribute_in(0, have, [&](NameId dst) {
    Op b = coll(OpKind::Broadcast);
    b.attrs.rank = op_->attrs.rank;
    emit(b, {dy()}, dst);
  });
}

void Deriver::scatter() {
  Placements have = want_in(0);
  for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::v();
  contribute_in(0, have, [&](NameId dst) {
    Op g = coll(OpKind::Gather);
    g.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
    g.attrs.rank = op_->attrs.rank;
    emit(g, {dy()}, dst);
  });
}

void Deriver::gather() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op s = coll(OpKind::Scatter);
    s.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
    s.attrs.rank = op_->attrs.rank;
    emit(s, {dy()}, dst);
  });
}

// Convert and Reinterpret, per axis: I->R's dual is AllReduce(dst: I) (Megatron's f); R->S(d)'s is
// S(d)->P; S(d)->P's is R->S(d); V->P's is R->V; R->V's is V->P; Reinterpret R->P is self-dual.
void Deriver::conversion() {
  bool reinterpret = op_->kind == OpKind::Reinterpret;
  struct AxisStep {
    int axis;
    bool all_reduce;
    bool relabel;
    Placement from, to;
  };
  std::vector<AxisStep> steps;
  Placements have = want_in(0);
  for (int a : coll_axes()) {
    Placement x = tin(0).pl[static_cast<std::size_t>(a)], y = tout().pl[static_cast<std::size_t>(a)];
    if (x == y) continue;
    Placement gx = dual(x), gy = dual(y);
    if (x.is_i() && y.is_r()) steps.push_back({a, true, false, gy, gx});
    else if (!reinterpret || (x.is_v() && y.is_p()) || (x.is_r() && y.is_v())) steps.push_back({a, false, false, gy, gx});
    else steps.push_back({a, false, true, gy, gx});
  }
  (void)have;
  contribute_in(0, want_in(0), [&](NameId dst) {
    NameId cur = dy();
    if (steps.empty()) return cast_to(cur, tin(0).dtype, dst);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const AxisStep& s = steps[i];
      Op o = make(s.all_reduce ? OpKind::AllReduce : s.relabel ? OpKind::Reinterpret : OpKind::Convert);
      o.attrs.axes = 1u << s.axis;
      if (s.all_reduce) {
        o.attrs.dst_invariant = true;
      } else {
        o.attrs.to = s.to;
        o.attrs.has_to = true;
      }
      cur = emit(o, {cur}, i + 1 == steps.size() ? dst : tmp(dst, "s"));
    }
  });
}

}  // namespace spmd::autograd_detail
