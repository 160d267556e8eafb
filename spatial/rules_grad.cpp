// spatial/rules_grad.cpp - placement and shape rules of the gradient ops
//
// The VJPs derived backward programs are made of.
// Ops: Expand, PointwiseGrad, NormGrad, AttentionGrad, EmbeddingGrad, CrossEntropyGrad, TopKGrad.
// Dispatched from Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

void Checker::expand() {
  const Value& x = in(0);
  const auto& shape = p_.shapes[at().shape];
  int ro = static_cast<int>(shape.size()), ri = x.rank;
  if (ro < ri) return report(CheckId::ShapeMismatch, fmt::format("Expand of {} {} to {}: the target has fewer dims", iname(0), sstr(x.dims()), sstr(shape)), iname(0));
  Value& o = out() = x;
  set_shape(o, shape);
  for (int d = 0; d < ri; ++d) {
    ExprId e = x.shape[static_cast<std::size_t>(d)];
    if (is_one(e)) continue;
    if (!same_dim(e, shape[static_cast<std::size_t>(d + ro - ri)], fmt::format("Expand keeps dim {} of {}", d, iname(0)), iname(0))) return;
  }
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p() && !p.linear_partial() && at().has_number && at().number < 0)
      return partial_misuse(0, a, "a negative scale swaps max and min");
    if (p.is_s() && is_one(x.shape[static_cast<std::size_t>(p.dim)]) && !is_one(shape[static_cast<std::size_t>(p.dim + ro - ri)]))
      return layout_conflict(fmt::format("Expand grows dim {} of {}, which is sharded over {}", p.dim, iname(0), axn(a)), iname(0), 0, a, "");
    set_from(o, a, shift(p, ri, ro), 0);
  }
}

// Shapes of two inputs must agree exactly (a gradient and the value it is the gradient of).
bool Checker::same_shape(int i, int j) {
  if (in(i).rank != in(j).rank) {
    report(CheckId::ShapeMismatch, fmt::format("{} needs {} and {} of the same shape, got {} and {}", opname(), iname(i), iname(j), sstr(in(i).dims()),
                                               sstr(in(j).dims())),
           iname(i));
    return false;
  }
  for (int d = 0; d < in(i).rank; ++d)
    if (!same_dim(in(i).shape[static_cast<std::size_t>(d)], in(j).shape[static_cast<std::size_t>(d)],
                  fmt::format("{} dim {} of {} against {}", opname(), d, iname(i), iname(j)), iname(i)))
      return false;
  return true;
}

// dy * f'(x): nonlinear in x (no P), then the Multiply rule.
void Checker::pointwise_grad() {
  for (int a = 0; a < axes(); ++a)
    if (pin(1, a).is_p()) return partial_misuse(1, a, "the derivative of a nonlinear op at a pending sum is not the sum of derivatives");
  if (!same_shape(0, 1)) return;
  add_like(true);
  // Dropout's mask may have been drawn per rank (the gradient op does not say): per-rank values
  if (op_info(OpKind::PointwiseGrad).find_attr("of")->choices[at().choice] == "Dropout") out().fresh = v_axes(out());
}

void Checker::norm_grad() {
  std::vector<int> dims;
  if (!attr_dims(in(1).rank, dims, iname(1))) return;
  for (int a = 0; a < axes(); ++a) {
    if (pin(1, a).is_p()) return partial_misuse(1, a, "the gradient of a normalization depends on the statistics of the whole value");
    for (int i = 0; i < 2; ++i)
      for (int d : dims)
        if (pin(i, a).is_s(d)) return sharded_dim(i, a, d, "the gradient of a normalization reduces over the normalized dims");
    if (n_in() == 3) {
      Placement w = pin(2, a);
      if (w.is_p()) return partial_misuse(2, a, "a norm's affine weight must be a whole value");
      if (w.is_s()) return sharded_dim(2, a, w.dim, "the weight spans the normalized dims");
    }
  }
  if (!same_shape(0, 1)) return;
  add_like(true);
  if (!failed_ && n_in() == 3)
    for (int a = 0; a < axes(); ++a)
      if (pin(2, a).is_v() && !pl_of(out(), a).is_v()) set_new(out(), a, Placement::v(), "a per-rank norm weight gives per-rank gradients");
}

void Checker::attention_grad() {
  int b, h, s, dd;  // (attention_shapes, below)
  int wrt = at().choice < 3 ? at().choice : 0;  // q, k, v
  for (int i = 0; i < 4; ++i)
    if (in(i).rank != 4) return report(CheckId::ShapeMismatch, fmt::format("AttentionGrad {} must have rank 4, got shape {}", iname(i), sstr(in(i).dims())), iname(i));
  // q, k, v alike as the forward's (batch, head_dim, heads, uneven head cuts), and `cp` as the forward's
  if (!attention_shapes(b, h, s, dd, 1) || !cp_ok(1, s)) return;
  Value& o = out() = in(1 + wrt);
  o.dtype = in(0).dtype;
  for (int a = 0; a < axes(); ++a) {
    Placement dy = pin(0, a), q = pin(1, a), k = pin(2, a), v = pin(3, a);
    for (int i = 1; i < 4; ++i)
      if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v");
    Placement f, res[3] = {q, k, v};
    if (q.is_i() && k.is_i() && v.is_i()) f = q;
    else if (q == k && k == v && (q.is_r() || q.is_s(h) || q.is_s(b))) f = q;
    else if (q.is_s(s) && k.is_r() && v.is_r() && (!at().causal || (at().axes >> a & 1u))) f = q, res[1] = res[2] = Placement::p();
    // GQA with fewer kv heads than ranks (as in attention()): each rank's query heads add to their group's
    // kv gradient, so dk and dv are pending sums over the axis that replicates the kv heads
    else if (q.is_s(h) && k.is_r() && v.is_r() && kv_heads_held_whole(a, h, 2)) f = q, res[1] = res[2] = Placement::p();
    else if (q.is_r() && k.is_r() && v.is_s(dd)) f = v, res[0] = res[1] = Placement::p();
    else if ((q.is_v() || q.is_r()) && (k.is_v() || k.is_r()) && (v.is_v() || v.is_r())) f = Placement::v(), res[0] = res[1] = res[2] = Placement::v();
    else
      return layout_conflict(fmt::format("AttentionGrad gets q {}, k {}, v {} over {}: attention does not take these together", ps(q), ps(k), ps(v), axn(a)),
                             iname(1), 1, a, "");
    Placement r;
    if (dy == f) r = res[wrt];
    else if (dy.is_p() && dy.linear_partial() && f.is_r()) r = dy;
    else if (dy.is_v() && f.varying()) r = Placement::v();
    else {
      std::vector<Note> notes;
      origin_note(notes, in(0), a);
      return report(CheckId::PlacementMismatch,
                    fmt::format("AttentionGrad expects {} placed like the attention output ({} over {}), but it is {}", iname(0), ps(f), axn(a), ps(dy)),
                    iname(0), std::move(notes));
    }
    if (r == pin(1 + wrt, a)) set_from(o, a, r, 1 + wrt);
    else set_new(o, a, r, fmt::format("the attention gradient with respect to {} is {} over {}", iname(1 + wrt), ps(r), axn(a)));
  }
}

void Checker::embedding_grad() {
  const Value& w = in(2);
  if (w.rank != 2) return report(CheckId::ShapeMismatch, fmt::format("EmbeddingGrad weight {} must be [vocab, hidden], got shape {}", iname(2), sstr(w.dims())), iname(2));
  Value& o = out() = w;
  o.dtype = in(0).dtype;
  int last = in(0).rank - 1;
  for (int a = 0; a < axes(); ++a) {
    Placement dy = pin(0, a), ids = pin(1, a), pw = pin(2, a);
    bool ids_whole = ids.is_r() || ids.is_i();
    if (ids.is_p()) return partial_misuse(1, a, "token ids cannot be a pending sum");
    if (pw.is_s(0)) {
      if (!ids_whole || !(dy.is_r() || dy.is_i()))
        return layout_conflict(fmt::format("EmbeddingGrad for the vocab-sharded {} over {} needs whole ids and a whole dy, got ids {} and dy {}", iname(2),
                                           axn(a), ps(ids), ps(dy)),
                               iname(0), 0, a, fmt::format("all-reduce {} over {} first", iname(0), axn(a)));
      set_from(o, a, pw, 2);
    } else if (pw.is_s(1)) {
      if (!dy.is_s(last)) return layout_conflict(fmt::format("EmbeddingGrad for {} (S(1) over {}) needs dy S({}), got {}", iname(2), axn(a), last, ps(dy)), iname(0), 0, a, "");
      set_from(o, a, pw, 2);
    } else if (pw.is_i()) {
      if (!(dy.is_i() && ids_whole)) return report(CheckId::InvariantMix, fmt::format("EmbeddingGrad for the invariant {} over {} needs dy I, got {}", iname(2), axn(a), ps(dy)), iname(0));
      set_from(o, a, pw, 2);
    } else if (pw.is_v()) {
      set_from(o, a, pw, 2);
    } else if (dy.is_r() && ids_whole) {
      set_from(o, a, Placement::r(), 2);
    } else if (dy.is_p() && !dy.linear_partial()) {
      return partial_misuse(0, a, "a scatter-add does not commute with a pending max or min");
    } else {
      set_new(o, a, Placement::p(), fmt::format("EmbeddingGrad sums the rows of {} ({} over {}) on each rank: every rank holds a part of the table's gradient",
                                                iname(0), ps(dy), axn(a)));
    }
  }
}

void Checker::cross_entropy_grad() {
  const Value& lg = in(1);
  if (lg.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("CrossEntropyGrad logits {} must have a vocab dim", iname(1)), iname(1));
  int vd = lg.rank - 1;
  Value& o = out() = lg;
  o.dtype = in(0).dtype == DType::F32 ? lg.dtype : in(0).dtype;
  for (int a = 0; a < axes(); ++a) {
    Placement dl = pin(0, a), pl = pin(1, a), pb = pin(2, a);
    if (pl.is_p()) return partial_misuse(1, a, "the loss is nonlinear in the logits");
    if (pb.is_p()) return partial_misuse(2, a, "labels cannot be a pending sum");
    if (pl.is_s(vd)) {
      if (!at().vocab_parallel) return sharded_dim(1, a, vd, "the softmax needs the whole vocabulary (set vocab_parallel: true)");
      if (dl.is_p()) return partial_misuse(0, a, "the vocab-sharded logits gradient scales each rank's slice by the whole loss gradient",
                                           fix_allreduce(iname(0), a, dl));
      if (!vocab_cut_evenly(1, vd, a)) return;
      set_from(o, a, pl, 1);
    } else if (dl.is_p()) {
      if (!dl.linear_partial()) return partial_misuse(0, a, "a pending max or min is not a loss gradient");
      if (!(pl.is_r() && (pb.is_r() || pb.is_i()))) return partial_misuse(0, a, fmt::format("the logits {} are {} over {}, so each rank's summand is scaled by a different piece", iname(1), ps(pl), axn(a)));
      set_from(o, a, dl, 0);
    } else if (pl.is_r() && pb.is_s()) {
      set_new(o, a, Placement::s(pb.dim), fmt::format("the labels {} are {} over {}: each rank has the gradient of its own tokens' rows", iname(2), ps(pb), axn(a)));
    } else if (pl.is_r() && dl.is_s()) {
      set_from(o, a, dl, 0);
    } else if (pl.is_r() && dl.is_v()) {
      set_from(o, a, dl, 0);
    } else {
      set_from(o, a, pl, 1);
    }
  }
}

void Checker::topk_grad() {
  const Value& x = in(1);
  if (x.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("TopKGrad logits {} must have an expert dim", iname(1)), iname(1));
  int e = x.rank - 1;
  Value& o = out() = x;
  o.dtype = in(0).dtype;
  for (int a = 0; a < axes(); ++a) {
    Placement dw = pin(0, a), p = pin(1, a);
    if (p.is_p()) return partial_misuse(1, a, "top-k of a pending sum is not the top-k of its parts");
    if (p.is_s(e)) return sharded_dim(1, a, e, "the routing gradient scatters over the whole expert dim");
    if (dw.is_p()) {
      if (!p.is_r()) return partial_misuse(0, a, fmt::format("the logits {} are {} over {}", iname(1), ps(p), axn(a)));
      set_from(o, a, dw, 0);
    } else if (dw.is_s(e)) {
      return sharded_dim(0, a, e, "the routing weights' gradient must hold every selected expert");
    } else {
      set_from(o, a, dw, 0);
    }
  }
}

}  // namespace spmd::detail
