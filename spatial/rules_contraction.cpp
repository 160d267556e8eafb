// spatial/rules_contraction.cpp - placement and shape rules of the contractions
//
// Ops: MatMul, FlashAttention, Embedding. Dispatched from Checker::apply() in rules.cpp.
#include "spatial/checker.h"

namespace spmd::detail {

void Checker::matmul() {
  const Value& A = in(0);
  const Value& B = in(1);
  int ra = A.rank, rb = B.rank;
  if (ra < 2 || rb < 2)
    return report(CheckId::ShapeMismatch, fmt::format("MatMul needs operands of rank >= 2; {} has rank {} and {} has rank {}", iname(0), ra, iname(1), rb),
                  iname(ra < 2 ? 0 : 1));
  int kA = ra - 1, mA = ra - 2, kB = rb - 2, nB = rb - 1;
  if (!same_dim(A.shape[static_cast<std::size_t>(kA)], B.shape[static_cast<std::size_t>(kB)],
                [&] { return fmt::format("MatMul contracts dim {} of {} with dim {} of {}", kA, iname(0), kB, iname(1)); }, iname(1)))
    return;
  int ro = std::max(ra, rb);
  Value& o = out();
  o.rank = static_cast<std::uint8_t>(ro);
  o.dtype = A.dtype;
  o.uneven = A.uneven || B.uneven;
  // Batch dims broadcast right-aligned (B of rank 2 broadcasts over all of A's batch dims).
  for (int k = 0; k < ro - 2; ++k) {
    int da = k - (ro - ra), db = k - (ro - rb);
    ExprId ea = da >= 0 ? A.shape[static_cast<std::size_t>(da)] : -1;
    ExprId eb = db >= 0 ? B.shape[static_cast<std::size_t>(db)] : -1;
    if (ea >= 0 && eb >= 0 && !same_dim(ea, eb, [&] { return fmt::format("MatMul batch dim {} of {} against dim {} of {}", da, iname(0), db, iname(1)); }, iname(1)))
      return;
    o.shape[static_cast<std::size_t>(k)] = ea >= 0 ? ea : eb;
  }
  o.shape[static_cast<std::size_t>(ro - 2)] = A.shape[static_cast<std::size_t>(mA)];
  o.shape[static_cast<std::size_t>(ro - 1)] = B.shape[static_cast<std::size_t>(nB)];
  if (!invariant_ok({0, 1})) return;
  for (int a = 0; a < axes(); ++a) {
    Placement x = pin(0, a), y = pin(1, a);
    if (x.is_p() || y.is_p()) {
      int pi = x.is_p() ? 0 : 1;
      Placement other = pi == 0 ? y : x;
      if (other.is_p()) return partial_misuse(1, a, "a product of two pending sums is not the sum of the per-rank products");
      if (!(pi == 0 ? x : y).linear_partial()) return partial_misuse(pi, a, "a matrix product does not commute with a pending max or min");
      if (!other.is_r())
        return partial_misuse(pi, a, fmt::format("the other operand, {}, is {} over {}, so each rank's summand is multiplied by a different "
                                                 "piece",
                                                 iname(1 - pi), ps(other), axn(a)));
      set_from(o, a, pi == 0 ? x : y, pi);
      continue;
    }
    if (x.is_i() && y.is_i()) {
      set_from(o, a, x, 0);
      continue;
    }
    bool xk = x.is_s(kA), yk = y.is_s(kB);
    if (xk && yk) {
      set_new(o, a, Placement::p(), fmt::format("MatMul contracts a dim sharded S({}) x S({}) over {}", kA, kB, axn(a)));
      continue;
    }
    if (xk || yk) {
      int si = xk ? 0 : 1;
      std::vector<Note> notes;
      origin_note(notes, in(si), a);
      notes.push_back(fix(fmt::format("shard both sides of the contraction (make {} S({}) over {}, the row-parallel pattern) or gather {} first",
                                      iname(1 - si), xk ? kB : kA, axn(a), iname(si))));
      return report(CheckId::ShapeMismatch,
                    fmt::format("MatMul contracts dim {} of {} ({} over {}) with dim {} of {} ({} over {}): one side holds a 1/{} slice of "
                                "the contraction dim and the other the whole, so the local shapes do not fit",
                                kA, iname(0), ps(x), axn(a), kB, iname(1), ps(y), axn(a), axsize(a)),
                    iname(si), std::move(notes));
    }
    // V with R or V gives V; V with a shard is read like R (its local slice), so the shard stays.
    if ((x.is_v() && !y.is_s()) || (y.is_v() && !x.is_s())) {
      set_new(o, a, Placement::v(), fmt::format("MatMul of {} and {} gives per-rank values", ps(x), ps(y)));
      continue;
    }
    auto out_dim_a = [&](int d) { return d + (ro - ra); };  // A's batch dims and m
    auto out_dim_b = [&](int d) { return d == nB ? ro - 1 : d + (ro - rb); };
    if (x.is_r() && y.is_r()) {
      set_from(o, a, x, 0);
    } else if (x.is_s() && (y.is_r() || y.is_v())) {
      if (x.dim < mA && !slice_ok(1, a, out_dim_a(x.dim) - (ro - rb), 0)) return;  // a batch shard slices B's batch dim
      set_from(o, a, Placement::s(out_dim_a(x.dim)), 0);
    } else if ((x.is_r() || x.is_v()) && y.is_s()) {
      if (y.dim < kB && !slice_ok(0, a, out_dim_b(y.dim) - (ro - ra), 1)) return;
      set_from(o, a, Placement::s(out_dim_b(y.dim)), 1);
    } else if (x.is_s() && y.is_s() && x.dim != mA && y.dim != nB && out_dim_a(x.dim) == out_dim_b(y.dim)) {
      set_from(o, a, Placement::s(out_dim_a(x.dim)), 0);
    } else {
      std::string what = x.dim == mA && y.dim == nB
                             ? "each rank multiplies its own rows by its own columns, so only the diagonal blocks are computed (the "
                               "block-diagonal bug); the result would be sharded two ways"
                             : "the two operands are split along dims that do not correspond, so the result would be sharded two ways";
      return layout_conflict(fmt::format("MatMul of {} ({} over {}) and {} ({} over {}): {}", iname(0), ps(x), axn(a), iname(1), ps(y), axn(a), what),
                             iname(1), 1, a,
                             fmt::format("replicate one operand over {}: e.g. insert {{op: AllGather, in: [{}], out: {}_full, axis: {}, dim: {}}} "
                                         "before this op",
                                         axn(a), iname(1), iname(1), axn(a), y.dim));
    }
  }
}

// Query heads sharded over axis `a` with k and v whole there: exact when each rank holds one kv head (the kv
// heads cut by axes outer to `a` only, down to one per rank) that every query head of the rank groups with.
// The ranks along `a` then hold consecutive query heads of one kv group (GQA with fewer kv heads than tp:
// tp factored into an outer axis over the kv heads and an inner one that replicates each). Also exact when `a` has
// one rank (tp 1, or the plan's own forward on a mesh of ones): q's cut there is no cut, so each rank's query heads
// and kv heads are the same blocks of their groups as the outer axes leave them.
bool Checker::kv_heads_held_whole(int a, int h, int ki) {
  if (obl_.decide(OblKind::Equal, axis_size(a), pool_.constant(1)) == Decision::Holds) return true;
  ExprId n = pool_.constant(1);
  for (int c = 0; c < axes(); ++c) {
    Placement k = pin(ki, c), v = pin(ki + 1, c);
    if (!(k == v)) return false;
    if (!k.is_s(h)) continue;
    if (c >= a) return false;  // the kv heads must be cut by axes outer to a
    n = pool_.mul(n, axis_size(c));
  }
  ExprId kv = in(ki).shape[static_cast<std::size_t>(h)];
  Decision d = obl_.decide(OblKind::Equal, kv, n);
  if (d == Decision::Deferred && obl_.first_time(OblKind::Equal, kv, n))  // symbolic: one kv head per rank for every allowed size
    obl_.push({OblKind::Equal, kv, n, CheckId::LayoutConflict, here(), op_idx_, iname(ki),
               fmt::format("{} shards the query heads of {} over {} with {} whole there, which needs exactly one kv head per rank: the kv heads "
                           "of {} ({}) must equal the ranks that cut them ({})",
                           opname(), iname(ki - 1), axn(a), iname(ki), iname(ki), dstr(kv), dstr(n)),
               {}});
  return d != Decision::Fails;
}

// q at input `qi`, k and v at `ki`, `ki` + 1, their heads on dim `h`: each rank's kernel groups its local query
// heads over its local kv heads (query head i with kv head i / (its query heads / its kv heads)). With even cuts the
// placement rules above make that the whole attention's grouping (query head g with kv head g / (NH / NKV)). An uneven
// cut (`uneven`: torch.chunk's blocks, several axes cutting in turn as DTensor's nested shards do) is checked rank
// by rank at the declared sizes: every rank's pairs must be the whole attention's (6 query heads over tpo 2 x tpi 4,
// 2 kv heads over tpo: 3, 3 and then 1, 1, 1, 0, each rank's heads in its tpo block's kv group, are right; 6 query
// heads and 2 kv heads both over tp 4, 2, 2, 2, 0 and 1, 1, 0, 0, pair query head 2 with kv head 1 on rank 1). False
// after a report.
bool Checker::heads_cut_evenly(int h, int qi, int ki) {
  const std::size_t hu = static_cast<std::size_t>(h);
  if (!uneven_dim(in(qi), h) && !uneven_dim(in(ki), h) && !uneven_dim(in(ki + 1), h)) return true;
  const int inputs[2] = {qi, ki};
  int order[2][kMaxAxes], cuts[2];
  cuts[0] = shard_order(in(qi).pl.data(), axes(), h, order[0]);
  cuts[1] = shard_order(in(ki).pl.data(), axes(), h, order[1]);
  if (in(qi).shape[hu] == in(ki).shape[hu] && cuts[0] == cuts[1] && std::equal(order[0], order[0] + cuts[0], order[1]))
    return true;  // as many heads, cut alike: the same torch.chunk blocks on every rank, whatever the sizes
  std::int64_t heads[2] = {0, 0};
  std::uint32_t used = 0;
  bool known = true;
  for (int s = 0; s < 2; ++s) {
    const Value& x = in(inputs[s]);
    known &= pool_.is_const(x.shape[hu]);
    if (known) heads[s] = pool_.value(x.shape[hu]);
    for (int i = 0; i < cuts[s]; ++i) used |= 1u << order[s][i], known &= pool_.is_const(axis_size(order[s][i]));
  }
  const std::uint32_t cut = used | shard_mask(in(ki + 1), h);  // (v's cut shows in the note; it pairs as k's)
  int note_axis = -1;  // the innermost axis of more than one rank that cuts the heads
  for (int a = 0; a < axes(); ++a)
    if ((cut >> a & 1u) && (note_axis < 0 || !(pool_.is_const(axis_size(a)) && pool_.value(axis_size(a)) == 1))) note_axis = a;
  if (note_axis < 0) return true;  // (no cut: nothing uneven)
  const int note_in = pin(qi, note_axis).is_s(h) ? qi : pin(ki, note_axis).is_s(h) ? ki : ki + 1;
  auto conflict = [&](const std::string& why) {
    return layout_conflict(fmt::format("{} groups the query heads of {} ({}) over the kv heads of {} ({}) on each rank, and they are cut unevenly "
                                       "(`uneven`): {}",
                                       opname(), iname(qi), dstr(in(qi).shape[hu]), iname(ki), dstr(in(ki).shape[hu]), why),
                           iname(note_in), note_in, note_axis,
                           fmt::format("cut the heads of q, k and v into equal shards (their counts divisible by the ranks that cut them), or "
                                       "gather {} along dim {}",
                                       iname(note_in), h)),
           false;
  };
  if (!known) return conflict("with symbolic sizes the ranks' blocks are not known, so their pairs cannot be checked");
  std::int64_t ranks = 1, size[kMaxAxes] = {};
  for (int a = 0; a < axes(); ++a)
    if (used >> a & 1u) size[a] = pool_.value(axis_size(a)), ranks *= size[a];
  if (heads[1] <= 0 || heads[0] % heads[1] != 0) return true;  // (attention_shapes reports the head counts)
  const std::int64_t group = heads[0] / heads[1];
  std::vector<std::int64_t> c(static_cast<std::size_t>(axes()), 0);
  std::int64_t work = 0;  // ranks and pairs checked so far: past a bound, not proved (a size cap would reject what is cheap)
  auto too_many = [&] { return conflict(fmt::format("{} ranks cut {} query heads, more pairs than are checked one by one", ranks, heads[0])); };
  for (std::int64_t r = 0; r < ranks; ++r) {
    if (++work > (std::int64_t{1} << 24)) return too_many();
    std::int64_t rest = r;
    for (int a = axes() - 1; a >= 0; --a)
      if (used >> a & 1u) c[static_cast<std::size_t>(a)] = rest % size[a], rest /= size[a];
    std::int64_t lo[2], len[2];
    for (int s = 0; s < 2; ++s) {  // torch.chunk's block of this rank, axis by axis in shard order
      nested_chunk(heads[s], order[s], cuts[s], size, c.data(), lo[s], len[s]);
      len[s] -= lo[s];
    }
    if (len[0] == 0) continue;
    auto rank = [&] {  // (for a report only)
      std::string t = "{";
      for (int a = 0; a < axes(); ++a)
        if (used >> a & 1u) t += fmt::format("{}{}: {}", t.size() > 1 ? ", " : "", axn(a), c[static_cast<std::size_t>(a)]);
      return t + "}";
    };
    if (len[1] == 0 || len[0] % len[1] != 0)
      return conflict(fmt::format("rank {} holds {} query head{} and {} kv head{}, which its kernel cannot group", rank(), len[0], len[0] == 1 ? "" : "s",
                                  len[1], len[1] == 1 ? "" : "s"));
    if ((work += len[0]) > (std::int64_t{1} << 24)) return too_many();
    for (std::int64_t i = 0; i < len[0]; ++i)
      if ((lo[0] + i) / group != lo[1] + i / (len[0] / len[1]))
        return conflict(fmt::format("rank {} pairs query head {} with kv head {}, where the whole attention pairs it with kv head {}", rank(), lo[0] + i,
                                    lo[1] + i / (len[0] / len[1]), (lo[0] + i) / group));
  }
  return true;
}

// Context parallelism over axis `a` (`cp`, a ring): the causal mask takes a rank's global positions as its index
// along the axis times its local sequence length (as a kernel given position offsets computes them, and a ring's
// blocks), which is its block's start only when the sequence (dim `s` of input `qi`) is cut evenly. Without `causal`
// no position is used. False after a report.
bool Checker::cp_sequence_even(int qi, int s, int a) {
  if (!at().causal || !uneven_dim(in(qi), s)) return true;
  return report(CheckId::ShapeMismatch,
                fmt::format("causal {} over {} takes each rank's global positions as its index times its local sequence length, but the "
                            "sequence of {} (dim {}, {}) is cut unevenly (`uneven`: torch.chunk's blocks), so some rank's mask is off",
                            opname(), axn(a), iname(qi), s, dstr(in(qi).shape[static_cast<std::size_t>(s)])),
                iname(qi), {fix(kPadSequenceFix)}),
         false;
}

// `cp` on an attention op with q at input `qi` (FlashAttention, AttentionGrad): one axis, over which a causal op's q
// is sharded on the sequence, evenly (the mask is offset by each rank's global positions there). False after a report.
bool Checker::cp_ok(int qi, int s) {
  if (std::popcount(at().axes) > 1)
    return illegal(fmt::format("{}'s `cp` names {} axes; the causal mask's positions come from one sequence-sharding axis", opname(),
                               std::popcount(at().axes)),
                   -1, "name the context-parallel axis alone"),
           false;
  for (int a = 0; a < axes(); ++a) {
    if (!(at().causal && (at().axes >> a & 1u))) continue;
    Placement q = pin(qi, a);
    if (!q.is_s(s))
      return layout_conflict(fmt::format("{} offsets the causal mask by each rank's global positions over {} (`cp: {}`), but q is {} there, not "
                                         "sharded on the sequence (S({})): the offsets would shift a whole sequence",
                                         opname(), axn(a), axn(a), ps(q), s),
                             iname(qi), qi, a, fmt::format("drop `cp: {}`, or shard q on dim {} over {}", axn(a), s, axn(a))),
             false;
    if (!cp_sequence_even(qi, s, a)) return false;
  }
  return true;
}

// The shapes of q, k, v (inputs q0 to q0 + 2: AttentionGrad's follow dy) of an attention op and its dims by
// `layout`; false after a report.
bool Checker::attention_shapes(int& b, int& h, int& s, int& dd, int q0) {
  b = 0, h = 1, s = 2, dd = 3;
  if (at().layout == AttnLayout::BSHD) s = 1, h = 2;
  if (at().layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i)
    if (in(q0 + i).rank != 4)
      return report(CheckId::ShapeMismatch, fmt::format("{} {} ({}) must have rank 4 ({}), got shape {}", opname(), names[i], iname(q0 + i),
                                                        at().layout == AttnLayout::BHSD ? "batch, heads, seq, head_dim" : "see `layout`",
                                                        sstr(in(q0 + i).dims())),
                    iname(q0 + i)), false;
  auto dim = [&](int i, int d) { return in(q0 + i).shape[static_cast<std::size_t>(d)]; };
  auto same = [&](int i, int di, int j, int dj, const char* what) {
    return same_dim(dim(i, di), dim(j, dj), [&] { return fmt::format("{} {} of {} and {}", opname(), what, iname(q0 + i), iname(q0 + j)); },
                    iname(q0 + j));
  };
  if (!same(0, b, 1, b, "batch") || !same(1, b, 2, b, "batch") || !same(0, dd, 1, dd, "head_dim") || !same(1, s, 2, s, "key sequence") ||
      !same(1, h, 2, h, "heads"))
    return false;
  // Grouped-query attention: q's heads a multiple of k's, for every allowed size (an obligation when symbolic).
  if (dim(0, h) != dim(1, h)) {
    std::string what = fmt::format("{} groups the query heads of {} ({}) over the kv heads of {} ({}), so {} must be a multiple of {}",
                                   opname(), iname(q0), dstr(dim(0, h)), iname(q0 + 1), dstr(dim(1, h)), dstr(dim(0, h)), dstr(dim(1, h)));
    Decision dec = obl_.decide(OblKind::Divisible, dim(0, h), dim(1, h));
    if (dec == Decision::Fails) return report(CheckId::ShapeMismatch, what + ", but it is not", iname(q0 + 1)), false;
    if (dec == Decision::Deferred && obl_.first_time(OblKind::Divisible, dim(0, h), dim(1, h)))
      obl_.push({OblKind::Divisible, dim(0, h), dim(1, h), CheckId::ShapeMismatch, here(), op_idx_, iname(q0 + 1), what, {}});
  }
  return heads_cut_evenly(h, q0, q0 + 1) && (q0 > 0 || invariant_ok({0, 1, 2}));
}

void Checker::attention() {
  int b, h, s, dd;
  if (!attention_shapes(b, h, s, dd) || !cp_ok(0, s)) return;
  if (!same_order(1, s, 2, s)) return;  // key j's value is v's row j
  auto dim = [&](int i, int d) { return in(i).shape[static_cast<std::size_t>(d)]; };
  Value& o = out() = in(0);
  o.shape[static_cast<std::size_t>(dd)] = dim(2, dd);
  for (int a = 0; a < axes(); ++a) {
    Placement q = pin(0, a), k = pin(1, a), v = pin(2, a);
    for (int i = 0; i < 3; ++i)
      if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v");
    if (q.is_i() && k.is_i() && v.is_i()) continue;
    if (q.is_s(dd) || k.is_s(dd)) return sharded_dim(q.is_s(dd) ? 0 : 1, a, dd, "the q.k scores contract head_dim, so each rank would softmax partial scores");
    if (q == k && k == v && (q.is_r() || q.is_s(h) || q.is_s(b))) {
      set_from(o, a, q, 0);
    } else if (q.is_s(h) && k.is_r() && v.is_r() && kv_heads_held_whole(a, h)) {
      set_from(o, a, q, 0);
    } else if (q.is_s(s) && k.is_r() && v.is_r()) {
      if (at().causal && !(at().axes >> a & 1u))
        return layout_conflict(fmt::format("causal FlashAttention with q sharded on the sequence (S({}) over {}) and whole k, v, masking with local "
                                           "positions: a causal kernel with no offsets aligns the mask to the local q block, not to its global "
                                           "position, so every rank but one masks the wrong keys",
                                           s, axn(a)),
                               iname(0), 0, a,
                               fmt::format("add `cp: {}` (the kernel then masks with the global positions of each rank's q block, as a kernel "
                                           "given position offsets does), or use RingAttention over {}",
                                           axn(a), axn(a)));
      if (at().causal && (!cp_order_ok(0, a, s) || !cp_order_ok(1, a, s))) return;
      set_from(o, a, q, 0);
    } else if (q.is_r() && k.is_r() && v.is_s(dd)) {
      set_from(o, a, v, 2);
    } else if (k.is_s(s) || v.is_s(s)) {
      int i = k.is_s(s) ? 1 : 2;
      return layout_conflict(fmt::format("FlashAttention with {} sharded on the sequence dim (S({}) over {}) and no ring: each rank attends to its "
                                         "own keys only, and partial attention outputs cannot be summed (they need log-sum-exp rescaling)",
                                         iname(i), s, axn(a)),
                             iname(i), i, a, fmt::format("use RingAttention over {}, or gather k and v along dim {} first", axn(a), s));
    } else if ((q.is_v() || q.is_r()) && (k.is_v() || k.is_r()) && (v.is_v() || v.is_r())) {
      set_new(o, a, Placement::v(), "attention over per-rank values gives per-rank values");
    } else {
      return layout_conflict(fmt::format("FlashAttention gets q {}, k {}, v {} over {}: the shards do not line up (shard q, k and v alike on "
                                         "batch or heads, or q alone on the sequence)",
                                         ps(q), ps(k), ps(v), axn(a)),
                             iname(0), 0, a,
                             fmt::format("give q, k and v the same placement over {} (e.g. all S({}) for heads), or gather the odd one out", axn(a), h));
    }
  }
}

void Checker::embedding() {
  const Value& ids = in(0);
  const Value& w = in(1);
  if (w.rank != 2)
    return report(CheckId::ShapeMismatch, fmt::format("Embedding weight {} must be [vocab, hidden], got shape {}", iname(1), sstr(w.dims())), iname(1));
  if (ids.rank + 1 > kMaxRank) return report(CheckId::ShapeMismatch, "Embedding output would exceed rank 8", iname(0));
  Value& o = out();
  o.rank = static_cast<std::uint8_t>(ids.rank + 1);
  std::copy(ids.shape.begin(), ids.shape.begin() + ids.rank, o.shape.begin());
  o.shape[ids.rank] = w.shape[1];
  o.dtype = w.dtype;
  o.uneven = ids.uneven;
  int last = ids.rank;
  for (int a = 0; a < axes(); ++a) {
    Placement pi = pin(0, a), pw = pin(1, a);
    if (pi.is_p()) return partial_misuse(0, a, "token ids cannot be a pending sum", "reduce or replicate the ids first");
    bool ids_whole = pi.is_r() || pi.is_i();
    if (pw.is_i()) {
      if (!ids_whole) {
        invariant_ok({0, 1});  // reports
        if (!failed_)
          report(CheckId::InvariantMix, fmt::format("Embedding combines {}, which is I over {}, with ids {} ({})", iname(1), axn(a), iname(0), ps(pi)), iname(1));
        return;
      }
      set_from(o, a, pw, 1);
    } else if (pw.is_r()) {
      set_from(o, a, pi.is_i() ? Placement::r() : pi, 0);
    } else if (pw.is_s(0) || pw.is_s(1)) {
      if (!ids_whole)
        return layout_conflict(fmt::format("Embedding with weight {} sharded {} over {} and ids {} sharded {} over the same axis: each rank would "
                                           "look up only its own ids in only its own slice of the table",
                                           iname(1), ps(pw), axn(a), iname(0), ps(pi)),
                               iname(0), 0, a, fmt::format("replicate the ids over {}, or replicate the table", axn(a)));
      // A vocab shard's rows start at its torch.chunk offset (DTensor's _MaskPartial reads it from the layout), so an
      // uneven (declared) vocab split is exact; Megatron's VocabParallelEmbedding asserts an even one.
      if (pw.is_s(0))
        set_new(o, a, Placement::p(), fmt::format("Embedding looks up {}, which is vocab-sharded S(0) over {}: each rank holds only its rows, "
                                                  "zeros elsewhere (masked lookup)",
                                                  iname(1), axn(a)));
      else
        set_from(o, a, Placement::s(last), 1);
    } else if (pw.is_p()) {
      if (!ids_whole) return partial_misuse(1, a, "a lookup by per-rank ids in a pending sum mixes summands");
      set_from(o, a, pw, 1);
    } else if (pi.is_s()) {
      set_from(o, a, pi, 0);  // a per-rank table looked up by sharded ids: each rank holds the rows of its own ids
    } else {
      set_new(o, a, Placement::v(), "Embedding with a per-rank table gives per-rank values");
    }
  }
}

}  // namespace spmd::detail
