// autograd/vjp_compute.cpp - the VJPs of compute, precision, shape and SPMD-type ops (see deriver.h).
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

void Deriver::identity() {
  contribute_in(0, exact(0), [&](NameId dst) { cast_to(dy(), tin(0).dtype, dst); });
}

void Deriver::matmul() {
  int ra = tin(0).rank, rb = tin(1).rank, ro = tout().rank;
  auto transposed = [&](int k) {
    Op t = make(OpKind::Transpose);
    t.attrs.dims = ints({-1, -2});
    return emit(t, {fin(k)}, tmp(in_name(k), "T"));
  };
  // A replicated operand that keeps its batch dims meets the other's batch shard: its contribution is that
  // shard (then made a pending sum); a summed batch dim gives the pending sum directly.
  auto pred = [&](int k, int rk) {
    Placements w = exact(k);
    for (int a = 0; a < axes(); ++a) {
      Placement o = tout().pl[static_cast<std::size_t>(a)];
      if (rk == ro && o.is_s() && o.dim < ro - 2 && tin(k).pl[static_cast<std::size_t>(a)].is_r()) w[static_cast<std::size_t>(a)] = o;
    }
    return w;
  };
  contribute_in(0, pred(0, ra), [&](NameId dst) {
    NameId bt = transposed(1);
    Op m = make(OpKind::MatMul);
    if (ra == ro) {
      emit(m, {dy(), bt}, dst);
      return;
    }
    NameId prod = emit(m, {dy(), bt}, tmp(dst, "full"));
    std::vector<int> lead;
    for (int d = 0; d < ro - ra; ++d) lead.push_back(d);
    Op s = make(OpKind::Sum);
    s.attrs.dims = ints(lead);
    emit(s, {prod}, dst);
  });
  contribute_in(1, pred(1, rb), [&](NameId dst) {
    NameId at = transposed(0);
    Op m = make(OpKind::MatMul);
    if (rb == ro) {
      emit(m, {at, dy()}, dst);
      return;
    }
    NameId prod = emit(m, {at, dy()}, tmp(dst, "full"));
    std::vector<int> lead;
    for (int d = 0; d < ro - rb; ++d) lead.push_back(d);
    Op s = make(OpKind::Sum);
    s.attrs.dims = ints(lead);
    emit(s, {prod}, dst);
  });
}

void Deriver::elementwise() {
  bool mul = op_->kind == OpKind::Multiply, sub = op_->kind == OpKind::Sub;
  int ro = tout().rank;
  Placements g = dy_pl();
  if (op_->n_in == 1) {  // with `scalar`
    contribute_in(0, g, [&](NameId dst) {
      if (!mul) return cast_to(dy(), tin(0).dtype, dst);
      Op m = make(OpKind::Multiply);
      m.attrs.number = op_->attrs.number;
      m.attrs.has_number = true;
      emit(m, {dy()}, dst);
    });
    return;
  }
  for (int k = 0; k < 2; ++k) {
    const ValueType& t = tin(k);
    const ValueType& other = tin(1 - k);
    Placements have = mul ? times(g, other.pl, ro, other.rank) : g;
    // predict the sum over broadcast dims
    std::vector<int> lead, ones;
    for (int d = 0; d < ro - t.rank; ++d) lead.push_back(d);
    Placements pred = summed(have, ro, lead, false);
    for (int d = 0; d < t.rank; ++d) {
      ExprId e = t.shape[static_cast<std::size_t>(d)];
      ExprId eo = tout().shape[static_cast<std::size_t>(d + ro - t.rank)];
      if (P().exprs.is_const(e) && P().exprs.value(e) == 1 && !(P().exprs.is_const(eo) && P().exprs.value(eo) == 1)) ones.push_back(d);
    }
    pred = summed(pred, t.rank, ones, true);
    contribute_in(k, pred, [&, k](NameId dst) {
      NameId g0 = dy();
      if (mul) {
        g0 = emit(make(OpKind::Multiply), {dy(), fin(1 - k)}, tmp(dst, "prod"));
      } else if (sub && k == 1) {
        Op m = make(OpKind::Multiply);
        m.attrs.number = -1;
        m.attrs.has_number = true;
        g0 = emit(m, {dy()}, tmp(dst, "neg"));
      }
      Placements scratch = have;
      sum_to(g0, ro, tin(k).dims(), tin(k).dtype, dst, &scratch);
    });
  }
}

// -x: the gradient is -dy (a pending max of dy becomes a min)
void Deriver::neg() {
  Placements g = dy_pl();
  for (auto& q : g)
    if (q.is_p() && (q.op == ReduceOp::Max || q.op == ReduceOp::Min)) q.op = q.op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max;
  contribute_in(0, g, [&](NameId dst) { emit(make(OpKind::Neg), {dy()}, dst); });
}

// x / c: the gradient is dy / c (a negative c swaps a pending max and min)
void Deriver::div_scalar() {
  Placements g = dy_pl();
  if (op_->attrs.number < 0)
    for (auto& q : g)
      if (q.is_p() && (q.op == ReduceOp::Max || q.op == ReduceOp::Min)) q.op = q.op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max;
  contribute_in(0, g, [&](NameId dst) {
    Op d = make(OpKind::Div);
    d.attrs.number = op_->attrs.number;
    d.attrs.has_number = true;
    emit(d, {dy()}, dst);
  });
}

void Deriver::pointwise() {
  const auto& choices = op_info(OpKind::PointwiseGrad).find_attr("of")->choices;
  std::uint8_t choice = 0;
  for (std::size_t c = 0; c < choices.size(); ++c)
    if (choices[c] == op_name(op_->kind)) choice = static_cast<std::uint8_t>(c);
  contribute_in(0, dy_pl(), [&](NameId dst) {
    Op g = make(OpKind::PointwiseGrad);
    g.attrs.choice = choice;
    emit(g, {dy(), fin(0)}, dst);
  });
}

void Deriver::norm() {
  int r = tin(0).rank;
  std::vector<int> nd = norm_dims(r), lead;
  for (int d = 0; d < r; ++d)
    if (std::find(nd.begin(), nd.end(), d) == nd.end()) lead.push_back(d);
  Placements g = dy_pl();
  contribute_in(0, g, [&](NameId dst) {
    Op o = make(OpKind::NormGrad);
    o.attrs.choice = norm_choice(op_->kind);
    o.attrs.dims = op_->attrs.dims;
    o.attrs.number = op_->attrs.number;  // eps
    o.attrs.has_number = op_->attrs.has_number;
    if (op_->n_in >= 2) emit(o, {dy(), fin(0), fin(1)}, dst);
    else emit(o, {dy(), fin(0)}, dst);
  });
  Placements pw = summed(times(g, tin(0).pl, r, r), r, lead, false);
  if (op_->n_in >= 2)
    contribute_in(1, pw, [&](NameId dst) {
      Op n = make(op_->kind);  // the normalized input without its affine weight
      n.attrs.dims = op_->attrs.dims;
      n.attrs.number = op_->attrs.number;
      n.attrs.has_number = op_->attrs.has_number;
      NameId xhat = emit(n, {fin(0)}, tmp(in_name(0), "hat"));
      NameId prod = emit(make(OpKind::Multiply), {dy(), xhat}, tmp(dst, "prod"));
      Op s = make(OpKind::Sum);
      s.attrs.dims = ints(lead);
      emit(s, {prod}, dst);
    });
  if (op_->n_in >= 3)
    contribute_in(2, summed(g, r, lead, false), [&](NameId dst) {
      Op s = make(OpKind::Sum);
      s.attrs.dims = ints(lead);
      emit(s, {dy()}, dst);
    });
}

void Deriver::softmax() {
  contribute_in(0, dy_pl(), [&](NameId dst) {
    Op o = make(OpKind::NormGrad);
    o.attrs.choice = norm_choice(OpKind::Softmax);
    o.attrs.dims = ints({op_->attrs.dim == kUnset ? -1 : op_->attrs.dim});
    emit(o, {dy(), fout(0)}, dst);
  });
}

void Deriver::reduction() {
  const ValueType& x = tin(0);
  int r = x.rank;
  std::vector<int> dims = norm_dims(r);
  std::sort(dims.begin(), dims.end());
  // dy back to x's dims (keepdim shape), then broadcast to x's shape.
  Placements pred = dy_pl();
  if (!op_->attrs.keepdim) {
    for (int a = 0; a < axes(); ++a) {
      Placement& p = pred[static_cast<std::size_t>(a)];
      if (!p.is_s()) continue;
      int d = p.dim;
      for (int rd : dims)
        if (rd <= d) ++d;
      p.dim = static_cast<std::int16_t>(d);
    }
  }
  // Each rank's autograd divides by the count of its own elements (the local size of a sharded dim), as
  // its forward Mean did: over an axis sharding a reduced dim the result is a per-rank mean (P(avg)), and
  // the gradients are those of the sum of the per-rank means (see relabel_mean_loss in check.cpp).
  std::int64_t n = 1;
  bool concrete = true;
  for (int d : dims) {
    ExprId e = x.shape[static_cast<std::size_t>(d)];
    // a generalized size (shape reduction) counts by its declared value: the count is a value, not an extent
    if (auto v = P().exprs.single_value(e, P().vars)) n *= *v;
    else concrete = false;
    for (int a = 0; a < axes() && concrete; ++a) {
      if (!x.pl[static_cast<std::size_t>(a)].is_s(d)) continue;
      bool c = true;
      std::int64_t na = axes_size(1u << a, c);
      if (!c || na <= 0 || n % na != 0) concrete = false;
      else n /= na;
    }
  }
  contribute_in(0, pred, [&](NameId dst) {
    NameId g = dy();
    if (!op_->attrs.keepdim) {
      std::vector<ExprId> kd(x.shape.begin(), x.shape.begin() + r);
      for (int d : dims) kd[static_cast<std::size_t>(d)] = P().exprs.constant(1);
      Op rs = make(OpKind::Reshape);
      rs.attrs.shape = shape(kd);
      g = emit(rs, {g}, tmp(dst, "kd"));
    }
    Op e = make(OpKind::Expand);
    e.attrs.shape = shape(x.dims());
    if (op_->kind == OpKind::Mean && concrete && n > 1) {
      e.attrs.number = 1.0 / static_cast<double>(n);
      e.attrs.has_number = true;
    }
    emit(e, {g}, dst);
  });
}

void Deriver::attention() {
  for (int k = 0; k < 3; ++k)
    contribute_in(k, exact(k), [&, k](NameId dst) {
      Op o = make(OpKind::AttentionGrad);
      o.attrs.choice = static_cast<std::uint8_t>(k);
      o.attrs.causal = op_->attrs.causal;
      o.attrs.layout = op_->attrs.layout;
      o.attrs.axes = op_->attrs.axes;  // `cp`: the causal mask's global positions
      o.attrs.order = op_->attrs.order;
      o.attrs.number = op_->attrs.number;  // `scale`: the forward's softmax scale
      o.attrs.has_number = op_->attrs.has_number;
      emit(o, {dy(), fin(0), fin(1), fin(2)}, dst);
    });
}

void Deriver::embedding() {
  contribute_in(1, exact(1), [&](NameId dst) { emit(make(OpKind::EmbeddingGrad), {dy(), fin(0), fin(1)}, dst); });
}

void Deriver::cross_entropy() {
  const ValueType& lg = tin(0);
  int vd = lg.rank - 1;
  Placements g = dy_pl();
  std::uint32_t vocab = 0;
  for (int a = 0; a < axes(); ++a)
    if (op_->attrs.vocab_parallel && lg.pl[static_cast<std::size_t>(a)].is_s(vd) && g[static_cast<std::size_t>(a)].is_p()) vocab |= 1u << a;
  Placements pred = lg.pl;
  for (int a = 0; a < axes(); ++a) {
    Placement dl = g[static_cast<std::size_t>(a)], pl = lg.pl[static_cast<std::size_t>(a)], pb = tin(1).pl[static_cast<std::size_t>(a)];
    Placement& o = pred[static_cast<std::size_t>(a)];
    if (vocab & (1u << a)) continue;
    if (pl.is_s(vd)) continue;
    if (dl.is_p()) o = Placement::p();
    else if (pl.is_r() && pb.is_s()) o = Placement::s(pb.dim);
    else if (pl.is_r() && (dl.is_s() || dl.is_v())) o = dl;
  }
  contribute_in(0, pred, [&](NameId dst) {
    NameId d = dy();
    if (vocab) {
      // the loss is whole over the vocab-parallel axes, so its gradient is a pending sum there:
      // reduce it before it scales each rank's vocab slice
      Op ar = make(OpKind::AllReduce);
      ar.attrs.axes = vocab;
      d = emit(ar, {d}, tmp(d, "reduced"));
    }
    Op o = make(OpKind::CrossEntropyGrad);
    o.attrs.vocab_parallel = op_->attrs.vocab_parallel;
    o.attrs.reduction = op_->attrs.reduction;
    emit(o, {d, fin(0), fin(1)}, dst);
  });
}

void Deriver::topk() {
  if (dy(0) < 0) return;  // only the routing weights carry a gradient
  contribute_in(0, dy_pl(0), [&](NameId dst) { emit(make(OpKind::TopKGrad), {dy(0), fin(0), fout(1)}, dst); });
}

void Deriver::loss_scale() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = make(OpKind::LossScale);
    o.attrs.number = op_->attrs.number;
    o.attrs.has_number = true;
    emit(o, {dy()}, dst);
  });
}

void Deriver::reshape() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = make(OpKind::Reshape);
    o.attrs.shape = shape(tin(0).dims());
    emit(o, {dy()}, dst);
  });
}

void Deriver::transpose() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = make(OpKind::Transpose);
    o.attrs.dims = op_->attrs.dims;
    emit(o, {dy()}, dst);
  });
}

void Deriver::expand() {
  Placements pred = dy_pl();
  int ro = tout().rank, ri = tin(0).rank;
  std::vector<int> lead;
  for (int d = 0; d < ro - ri; ++d) lead.push_back(d);
  pred = summed(pred, ro, lead, false);
  contribute_in(0, pred, [&](NameId dst) {
    NameId g = dy();
    if (op_->attrs.has_number) {
      Op m = make(OpKind::Multiply);
      m.attrs.number = op_->attrs.number;
      m.attrs.has_number = true;
      g = emit(m, {g}, tmp(dst, "scaled"));
    }
    Placements scratch = dy_pl();
    sum_to(g, ro, tin(0).dims(), tin(0).dtype, dst, &scratch);
  });
}

void Deriver::guard() {
  if (op_->n_out == 0) return;
  contribute_in(0, exact(0), [&](NameId dst) {
    NameId c = tmp(dst, "in");
    cast_to(dy(), tin(0).dtype, c);
    // the derived backward asserts the dual placement where the forward asserted one
    Op g = make(OpKind::SPMDGuard);
    P().placement_maps.push_back(want_in(0));
    g.attrs.placements = static_cast<std::uint32_t>(P().placement_maps.size() - 1);
    emit(g, {c}, dst);
  });
}

}  // namespace spmd::autograd_detail
