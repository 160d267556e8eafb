// autograd/vjp_moe.cpp - the VJPs of the mixture-of-experts token exchange (see deriver.h).
//
// MoEDispatch and MoECombine are adjoint: the dispatch copies each token (times its routing weight) into a
// capacity slot, the combine sums the slots back into their tokens. So the gradient of one is the other, over
// the same axis, by the same indices (a dropped token gets no gradient, as it had no slot); the routing
// weights' gradient is the dot product of each token with its slot (MoEGateGrad), which then reaches the
// router through TopKGate's VJP.
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

namespace {

Op moe_op(const Op& base, OpKind k, std::uint32_t axes) {
  Op o = base;
  o.kind = k;
  o.attrs = OpAttrs{};
  o.attrs.axes = axes;
  o.attrs.stream = base.attrs.stream;
  return o;
}

}  // namespace

// buf = dispatch(x, idx, [w]): dx = combine(dbuf, idx, [w]); dw = gate_grad(x, dbuf, idx)
void Deriver::moe_dispatch() {
  bool weighted = op_->n_in == 3;
  contribute_in(0, exact(0), [&](NameId dst) {
    Op c = moe_op(make(OpKind::MoECombine), OpKind::MoECombine, op_->attrs.axes);
    if (weighted)
      emit(c, {dy(), fin(1), fin(2)}, dst);
    else
      emit(c, {dy(), fin(1)}, dst);
  });
  if (weighted)
    contribute_in(2, exact(2), [&](NameId dst) {
      emit(moe_op(make(OpKind::MoEGateGrad), OpKind::MoEGateGrad, op_->attrs.axes), {fin(0), dy(), fin(1)}, dst);
    });
}

// out = combine(y, idx, [w]): dy = dispatch(dout, idx, [w]) into y's buffer; dw = gate_grad(dout, y, idx)
void Deriver::moe_combine() {
  bool weighted = op_->n_in == 3;
  contribute_in(0, exact(0), [&](NameId dst) {
    Op d = moe_op(make(OpKind::MoEDispatch), OpKind::MoEDispatch, op_->attrs.axes);
    const ValueType& y = tin(0);
    ExprId buf[2] = {y.shape[static_cast<std::size_t>(y.rank - 3)], y.shape[static_cast<std::size_t>(y.rank - 2)]};
    d.attrs.shape = shape(std::span<const ExprId>(buf, 2));
    if (weighted)
      emit(d, {dy(), fin(1), fin(2)}, dst);
    else
      emit(d, {dy(), fin(1)}, dst);
  });
  if (weighted)
    contribute_in(2, exact(2), [&](NameId dst) {
      emit(moe_op(make(OpKind::MoEGateGrad), OpKind::MoEGateGrad, op_->attrs.axes), {dy(), fin(0), fin(1)}, dst);
    });
}

}  // namespace spmd::autograd_detail
