// spatial/rules_reduction.cpp - placement and shape rules of the reductions and norms
//
// Ops: LayerNorm/RMSNorm, Softmax, Sum/Mean/ReduceMax/ReduceMin/LogSumExp, CrossEntropyLoss, TopKGate. Dispatched from Checker::apply()
// in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

// The normalized dims of a LayerNorm/RMSNorm/Sum/Mean `dims` attribute (default: the last).
bool Checker::attr_dims(int rank, std::vector<int>& dims, const std::string& tensor) {
  dims.clear();
  if (at().dims == kNoIndex) {
    if (rank == 0) return report(CheckId::ShapeMismatch, fmt::format("{} of the scalar {} has no dim to work on", opname(), tensor), tensor), false;
    dims.push_back(rank - 1);
    return true;
  }
  for (int d : p_.int_lists[at().dims]) {
    int n = norm_dim(d, rank, "dim " + std::to_string(d), tensor);
    if (n < 0) return false;
    if (std::find(dims.begin(), dims.end(), n) != dims.end())
      return report(CheckId::ShapeMismatch, fmt::format("{} lists dim {} twice", opname(), n), tensor), false;
    dims.push_back(n);
  }
  std::sort(dims.begin(), dims.end());
  return true;
}

void Checker::norm() {
  const Value& x = in(0);
  std::vector<int> dims;
  if (!attr_dims(x.rank, dims, iname(0))) return;
  for (int i = 1; i < n_in(); ++i) {
    const Value& w = in(i);
    std::vector<ExprId> want;
    for (int d : dims) want.push_back(x.shape[static_cast<std::size_t>(d)]);
    if (w.rank != want.size())
      return report(CheckId::ShapeMismatch,
                    fmt::format("{} {} has shape {}, but the normalized dims of {} have shape {}", opname(), iname(i), sstr(w.dims()),
                                iname(0), sstr(want)),
                    iname(i));
    for (std::size_t k = 0; k < want.size(); ++k)
      if (!same_dim(w.shape[k], want[k], [&] { return fmt::format("{} {} dim {} against normalized dim {} of {}", opname(), iname(i), k, dims[k], iname(0)); },
                    iname(i)))
        return;
  }
  if (!invariant_ok({0, 1, 2})) return;
  out() = x;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "normalization divides by the statistics of the whole value, which a pending reduction does not have yet");
    for (int d : dims)
      if (p.is_s(d)) return sharded_dim(0, a, d, "each rank would normalize with the statistics of its own slice");
    for (int i = 1; i < n_in(); ++i) {
      Placement w = pin(i, a);
      if (w.is_p()) return partial_misuse(i, a, "a norm's affine weight must be a whole value");
      if (w.is_s()) return sharded_dim(i, a, w.dim, "the weight and bias span the normalized dims, which must be whole on every rank");
      if (w.is_v() && !p.is_v())
        set_new(out(), a, Placement::v(), fmt::format("{} with a per-rank weight {} gives per-rank values", opname(), iname(i)));
    }
  }
}

void Checker::softmax() {
  out() = in(0);
  int d = norm_dim(at().dim == kUnset ? -1 : at().dim, in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "softmax of a pending sum is not the sum of softmaxes");
    if (p.is_s(d)) return sharded_dim(0, a, d, "each rank would normalize over its own slice only");
  }
}

void Checker::reduce_dims() {
  const Value& x = in(0);
  bool mean = op_->kind == OpKind::Mean;
  // the reduction a sharded reduced dim leaves pending (LogSumExp: none, so it needs the dim whole)
  std::optional<ReduceOp> leaves;
  if (op_->kind == OpKind::Sum) leaves = ReduceOp::Sum;
  else if (mean) leaves = ReduceOp::Avg;
  else if (op_->kind == OpKind::ReduceMax) leaves = ReduceOp::Max;
  else if (op_->kind == OpKind::ReduceMin) leaves = ReduceOp::Min;
  std::vector<int> dims;
  if (!attr_dims(x.rank, dims, iname(0))) return;
  Value& o = out();
  o.dtype = x.dtype;
  o.uneven = x.uneven;
  std::vector<int> renumber(x.rank, -1);
  for (int d = 0, k = 0; d < x.rank; ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (reduced && !at().keepdim) continue;
    o.shape[static_cast<std::size_t>(k)] = reduced ? pool_.constant(1) : x.shape[static_cast<std::size_t>(d)];
    renumber[static_cast<std::size_t>(d)] = k++;
    o.rank = static_cast<std::uint8_t>(k);
  }
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) {
      // sum and avg over dims commute with a pending sum or avg; max over dims with a pending max, min with min;
      // log-sum-exp with none
      bool ok = leaves && (*leaves == ReduceOp::Sum || *leaves == ReduceOp::Avg ? p.linear_partial() : p.op == *leaves);
      if (!ok)
        return partial_misuse(0, a, leaves ? fmt::format("a {} over dims does not commute with a pending {}", reduce_name(*leaves), reduce_name(p.op))
                                           : "the log-sum-exp of a pending reduction is not any reduction of the per-rank log-sum-exps");
      set_from(o, a, p, 0);
    } else if (p.is_s() && std::find(dims.begin(), dims.end(), p.dim) != dims.end()) {
      if (!leaves)
        return sharded_dim(0, a, p.dim, "each rank would take the log-sum-exp of its own slice, and those combine by another log-sum-exp, "
                                        "which no pending reduction expresses");
      if (mean && uneven_dim(x, p.dim)) {
        std::vector<Note> notes;
        origin_note(notes, x, a);
        notes.push_back(fix(fix_allgather(iname(0), a, p.dim)));
        return report(CheckId::ShapeMismatch,
                      fmt::format("Mean over dim {} of {}, which is sharded unevenly over {}: the average of the local means is not the "
                                  "global mean when shards differ in size",
                                  p.dim, iname(0), axn(a)),
                      iname(0), std::move(notes));
      }
      if ((*leaves == ReduceOp::Max || *leaves == ReduceOp::Min) && empty_shard(x, p.dim)) {
        std::vector<Note> notes;
        origin_note(notes, x, a);
        notes.push_back(fix(fix_allgather(iname(0), a, p.dim) + ", or pad the dim to a multiple of the ranks"));
        return report(CheckId::ShapeMismatch,
                      fmt::format("{} over dim {} of {} ({} elements), which is sharded unevenly over {}: torch.chunk leaves some rank an empty "
                                  "slice, and the {} of nothing has no value (torch.amax raises; an identity of {}inf would leak into later "
                                  "arithmetic, e.g. 0 x inf)",
                                  opname(), p.dim, iname(0), dstr(x.shape[static_cast<std::size_t>(p.dim)]), mask_names(shard_mask(x, p.dim)),
                                  reduce_name(*leaves), *leaves == ReduceOp::Max ? "-" : "+"),
                      iname(0), std::move(notes));
      }
      set_new(o, a, Placement::p(*leaves),
              fmt::format("{} over dim {}, which is sharded S({}) over {}: each rank holds the {} of its slice only", opname(), p.dim, p.dim, axn(a),
                          mean ? "mean" : reduce_name(*leaves)));
    } else if (p.is_s()) {
      set_from(o, a, Placement::s(renumber[static_cast<std::size_t>(p.dim)]), 0);
    } else {
      set_from(o, a, p, 0);
    }
  }
}

// Vocab-parallel cross-entropy (CrossEntropyLoss, CrossEntropyGrad) with the logits at input `li`: each rank's label
// range is its index times its local vocab (Megatron's vocab_range_from_per_partition_vocab_size), so the vocab dim
// `vd` must be cut evenly by all the axes that cut it (6 is even over 2 and over 2, not over 2 x 2). False after a report.
bool Checker::vocab_cut_evenly(int li, int vd, int a) {
  if (!uneven_dim(in(li), vd)) return true;
  return report(CheckId::ShapeMismatch,
                fmt::format("vocab-parallel {} over {} needs the vocab dim of {} split evenly, but it is an uneven (torch.chunk) shard: each "
                            "rank's label range is its index times the local vocab size, as in Megatron's vocab_range_from_per_partition_vocab_size",
                            opname(), axn(a), iname(li)),
                iname(li), {fix("pad the vocabulary to a multiple of the axis size (Megatron's make_vocab_size_divisible_by)")}),
         false;
}

void Checker::cross_entropy() {
  const Value& lg = in(0);
  const Value& lb = in(1);
  if (lg.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("CrossEntropyLoss logits {} must have a vocab dim", iname(0)), iname(0));
  int vd = lg.rank - 1;
  if (lb.rank != lg.rank - 1)
    return report(CheckId::ShapeMismatch,
                  fmt::format("CrossEntropyLoss labels {} have shape {}, but the logits {} of shape {} need labels of shape {} (all dims but the "
                              "vocab)",
                              iname(1), sstr(lb.dims()), iname(0), sstr(lg.dims()), sstr(lg.dims().first(static_cast<std::size_t>(vd)))),
                  iname(1));
  for (int d = 0; d < vd; ++d)
    if (!same_dim(lb.shape[static_cast<std::size_t>(d)], lg.shape[static_cast<std::size_t>(d)],
                  fmt::format("CrossEntropyLoss labels dim {} against logits dim {}", d, d), iname(1)) ||
        !same_order(0, d, 1, d))
      return;
  std::uint32_t vocab_axes = 0;
  if (at().vocab_parallel) {
    if (at().axes) {
      vocab_axes = at().axes;
    } else {
      vocab_axes = shard_mask(lg, vd);
      if (!vocab_axes)
        return report(CheckId::PlacementMismatch,
                      fmt::format("CrossEntropyLoss has `vocab_parallel: true`, but the logits {} are not sharded on the vocab dim (dim {}) over any "
                                  "axis: a vocab-parallel loss on whole logits adds log(N) to the loss (Megatron #7452)",
                                  iname(0), vd),
                      iname(0), {fix("feed the vocab-sharded logits (S(-1)) to the loss: if they were gathered with an AllGather, drop it; or set "
                                     "vocab_parallel: false")});
    }
  }
  Value tok;  // per-token loss placement
  tok.rank = static_cast<std::uint8_t>(vd);
  tok.uneven = lg.uneven || lb.uneven;
  std::copy(lb.shape.begin(), lb.shape.begin() + vd, tok.shape.begin());
  for (int a = 0; a < axes(); ++a) {
    Placement pl = pin(0, a), pb = pin(1, a);
    if (pl.is_p()) return partial_misuse(0, a, "the loss is nonlinear in the logits");
    if (pb.is_p()) return partial_misuse(1, a, "labels cannot be a pending sum", "reduce or replicate the labels first");
    if (vocab_axes & (1u << a)) {
      if (!pl.is_s(vd)) {
        std::vector<Note> notes;
        origin_note(notes, lg, a);
        notes.push_back(fix(fmt::format("feed the vocab-sharded logits (S({}) over {}) to the loss: if they were gathered, drop that AllGather", vd, axn(a))));
        return report(CheckId::PlacementMismatch,
                      fmt::format("vocab-parallel CrossEntropyLoss over {} expects the logits ({}) to be S({}) (vocab-sharded), but they are {}: each "
                                  "rank would treat the whole vocab as its slice and the loss gains log({}) (Megatron #7452)",
                                  axn(a), iname(0), vd, ps(pl), axsize(a)),
                      iname(0), std::move(notes));
      }
      if (!vocab_cut_evenly(0, vd, a)) return;
      if (!(pb.is_r() || pb.is_i()))
        return layout_conflict(fmt::format("vocab-parallel CrossEntropyLoss over {} needs the labels {} whole over that axis, but they are {}", axn(a),
                                           iname(1), ps(pb)),
                               iname(1), 1, a, "");
      // R by default; `dst: I` states Megatron's contract (every rank computes the same loss from the all-reduced
      // max, sum-exp and target logit, and its backward is local), so its gradient is I, not a pending sum.
      tok.pl[static_cast<std::size_t>(a)] = at().dst_invariant ? Placement::i() : Placement::r();
      continue;
    }
    if (pl.is_s(vd)) {
      std::vector<Note> notes;
      origin_note(notes, lg, a);
      notes.push_back(fix(fmt::format("set `vocab_parallel: true` (Megatron's vocab_parallel_cross_entropy all-reduces the max and the sum over "
                                      "{}), or {}",
                                      axn(a), fix_allgather(iname(0), a, vd))));
      return report(CheckId::ShardedReductionDim,
                    fmt::format("CrossEntropyLoss needs the vocab dim {} of {} whole, but it is sharded S({}) over {}: the softmax would normalize "
                                "over each rank's slice of the vocabulary",
                                vd, iname(0), vd, axn(a)),
                    iname(0), std::move(notes));
    }
    if (pl == pb || pb.is_r() || pb.is_i()) {
      if (pl.is_s() && (pb.is_r() || pb.is_i()) && !slice_ok(1, a, pl.dim, 0)) return;
      tok.pl[static_cast<std::size_t>(a)] = pl;
      tok.origin[static_cast<std::size_t>(a)] = lg.origin[static_cast<std::size_t>(a)];
    } else if (pl.is_r() || pl.is_i()) {
      if (pb.is_s() && !slice_ok(0, a, pb.dim, 1)) return;
      tok.pl[static_cast<std::size_t>(a)] = pb;
      tok.origin[static_cast<std::size_t>(a)] = lb.origin[static_cast<std::size_t>(a)];
    } else if (pl.is_v() && pb.is_s()) {  // V is read as its local slice, as R is
      if (!slice_ok(0, a, pb.dim, 1)) return;
      tok.pl[static_cast<std::size_t>(a)] = pb;
    } else if (pb.is_v() && pl.is_s()) {
      if (!slice_ok(1, a, pl.dim, 0)) return;
      tok.pl[static_cast<std::size_t>(a)] = pl;
    } else if (pl.is_v() || pb.is_v()) {
      tok.pl[static_cast<std::size_t>(a)] = Placement::v();
    } else {
      return layout_conflict(fmt::format("CrossEntropyLoss logits {} are {} over {} but the labels {} are {}: their token shards do not line up",
                                         iname(0), ps(pl), axn(a), iname(1), ps(pb)),
                             iname(1), 1, a, "");
    }
  }
  Value& o = out();
  o.dtype = DType::F32;
  o.uneven = lg.uneven || lb.uneven;
  if (at().reduction == Reduction::None) {
    o.rank = tok.rank;
    o.shape = tok.shape;
    o.pl = tok.pl;
    o.origin = tok.origin;
    return;
  }
  bool mean = at().reduction == Reduction::Mean;
  o.rank = 0;
  for (int a = 0; a < axes(); ++a) {
    Placement p = tok.pl[static_cast<std::size_t>(a)];
    if (p.is_s()) {
      if (mean && uneven_dim(tok, p.dim))
        return report(CheckId::ShapeMismatch,
                      fmt::format("CrossEntropyLoss takes the mean over tokens sharded unevenly over {}: the average of the local means is not the "
                                  "global mean",
                                  axn(a)),
                      iname(0));
      set_new(o, a, Placement::p(mean ? ReduceOp::Avg : ReduceOp::Sum),
              fmt::format("CrossEntropyLoss takes the {} over tokens sharded S({}) over {}: each rank holds the {} of its own tokens", mean ? "mean" : "sum",
                          p.dim, axn(a), mean ? "mean" : "sum"));
    } else {
      o.pl[static_cast<std::size_t>(a)] = p;
      o.origin[static_cast<std::size_t>(a)] = tok.origin[static_cast<std::size_t>(a)];
    }
  }
}

void Checker::topk() {
  const Value& x = in(0);
  if (x.rank < 1) return report(CheckId::ShapeMismatch, fmt::format("TopKGate input {} must have an expert dim", iname(0)), iname(0));
  int e = x.rank - 1;
  ExprId k = size_arg("k", pool_.constant(1));  // a size expression: `k: K` with K symbolic is an obligation
  if (!at_most(k, x.shape[static_cast<std::size_t>(e)], fmt::format("TopKGate picks k of the experts (the last dim) of {}, so k must not exceed them", iname(0)),
               iname(0)))
    return;
  for (int a = 0; a < axes(); ++a) {
    Placement p = pin(0, a);
    if (p.is_p()) return partial_misuse(0, a, "top-k of a pending sum is not the top-k of its parts");
    if (p.is_s(e)) return sharded_dim(0, a, e, "each rank would pick the top experts of its own slice only");
  }
  for (int i = 0; i < 2; ++i) {
    Value& o = out(i) = x;
    o.shape[static_cast<std::size_t>(e)] = k;
    o.dtype = i == 0 ? x.dtype : DType::I64;
  }
  if (op_->n_out == 2) topk_experts_[p_.outs(*op_)[1]] = x.shape[static_cast<std::size_t>(e)];
}

}  // namespace spmd::detail
