// spatial/rules_cp.cpp - placement and shape rules of context parallelism
//
// Ops: RingRotate, RingAttentionStep, RingAttention, LoadBalance, and the tags they leave on values (Value's
// zz_* and ring_* fields): the zigzag order of a sequence dim, a block rotated along the ring, a partial
// attention output that has merged some of the key blocks. Dispatched from Checker::apply() in rules.cpp;
// docs/semantics.md, context parallelism.
#include "spatial/checker.h"

namespace spmd::detail {

bool Checker::is_cp_op() const {
  return op_->kind == OpKind::RingRotate || op_->kind == OpKind::RingAttentionStep || op_->kind == OpKind::RingAttention ||
         op_->kind == OpKind::LoadBalance;
}

// Every other op drops the ring tags. A dim in zigzag order stays so in the output when the dims up to it
// keep their sizes (elementwise ops, a matmul's rows, a reshape of later dims), or moves with a Transpose.
void Checker::carry_cp_tags(Value& v) const {
  if (is_cp_op()) return;
  v.ring_axis = v.ring_dim = -1;
  v.ring_shift = 0;
  v.ring_seen = 0;
  v.zz_axis = -1;
  v.zz_dims = 0;
  for (int i = 0; i < n_in(); ++i) {
    const Value& x = in(i);
    if (!x.zz_dims) continue;
    if (op_->kind == OpKind::Transpose) {
      if (at().dims == kNoIndex || p_.int_lists[at().dims].size() != 2) return;
      int d0 = p_.int_lists[at().dims][0], d1 = p_.int_lists[at().dims][1];
      d0 = d0 < 0 ? d0 + x.rank : d0, d1 = d1 < 0 ? d1 + x.rank : d1;
      unsigned m = x.zz_dims, b0 = m >> d0 & 1u, b1 = m >> d1 & 1u;
      m &= ~((1u << d0) | (1u << d1));
      v.zz_dims = static_cast<std::uint8_t>(m | (b0 << d1) | (b1 << d0));
      v.zz_axis = x.zz_axis;
      return;
    }
    for (int d = 0; d < std::min<int>(x.rank, v.rank); ++d) {
      if (x.shape[static_cast<std::size_t>(d)] != v.shape[static_cast<std::size_t>(d)]) break;
      if (x.zz_dims >> d & 1u) {
        v.zz_dims = static_cast<std::uint8_t>(v.zz_dims | (1u << d));
        v.zz_axis = x.zz_axis;
      }
    }
  }
}

namespace {

std::string blocks_text(std::uint64_t seen) {
  std::string s;
  for (int k = 0; k < 64; ++k)
    if (seen >> k & 1u) s += (s.empty() ? "" : ", ") + std::to_string(k);
  return s;
}

}  // namespace

// A partial attention output (RingAttentionStep before the last key block) is read only by the next step.
// Two of them summed is the classic bug of a hand-rolled ring: each is normalized by its own softmax
// denominator, so their sum is not the attention (the merge needs the log-sum-exp rescale).
bool Checker::cp_inputs_ok() {
  if (op_->kind == OpKind::RingAttentionStep) return true;
  int first = -1;
  for (int i = 0; i < n_in(); ++i)
    if (in(i).ring_seen) {
      if (first < 0) {
        first = i;
        continue;
      }
      if (op_->kind == OpKind::Add || op_->kind == OpKind::Sub) {
        int a = in(i).ring_axis;
        layout_conflict(fmt::format("{} sums the partial attention outputs {} and {} of the ring over {} without the log-sum-exp rescale: each "
                                    "is normalized by the softmax denominator of its own key blocks, so their sum is not the attention (partial "
                                    "attention outputs cannot be summed)",
                                    opname(), iname(first), iname(i), axn(a)),
                        iname(i), i, a,
                        fmt::format("merge with the rescale: pass the running output and its log-sum-exp to the next step, "
                                    "{{op: RingAttentionStep, in: [q, k_next, v_next, {}, lse], out: [out2, lse2], axis: {}, step: N}}",
                                    iname(first), axn(a)));
        return false;
      }
    }
  if (first < 0) return true;
  const Value& x = in(first);
  int a = x.ring_axis;
  auto n = obl_.concrete(axis_size(a)).value_or(0);
  layout_conflict(fmt::format("{} reads {}, a partial attention output of the ring over {} that has merged the key blocks {} steps away only, of "
                              "{}: it is not the attention until every block is merged",
                              opname(), iname(first), axn(a), blocks_text(x.ring_seen), n),
                  iname(first), first, a,
                  fmt::format("rotate k and v on and merge the remaining blocks with RingAttentionStep (its accumulator inputs), or use "
                              "RingAttention over {}",
                              axn(a)));
  return false;
}

// The zigzag order (LoadBalance over an axis) of dim d of input i: that axis, or -1 for the natural order.
int Checker::zz_of(int i, int d) const {
  const Value& v = in(i);
  return d >= 0 && d < v.rank && (v.zz_dims >> d & 1u) ? v.zz_axis : -1;
}

// Inputs i and j are read position by position along their dims di and dj (an elementwise op, a mask, RoPE's
// positions, a loss's labels): both must hold the positions in one order, or each element meets another
// position's (positions in natural order against tokens reordered by LoadBalance). A dim of size 1 is
// broadcast and has no order. False after a report.
bool Checker::same_order(int i, int di, int j, int dj) {
  if (is_one(in(i).shape[static_cast<std::size_t>(di)]) || is_one(in(j).shape[static_cast<std::size_t>(dj)])) return true;
  int zi = zz_of(i, di), zj = zz_of(j, dj);
  if (zi == zj) return true;
  int z = zi >= 0 ? i : j, n = zi >= 0 ? j : i, dz = zi >= 0 ? di : dj, dn = zi >= 0 ? dj : di, a = zi >= 0 ? zi : zj;
  int other = z == i ? zj : zi;
  std::string how = other >= 0 ? fmt::format("in zigzag order over {}", axn(other)) : "in natural order";
  layout_conflict(fmt::format("{} reads {} and {} position by position, but dim {} of {} is in zigzag order over {} (LoadBalance) and dim {} of {} is "
                              "{}: each element meets another position's (tokens, positions, masks and labels must be reordered alike)",
                              opname(), iname(i), iname(j), dz, iname(z), axn(a), dn, iname(n), how),
                  iname(n), n, a,
                  fmt::format("reorder {} as {} was: insert {{op: LoadBalance, in: [{}], out: {}_zz, axis: {}, dim: {}}} where it is still whole (before "
                              "it is sharded) and read {}_zz here; or undo the zigzag of {} first (`direction: inverse`)",
                              iname(n), iname(z), iname(n), iname(n), axn(a), dn, iname(n), iname(z)));
  return false;
}

// Every pair of inputs of an elementwise op whose dims meet in output dim k (right-aligned, neither broadcast)
// hold them in one order. False after a report.
bool Checker::orders_ok(const Value& o) {
  for (int k = 0; k < o.rank; ++k) {
    int first = -1, fd = -1;
    for (int i = 0; i < n_in(); ++i) {
      int d = k - (o.rank - in(i).rank);
      if (d < 0 || is_one(in(i).shape[static_cast<std::size_t>(d)])) continue;
      if (first < 0) first = i, fd = d;
      else if (!same_order(first, fd, i, d)) return false;
    }
  }
  return true;
}

// The one mesh axis a ring op runs over; -1 after a report.
int Checker::cp_axis() {
  std::vector<int> v = coll_axes(false);
  if (v.size() == 1) return v[0];
  illegal(fmt::format("{} runs a ring over one mesh axis, but `axis` names {}", opname(), v.size()), -1, "name the context-parallel axis alone");
  return -1;
}

// The ring's size: concrete, at most 64 (a ring of symbolic size is not modelled); nullopt after a report.
std::optional<std::int64_t> Checker::ring_size(int a) {
  auto n = obl_.concrete(axis_size(a));
  if (n && *n >= 1 && *n <= 64) return n;
  illegal(fmt::format("{} over {} needs a concrete ring of 1 to 64 ranks, but the axis has {}", opname(), axn(a), axsize(a)), -1,
          fmt::format("give mesh axis {} a concrete size", axn(a)));
  return std::nullopt;
}

// The causal mask uses positions in `order` (contiguous or zigzag over a): dim s of input i must hold its
// sequence in that order, or every rank masks with the wrong positions.
bool Checker::cp_order_ok(int i, int a, int s) {
  const Value& x = in(i);
  bool zz = (x.zz_dims >> s & 1u) != 0;
  bool want = at().order == 1;
  if (zz && x.zz_axis != a) {
    layout_conflict(fmt::format("causal {} masks with positions over {}, but {} holds dim {} in zigzag order over {}", opname(), axn(a), iname(i), s,
                                axn(x.zz_axis)),
                    iname(i), i, a, fmt::format("reorder with LoadBalance over {}", axn(a)));
    return false;
  }
  if (zz == want) return true;
  layout_conflict(fmt::format("causal {} masks with {} global positions over {} (`order: {}`), but {} holds its sequence (dim {}) in {} order: the "
                              "zigzag chunks are in the wrong order, so every rank masks the wrong keys",
                              opname(), want ? "zigzag" : "contiguous", axn(a), want ? "zigzag" : "contiguous", iname(i), s,
                              zz ? "zigzag" : "contiguous"),
                  iname(i), i, a,
                  zz ? std::string("set `order: zigzag` (the data went through LoadBalance)")
                     : fmt::format("reorder q, k and v with {{op: LoadBalance, axis: {}, dim: {}}} before sharding them, or set `order: contiguous`", axn(a), s));
  return false;
}

// q, k, v (inputs 0-2) over an axis other than the ring's: alike on batch or heads, whole, or per-rank values.
bool Checker::cp_other_axis(int a, int ring, int b, int h, int dd, Value& o) {
  Placement q = pin(0, a), k = pin(1, a), v = pin(2, a);
  for (int i = 0; i < 3; ++i)
    if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v"), false;
  if (q.is_s(dd) || k.is_s(dd))
    return sharded_dim(q.is_s(dd) ? 0 : 1, a, dd, "the q.k scores contract head_dim, so each rank would softmax partial scores"), false;
  if (q == k && k == v && (q.is_r() || q.is_i() || q.is_s(h) || q.is_s(b))) {
    set_from(o, a, q, 0);
    return true;
  }
  if (q.is_s(h) && k.is_r() && v.is_r() && kv_heads_held_whole(a, h)) {
    set_from(o, a, q, 0);
    return true;
  }
  if ((q.is_v() || q.is_r()) && (k.is_v() || k.is_r()) && (v.is_v() || v.is_r())) {
    set_new(o, a, Placement::v(), "attention over per-rank values gives per-rank values");
    return true;
  }
  layout_conflict(fmt::format("{} over {} gets q {}, k {}, v {} over {}: the shards do not line up (shard q, k and v alike on batch or heads)",
                              opname(), axn(ring), ps(q), ps(k), ps(v), axn(a)),
                  iname(0), 0, a, fmt::format("give q, k and v the same placement over {}", axn(a)));
  return false;
}

void Checker::ring_rotate() {
  int a = cp_axis();
  if (a < 0) return;
  auto n = ring_size(a);
  if (!n) return;
  const Value& x = in(0);
  Value& o = out() = x;
  if (x.ring_seen) {
    layout_conflict(fmt::format("RingRotate moves {}, a partial attention output: the accumulator stays on its rank while k and v rotate", iname(0)),
                    iname(0), 0, a, "rotate the k and v blocks, not the accumulator");
    return;
  }
  std::int64_t dir = at().choice == 1 ? *n - 1 : 1;  // prev: N - 1 steps forward
  Placement p = pin(0, a);
  if (p.is_s()) {
    if (*n == 1) return;
    if (uneven_dim(x, p.dim))  // (the oracle, like a ring of fixed-size sends, moves equal blocks only)
      return report(CheckId::ShapeMismatch,
                    fmt::format("RingRotate over {} moves each rank's block of dim {} of {} to the {} rank, but the dim ({}) is cut unevenly "
                                "(`uneven`: torch.chunk's blocks): the blocks differ in size, so a rank would receive a block of another size "
                                "than its own",
                                axn(a), p.dim, iname(0), dir == 1 ? "next" : "previous", dstr(x.shape[static_cast<std::size_t>(p.dim)])),
                    iname(0), {fix(kPadSequenceFix)});
    o.ring_axis = static_cast<std::int8_t>(a);
    o.ring_dim = p.dim;
    o.ring_shift = static_cast<std::int32_t>(dir % *n);
    set_new(o, a, Placement::v(), fmt::format("RingRotate over {} moves each rank's block of dim {} to the {} rank", axn(a), p.dim, dir == 1 ? "next" : "previous"));
    o.fresh |= 1u << a;
    return;
  }
  if (p.is_v() && x.ring_axis == a && x.ring_dim >= 0) {
    o.ring_shift = static_cast<std::int32_t>((x.ring_shift + dir) % *n);
    if (o.ring_shift == 0) {  // home again after N rotations
      set_new(o, a, Placement::s(x.ring_dim), fmt::format("RingRotate over {} brings every block home (N rotations)", axn(a)));
      o.ring_axis = o.ring_dim = -1;
      o.fresh &= ~(1u << a);
    }
    return;
  }
  // R, I: every rank passes the same value; P: the summands move between ranks, the pending sum stays; V: per-rank values.
}

void Checker::ring_attention_step() {
  int b, h, s, dd;
  int a = cp_axis();
  if (a < 0 || !attention_shapes(b, h, s, dd)) return;
  for (int i = 0; i < 3; ++i)  // (causal: q's and each rotated k block's positions are a rank index times a block length)
    if (!cp_sequence_even(i, s, a)) return;
  auto n = ring_size(a);
  if (!n) return;
  const Value& Q = in(0);
  if (!pin(0, a).is_s(s))
    return layout_conflict(fmt::format("RingAttentionStep needs q ({}) sharded on the sequence (S({})) over {}, but it is {}", iname(0), s, axn(a), ps(pin(0, a))),
                           iname(0), 0, a, fmt::format("shard q on dim {} over {}, or use FlashAttention", s, axn(a)));
  // Which block of k and v this rank holds: shift 0 for the sequence shard, the rotations RingRotate made.
  std::int64_t shift[3] = {0, 0, 0};
  for (int i = 1; i < 3; ++i) {
    const Value& x = in(i);
    Placement p = pin(i, a);
    if (p.is_s(s)) continue;
    if (p.is_v() && x.ring_axis == a && x.ring_dim == s && !x.ring_seen) {
      shift[i] = x.ring_shift;
      continue;
    }
    return layout_conflict(fmt::format("RingAttentionStep needs {} ({}) sharded on the sequence (S({})) over {}, or a block of it RingRotate "
                                       "moved, but it is {}",
                                       i == 1 ? "k" : "v", iname(i), s, axn(a), ps(p)),
                           iname(i), i, a, fmt::format("shard {} on dim {} over {}", iname(i), s, axn(a)));
  }
  if (shift[1] != shift[2])
    return layout_conflict(fmt::format("RingAttentionStep gets k ({}) rotated {} times and v ({}) rotated {} times over {}: each rank would weigh "
                                       "one block's values by another block's keys",
                                       iname(1), shift[1], iname(2), shift[2], axn(a)),
                           iname(2), 2, a, "rotate k and v together");
  std::int64_t step = at().k % *n;
  if (step != shift[1])
    return layout_conflict(fmt::format("RingAttentionStep says `step: {}`, but k ({}) holds the key block {} rotation{} away over {}: the causal mask "
                                       "would use another block's global positions",
                                       at().k, iname(1), shift[1], shift[1] == 1 ? "" : "s", axn(a)),
                           iname(1), 1, a, fmt::format("step: {}", shift[1]));
  if (at().causal && (!cp_order_ok(0, a, s) || !cp_order_ok(1, a, s))) return;
  std::uint64_t seen = 0;
  if (n_in() == 5) {
    const Value& O = in(3);
    const Value& L = in(4);
    for (int i = 3; i < 5; ++i)
      if (!in(i).ring_seen || in(i).ring_axis != a)
        return layout_conflict(fmt::format("RingAttentionStep merges into {} ({}), which is not a partial attention output of a ring over {} (the "
                                           "out and lse of an earlier RingAttentionStep)",
                                           i == 3 ? "the running output" : "the running log-sum-exp", iname(i), axn(a)),
                               iname(i), i, a, "pass the out and lse of the previous step, or drop the accumulator inputs on the first step");
    if (O.ring_seen != L.ring_seen)
      return layout_conflict(fmt::format("RingAttentionStep merges into {} and {}, which come from different steps (key blocks {} and {})", iname(3),
                                         iname(4), blocks_text(O.ring_seen), blocks_text(L.ring_seen)),
                             iname(4), 4, a, "pass the out and lse of one step");
    if (O.rank != 4 || L.rank != 4)
      return report(CheckId::ShapeMismatch, fmt::format("RingAttentionStep's accumulator {} and {} must have rank 4", iname(3), iname(4)), iname(3));
    for (int d = 0; d < 4; ++d) {
      ExprId want_o = d == dd ? in(2).shape[static_cast<std::size_t>(dd)] : Q.shape[static_cast<std::size_t>(d)];
      ExprId want_l = d == dd ? pool_.constant(1) : Q.shape[static_cast<std::size_t>(d)];
      if (!same_dim(O.shape[static_cast<std::size_t>(d)], want_o, fmt::format("RingAttentionStep dim {} of the running output {} and of the step's", d, iname(3)),
                    iname(3)) ||
          !same_dim(L.shape[static_cast<std::size_t>(d)], want_l, fmt::format("RingAttentionStep dim {} of the running log-sum-exp {}", d, iname(4)), iname(4)))
        return;
    }
    if (O.ring_seen >> step & 1u)
      return layout_conflict(fmt::format("RingAttentionStep merges the key block {} step{} away into {}, which already holds it: that block's "
                                         "keys would count twice",
                                         step, step == 1 ? "" : "s", iname(3)),
                             iname(1), 1, a, "rotate k and v on before the next step");
    seen = O.ring_seen;
  }
  seen |= std::uint64_t{1} << step;
  std::uint64_t full = *n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << *n) - 1;
  Value& o = out(0) = Q;
  o.shape[static_cast<std::size_t>(dd)] = in(2).shape[static_cast<std::size_t>(dd)];
  o.dtype = Q.dtype;
  for (int c = 0; c < axes(); ++c)
    if (c != a && !cp_other_axis(c, a, b, h, dd, o)) return;
  for (int i = 3; i < n_in(); ++i)
    for (int c = 0; c < axes(); ++c)
      if (c != a && !(pin(i, c) == pl_of(o, c)))
        return report(CheckId::PlacementMismatch,
                      fmt::format("RingAttentionStep's accumulator {} is {} over {}, but the step's output is {}", iname(i), ps(pin(i, c)), axn(c),
                                  ps(pl_of(o, c))),
                      iname(i));
  o.ring_axis = o.ring_dim = -1;
  o.ring_shift = 0;
  o.ring_seen = 0;
  if (seen == full) {
    set_from(o, a, Placement::s(s), 0);
  } else {
    set_new(o, a, Placement::v(), fmt::format("RingAttentionStep over {} has merged the key blocks {} steps away only, of {}", axn(a), blocks_text(seen), *n));
    o.fresh |= 1u << a;
    o.ring_axis = static_cast<std::int8_t>(a);
    o.ring_seen = seen;
  }
  Value& l = out(1) = o;
  l.shape[static_cast<std::size_t>(dd)] = pool_.constant(1);
  l.dtype = DType::F32;
}

void Checker::ring_attention() {
  int b, h, s, dd;
  int a = cp_axis();
  // (q's positions are its index times its block: k and v are gathered whole, so only q's cut must be even)
  if (a < 0 || !attention_shapes(b, h, s, dd) || !cp_sequence_even(0, s, a)) return;
  for (int i = 0; i < 3; ++i)
    if (!pin(i, a).is_s(s)) {
      if (pin(i, a).is_p()) return partial_misuse(i, a, "attention is nonlinear in q, k and v");
      const char* nm[] = {"q", "k", "v"};
      return layout_conflict(fmt::format("RingAttention over {} needs q, k and v sharded on the sequence (S({})), but {} ({}) is {}", axn(a), s, nm[i],
                                         iname(i), ps(pin(i, a))),
                             iname(i), i, a,
                             i == 0 || !pin(i, a).is_r() ? fmt::format("shard {} on dim {} over {}", iname(i), s, axn(a))
                                                          : fmt::format("with whole k and v use FlashAttention with `cp: {}`", axn(a)));
    }
  if (at().causal && (!cp_order_ok(0, a, s) || !cp_order_ok(1, a, s))) return;
  Value& o = out() = in(0);
  o.shape[static_cast<std::size_t>(dd)] = in(2).shape[static_cast<std::size_t>(dd)];
  for (int c = 0; c < axes(); ++c)
    if (c != a && !cp_other_axis(c, a, b, h, dd, o)) return;
  set_from(o, a, Placement::s(s), 0);
}

void Checker::load_balance() {
  int a = cp_axis();
  if (a < 0) return;
  const Value& x = in(0);
  int d = norm_dim(at().dim, x.rank, "dim", iname(0));
  if (d < 0) return;
  for (int c = 0; c < axes(); ++c)
    if (pin(0, c).is_s(d)) return sharded_dim(0, c, d, "LoadBalance reorders the whole sequence (before it is sharded)");
  ExprId chunks = pool_.mul(pool_.constant(2), axis_size(a));
  ExprId len = x.shape[static_cast<std::size_t>(d)];
  std::string what = fmt::format("LoadBalance cuts dim {} of {} ({}) into 2 x {} = {} chunks, so it must be divisible by {}", d, iname(0), dstr(len),
                                 axsize(a), dstr(chunks), dstr(chunks));
  Decision dec = obl_.decide(OblKind::Divisible, len, chunks);
  if (dec == Decision::Fails) return report(CheckId::ShapeMismatch, what + ", but it is not", iname(0));
  if (dec == Decision::Deferred && obl_.first_time(OblKind::Divisible, len, chunks))
    obl_.push({OblKind::Divisible, len, chunks, CheckId::ShapeMismatch, here(), op_idx_, iname(0), what, {}});
  Value& o = out() = x;
  o.ring_axis = o.ring_dim = -1;
  o.ring_shift = 0;
  o.ring_seen = 0;
  if (at().choice == 1) {
    o.zz_dims = static_cast<std::uint8_t>(o.zz_dims & ~(1u << d));
  } else {
    if (o.zz_axis != a) o.zz_dims = 0;
    o.zz_axis = static_cast<std::int8_t>(a);
    o.zz_dims = static_cast<std::uint8_t>(o.zz_dims | (1u << d));
  }
  if (!o.zz_dims) o.zz_axis = -1;
}

}  // namespace spmd::detail
