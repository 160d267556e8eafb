// autograd/vjp_tensor.cpp - the VJPs of the tensor ops of issue 10 (see deriver.h).
//
// Slice and Pad are each other's transpose; Concat's VJP slices the gradient, Split's pads each piece's
// gradient back to the whole dim (the contributions add up); Stack slices and drops the new dim; RoPE's
// is the rotation by the opposite angle; IndexAdd passes dy to x and selects it for the source; CumSum's is the
// running sum the other way (dx_i = sum_{j >= i} dy_j).
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

namespace {

ExprId size_or(const Program& p, const Op& op, const char* attr, ExprId dflt) {
  ExprId e = p.size_attr(op, attr);
  return e < 0 ? dflt : e;
}

}  // namespace

// Pads g back to `n` along dim d: [before, n - before - len) holds g.
NameId Deriver::pad_back(NameId g, int d, ExprId before, ExprId n, ExprId len, NameId dst) {
  Op o = make(OpKind::Pad);
  o.attrs.dim = static_cast<std::int16_t>(d);
  P().set_size_attr(o, "before", before);
  P().set_size_attr(o, "after", P().exprs.sub(P().exprs.sub(n, before), len));
  return emit(o, {g}, dst);
}

NameId Deriver::slice_of(NameId g, int d, ExprId start, ExprId end, NameId dst) {
  Op o = make(OpKind::Slice);
  o.attrs.dim = static_cast<std::int16_t>(d);
  P().set_size_attr(o, "start", start);
  P().set_size_attr(o, "end", end);
  return emit(o, {g}, dst);
}

void Deriver::slice_vjp() {
  int d = norm_dim(op_->attrs.dim, tin(0).rank);
  ExprId n = tin(0).shape[static_cast<std::size_t>(d)];
  ExprId start = size_or(f_, *op_, "start", P().exprs.constant(0)), end = size_or(f_, *op_, "end", n);
  contribute_in(0, exact(0), [&](NameId dst) { pad_back(dy(), d, start, n, P().exprs.sub(end, start), dst); });
}

void Deriver::pad_vjp() {
  int d = norm_dim(op_->attrs.dim, tin(0).rank);
  ExprId n = tin(0).shape[static_cast<std::size_t>(d)];
  ExprId before = size_or(f_, *op_, "before", P().exprs.constant(0));
  contribute_in(0, exact(0), [&](NameId dst) { slice_of(dy(), d, before, P().exprs.add(before, n), dst); });
}

void Deriver::split_vjp() {
  int d = norm_dim(op_->attrs.dim, tin(0).rank);
  ExprId n = tin(0).shape[static_cast<std::size_t>(d)], at = P().exprs.constant(0);
  for (int k = 0; k < op_->n_out; ++k) {
    ExprId len = tout(k).shape[static_cast<std::size_t>(d)];
    if (grad_[out_ver(k)] >= 0) {
      Placements w = want_in(0);
      for (int a = 0; a < axes(); ++a)
        if (tout(k).pl[static_cast<std::size_t>(a)].is_v() && !tin(0).pl[static_cast<std::size_t>(a)].is_v()) w[static_cast<std::size_t>(a)] = Placement::v();
      contribute_in(0, w, [&](NameId dst) { pad_back(dy(k), d, at, n, len, dst); });
    }
    at = P().exprs.add(at, len);
  }
}

void Deriver::concat_vjp(bool stack) {
  int ro = tout().rank;
  int d = norm_dim(op_->attrs.dim, ro);
  ExprId at = P().exprs.constant(0);
  for (int k = 0; k < op_->n_in; ++k) {
    ExprId len = stack ? P().exprs.constant(1) : tin(k).shape[static_cast<std::size_t>(d)];
    ExprId start = at, end = P().exprs.add(at, len);
    at = end;
    if (!needs_[in_ver(k)]) continue;
    contribute_in(k, exact(k), [&](NameId dst) {
      if (!stack) return (void)slice_of(dy(), d, start, end, dst);
      NameId piece = slice_of(dy(), d, start, end, tmp(dst, "slice"));
      Op o = make(OpKind::Reshape);
      o.attrs.shape = shape(tin(k).dims());
      emit(o, {piece}, dst);
    });
  }
}

void Deriver::rope_vjp() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = make(OpKind::RoPE);
    o.attrs = op_->attrs;
    o.attrs.inverse = !op_->attrs.inverse;
    P().add_op(*list_, o, std::array<NameId, 2>{dy(), fin(1)}, std::array<NameId, 1>{dst});
    d_.forward_op.push_back(op_idx_);
  });
}

void Deriver::index_add_vjp() {
  if (needs_[in_ver(0)]) contribute_in(0, exact(0), [&](NameId dst) { cast_to(dy(), tin(0).dtype, dst); });
  if (!needs_[in_ver(2)]) return;
  contribute_in(2, exact(2), [&](NameId dst) {
    Op o = make(OpKind::IndexSelect);
    o.attrs.dim = op_->attrs.dim;
    emit(o, {dy(), fin(1)}, dst);
  });
}

void Deriver::cumsum_vjp() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = make(OpKind::CumSum);
    o.attrs.dim = op_->attrs.dim;
    o.attrs.reverse = !op_->attrs.reverse;
    emit(o, {dy()}, dst);
  });
}

}  // namespace spmd::autograd_detail
