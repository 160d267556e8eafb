// autograd/vjp_math.cpp - the VJPs of the value ops of issue 10 that need more than one op (see deriver.h).
//
// Where(mask, a, b): da = dy * m, db = dy - dy * m (m: the mask cast to dy's dtype); Div(a, b) by a tensor:
// da = dy / b, db = -(dy * out) / b. Each contribution is summed down to its operand's shape (broadcasting
// reversed). Maximum, Minimum, ReduceMax, ReduceMin and LogSumExp still need a hand-written backward.
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

// The dims of input k that the output broadcast: leading ones, and size-1 dims of k the output grew.
void Deriver::broadcast_dims(int k, std::vector<int>& lead, std::vector<int>& ones) const {
  int ro = tout().rank;
  const ValueType& t = tin(k);
  for (int d = 0; d < ro - t.rank; ++d) lead.push_back(d);
  for (int d = 0; d < t.rank; ++d) {
    ExprId e = t.shape[static_cast<std::size_t>(d)];
    ExprId eo = tout().shape[static_cast<std::size_t>(d + ro - t.rank)];
    if (P().exprs.is_const(e) && P().exprs.value(e) == 1 && !(P().exprs.is_const(eo) && P().exprs.value(eo) == 1)) ones.push_back(d);
  }
}

void Deriver::where_vjp() {
  int ro = tout().rank;
  Placements have = times(dy_pl(), tin(0).pl, ro, tin(0).rank);
  NameId prod = -1;
  for (int k = 1; k <= 2; ++k) {
    if (!needs_[in_ver(k)]) continue;
    std::vector<int> lead, ones;
    broadcast_dims(k, lead, ones);
    Placements pred = summed(summed(have, ro, lead, false), tin(k).rank, ones, true);
    contribute_in(k, pred, [&, k](NameId dst) {
      if (prod < 0) {
        Op c = make(OpKind::Cast);
        c.attrs.dtype = tout().dtype;
        c.attrs.has_dtype = true;
        NameId m = emit(c, {fin(0)}, tmp(in_name(0), "as_float"));
        prod = emit(make(OpKind::Multiply), {dy(), m}, tmp(dst, "selected"));
      }
      NameId g0 = k == 1 ? prod : emit(make(OpKind::Sub), {dy(), prod}, tmp(dst, "rest"));
      Placements scratch = have;
      sum_to(g0, ro, tin(k).dims(), tin(k).dtype, dst, &scratch);
    });
  }
}

void Deriver::div_tensor_vjp() {
  int ro = tout().rank;
  const ValueType& b = tin(1);
  Placements ha = times(dy_pl(), b.pl, ro, b.rank);
  Placements hb = times(times(dy_pl(), tout().pl, ro, ro), b.pl, ro, b.rank);
  for (int k = 0; k < 2; ++k) {
    if (!needs_[in_ver(k)]) continue;
    std::vector<int> lead, ones;
    broadcast_dims(k, lead, ones);
    Placements have = k == 0 ? ha : hb;
    Placements pred = summed(summed(have, ro, lead, false), tin(k).rank, ones, true);
    contribute_in(k, pred, [&, k](NameId dst) {
      NameId g0;
      if (k == 0) {
        g0 = emit(make(OpKind::Div), {dy(), fin(1)}, tmp(dst, "quot"));
      } else {
        NameId p = emit(make(OpKind::Multiply), {dy(), fout(0)}, tmp(dst, "prod"));
        NameId q = emit(make(OpKind::Div), {p, fin(1)}, tmp(dst, "quot"));
        g0 = emit(make(OpKind::Neg), {q}, tmp(dst, "neg"));
      }
      Placements scratch = have;
      sum_to(g0, ro, tin(k).dims(), tin(k).dtype, dst, &scratch);
    });
  }
}

}  // namespace spmd::autograd_detail
