// interp/ops_collectives.cpp - the numeric oracle: collectives, point-to-point and conversions.
//
// Ops: step_group(), the one dispatch of ops across a group of ranks (AllReduce, AllGather, ReduceScatter,
// Broadcast, Reduce, Gather, Scatter, AllToAll), Send/Recv, Convert.
#include "interp/runner.h"

namespace spmd::interp {

void Runner::send(int oi, std::int64_t r) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  if (global_) return;
  Val v = in(oi, r, 0);
  std::int64_t dst = peer(op, r);
  queues_[{r, dst}].push_back(std::move(v));
  return;
}

void Runner::recv(int oi, std::int64_t r, const std::vector<std::int64_t>& c) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const OpAttrs& at = op.attrs;
  if (!global_ && at.shape == kNoIndex) {  // per-rank programs: the Recv takes the value its Send sent, with its layout
    auto& q = queue(op, r, true);
    Val got = std::move(q.front());
    q.pop_front();
    return set_out(oi, r, 0, std::move(got), "");
  }
  Shape g;
  if (at.shape == kNoIndex) throw InterpError("Recv needs `shape:`");
  for (ExprId e : p_.shapes[at.shape]) g.push_back(eval(e, "a dim of a Recv"));
  Val v;
  v.gshape = g;
  v.mask.assign(g.size(), 0);
  if (at.placements != kNoIndex)
    for (std::size_t a = 0; a < p_.mesh.size(); ++a) {
      Placement pl = p_.placement_maps[at.placements][a];
      if (pl.is_s()) v.mask[static_cast<std::size_t>(norm_dim(pl.dim, static_cast<int>(g.size())))] |= 1u << a;
    }
  if (global_) {
    v.t = Tensor(local_shape(v, c), 0.0);
    return set_out(oi, r, 0, std::move(v), "it is received point-to-point, which has no single-device meaning");
  }
  auto& q = queue(op, r, true);
  Val got = std::move(q.front());
  q.pop_front();
  if (p_.local_view && got.t.shape != g)  // local view: `shape:` is the local shape the rank expects
    throw InterpError("Recv expects shape " + shape_text(g) + " but receives " + shape_text(got.t.shape));
  v.t = std::move(got.t);
  return set_out(oi, r, 0, std::move(v), "");
}

std::int64_t Runner::peer(const Op& op, std::int64_t r) const {
  auto c = coords(r);
  if (op.attrs.coords == kNoIndex) throw InterpError("point-to-point op without `peer`");
  for (auto [a, v] : p_.coords[op.attrs.coords]) {
    if (v >= sizes_[static_cast<std::size_t>(a)]) throw InterpError("peer coordinate " + std::to_string(v) + " is outside axis " + p_.mesh[static_cast<std::size_t>(a)].name);
    c[static_cast<std::size_t>(a)] = v;
  }
  return rank_of(c);
}

std::deque<Val>& Runner::queue(const Op& op, std::int64_t r, bool incoming) {
  std::int64_t q = peer(op, r);
  return incoming ? queues_[{q, r}] : queues_[{r, q}];
}

void Runner::convert(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  Placement to = op.attrs.to;
  std::string t = taint;
  if (to.is_s()) {
    int d = norm_dim(to.dim, v.t.rank());
    std::uint32_t axes = op.attrs.axes & ~v.mask[static_cast<std::size_t>(d)];
    std::int64_t n, idx, lo, hi;
    part(axes, c, n, idx);
    chunk_range(v.t.shape[static_cast<std::size_t>(d)], n, idx, lo, hi);
    v.t = slice(v.t, d, lo, hi);
    v.mask[static_cast<std::size_t>(d)] |= axes;
  } else if (to.is_p() && !global_) {
    // S(d) -> P: each rank's shard in its slot of a zero tensor, so the sum over the axes is the whole.
    for (int d = 0; d < v.t.rank(); ++d) {
      std::uint32_t axes = op.attrs.axes & v.mask[static_cast<std::size_t>(d)];
      if (!axes) continue;
      std::int64_t piece = v.t.shape[static_cast<std::size_t>(d)];
      // The block the other axes leave (all of the dim when these are all that cut it) and this rank's piece in it:
      // torch.chunk's nested blocks, even or uneven. A piece outside that block (axes not innermost in the dim's
      // order, which the checker rejects) has no slot.
      const auto du = static_cast<std::size_t>(d);
      std::int64_t olo, ohi, plo, phi;
      block(v.gshape[du], v.mask[du] & ~axes, c, olo, ohi, ord_of(v, du));
      block(v.gshape[du], v.mask[du], c, plo, phi, ord_of(v, du));
      std::int64_t full = ohi - olo;
      if (!(phi - plo == piece && plo >= olo && phi <= ohi)) {
        std::int64_t n, idx;
        part(axes, c, n, idx);
        throw InterpError("Convert to P over " + std::to_string(n) + " ranks: rank " + coord_text(p_, c) + "'s piece of dim " + std::to_string(d) +
                          " is not inside the block the other axes leave it");
      }
      const std::int64_t lo = plo - olo;
      Shape zs = v.t.shape;
      zs[static_cast<std::size_t>(d)] = full;
      Tensor z(zs, 0.0);
      std::int64_t outer = 1, inner = 1;
      for (int k = 0; k < d; ++k) outer *= v.t.shape[static_cast<std::size_t>(k)];
      for (int k = d + 1; k < v.t.rank(); ++k) inner *= v.t.shape[static_cast<std::size_t>(k)];
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < piece; ++i)
          for (std::int64_t q = 0; q < inner; ++q)
            z.data[static_cast<std::size_t>((o * full + lo + i) * inner + q)] = v.t.data[static_cast<std::size_t>((o * piece + i) * inner + q)];
      v.t = std::move(z);
      v.mask[static_cast<std::size_t>(d)] &= ~axes;
    }
  }
  // Convert to V moves no data: from R every rank keeps the whole value, which is the single-device value
  // (a later reduction of those copies must keep it; the checker rejects a sum of them).
  if (to.is_v()) vlabel_in_ |= op.attrs.axes;
  else vlabel_in_ &= ~op.attrs.axes;
  set_out(oi, r, 0, std::move(v), t);
}

std::vector<std::int64_t> Runner::group(const Op& op, std::int64_t r) {
  std::uint32_t axes = op.attrs.axes;
  if ((op.kind == OpKind::CrossEntropyLoss || op.kind == OpKind::CrossEntropyGrad) && !axes) {
    // No `axis`: the axes that shard the vocab; with none, the group a vocab-parallel kernel uses
    // anyway (Megatron's tensor-parallel group: the axis named tp, else the whole mesh).
    NameId lg = p_.ins(op)[op.kind == OpKind::CrossEntropyGrad ? 1 : 0];
    const Val& v = at(r, lg);
    if (v.defined && !v.mask.empty()) axes = v.mask.back();
    for (std::size_t a = 0; a < p_.mesh.size() && !axes; ++a)
      if (p_.mesh[a].name == "tp") axes = 1u << a;
    if (!axes) axes = (1u << p_.mesh.size()) - 1;
  }
  auto c = coords(r);
  std::vector<std::int64_t> m;
  for (std::int64_t q = 0; q < ranks_; ++q) {
    const auto& cq = coords(q);
    bool same = true;
    for (std::size_t a = 0; a < sizes_.size(); ++a)
      if (!(axes & (1u << a)) && cq[a] != c[a]) same = false;
    if (same) m.push_back(q);
  }
  return m;
}

// Max and Min pick an element (by d): a reduction over ranks picks what the single-device reduction picks.
Num Runner::combine(ReduceOp op, const Num& a, const Num& b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return a + b;
    case ReduceOp::Max: return pick_max(a, b);
    case ReduceOp::Min: return pick_min(a, b);
  }
  return a;
}

Tensor Runner::reduce_all(const std::vector<const Val*>& xs, ReduceOp op, std::uint32_t axes) {
  Tensor acc = xs[0]->t;
  for (std::size_t k = 1; k < xs.size(); ++k)
    if (xs[k]->t.shape != acc.shape)
      throw InterpError("ranks hold different local shapes (" + shape_text(acc.shape) + " and " + shape_text(xs[k]->t.shape) + ") for one reduction");
  if ((op == ReduceOp::Max || op == ReduceOp::Min) && num::sets()) {  // as sets (num.h, set_extreme)
    std::vector<const Num*> at(xs.size());
    for (std::size_t e = 0; e < acc.data.size(); ++e) {
      for (std::size_t k = 0; k < xs.size(); ++k) at[k] = &xs[k]->t.data[e];
      acc.data[e] = num::set_extreme(at.data(), at.size(), op == ReduceOp::Max);
    }
  } else {
    for (std::size_t k = 1; k < xs.size(); ++k)
      for (std::size_t e = 0; e < acc.data.size(); ++e) acc.data[e] = combine(op, acc.data[e], xs[k]->t.data[e]);
  }
  if (op == ReduceOp::Avg) {  // over the group's declared size (value_sizes: the same but on a reduced mesh)
    auto group = static_cast<std::int64_t>(xs.size());
    if (ranks_over(axes, sizes_) == group) group = ranks_over(axes, value_sizes_);
    const Num n = static_cast<double>(group);
    for (auto& e : acc.data) e /= n;
  }
  charge(acc.numel() * static_cast<std::int64_t>(xs.size()));
  return acc;
}

void Runner::step_group(int oi, const std::vector<std::int64_t>& members) {
  failed_op = oi;
  failed_rank = members[0];
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  if (op.kind == OpKind::CrossEntropyLoss) return cross_entropy(oi, members);
  if (op.kind == OpKind::CrossEntropyGrad) return cross_entropy_grad(oi, members);
  if (op.kind == OpKind::MoEGateGrad) return moe_gate_grad(oi, members);
  if (op.kind == OpKind::MoEDispatch || op.kind == OpKind::MoECombine) return moe(oi, members);
  if (op.kind == OpKind::RingRotate || op.kind == OpKind::RingAttention) return ring_group(oi, members);
  if (op.kind == OpKind::GradNormSq) return grad_norm_sq(oi, members);  // ops_optim.cpp
  const OpAttrs& at = op.attrs;
  std::size_t n = members.size();
  std::vector<const Val*> xs;
  for (std::size_t k = 0; k < members.size(); ++k) xs.push_back(&in(member_op(oi, k), members[k], 0));
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  std::vector<Val> outs(n);
  std::uint32_t axes = at.axes;
  auto src_member = [&](const char* what) -> std::size_t {
    std::size_t s = at.rank < 0 ? 0 : static_cast<std::size_t>(at.rank);
    if (global_) return 0;  // the single-device run: the identity (a one-rank group checks the root like any other)
    if (s >= n) throw InterpError(std::string(what) + " rank " + std::to_string(s) + " is outside a group of " + std::to_string(n));
    return s;
  };
  auto dim_of = [&](int d, const Val& v) { return norm_dim(d == kUnset ? 0 : d, static_cast<int>(v.gshape.size())); };  // ZeRO: dim 0 by default
  switch (op.kind) {
    case OpKind::AllReduce: {
      Tensor red = reduce_all(xs, at.rop, axes);
      for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[k], outs[k].t = red;
      break;
    }
    case OpKind::AllGather:
    case OpKind::ZeROGatherParam: {  // ops_zero.cpp: ZeRO's gather is an AllGather
      int d = dim_of(at.dim, *xs[0]);
      std::vector<Tensor> parts;
      for (auto* x : xs) parts.push_back(x->t);
      Tensor all = concat(parts, d);
      for (std::size_t k = 0; k < n; ++k) {
        outs[k] = *xs[k], outs[k].t = all, outs[k].mask[static_cast<std::size_t>(d)] &= ~axes;
        if (static_cast<std::size_t>(d) < outs[k].ord.size()) outs[k].ord[static_cast<std::size_t>(d)] = drop_from_order(outs[k].ord[static_cast<std::size_t>(d)], axes);
      }
      break;
    }
    case OpKind::ReduceScatter:
    case OpKind::ZeROScatterGrad: {  // ops_zero.cpp: ZeRO's gradient scatter is a ReduceScatter (torch.chunk slices)
      int d = dim_of(at.dim, *xs[0]);
      Tensor red = reduce_all(xs, at.rop, axes);
      for (std::size_t k = 0; k < n; ++k) {
        std::int64_t lo, hi;
        chunk_range(red.shape[static_cast<std::size_t>(d)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
        outs[k] = *xs[k], outs[k].t = slice(red, d, lo, hi);
        auto du = static_cast<std::size_t>(d);
        std::uint32_t w = add_to_order(ord_of(outs[k], du), outs[k].mask[du], axes);
        if (w || du < outs[k].ord.size()) outs[k].ord.resize(std::max(outs[k].ord.size(), outs[k].mask.size()), 0), outs[k].ord[du] = w;
        outs[k].mask[du] |= axes;
      }
      break;
    }
    case OpKind::Broadcast: {
      std::size_t s = src_member("Broadcast source");
      for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[s];
      break;
    }
    case OpKind::Reduce: {
      std::size_t s = src_member("Reduce destination");
      Tensor red = reduce_all(xs, at.rop, axes);
      for (std::size_t k = 0; k < n; ++k) outs[k] = *xs[k], outs[k].t = k == s ? red : nan_like(red);
      if (global_) taint = "Reduce leaves its result on one rank only (V)";
      break;
    }
    case OpKind::Gather: {
      std::size_t s = src_member("Gather destination");
      int d = dim_of(at.dim, *xs[0]);
      std::vector<Tensor> parts;
      for (auto* x : xs) parts.push_back(x->t);
      Tensor all = concat(parts, d);
      for (std::size_t k = 0; k < n; ++k)
        outs[k] = *xs[k], outs[k].t = k == s ? all : nan_like(all), outs[k].mask[static_cast<std::size_t>(d)] &= ~axes;
      if (global_) taint = "Gather leaves its result on one rank only (V)";
      break;
    }
    case OpKind::Scatter: {
      std::size_t s = src_member("Scatter source");
      int d = dim_of(at.dim, *xs[s]);
      for (std::size_t k = 0; k < n; ++k) {
        std::int64_t lo, hi;
        chunk_range(xs[s]->t.shape[static_cast<std::size_t>(d)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
        outs[k] = *xs[s], outs[k].t = slice(xs[s]->t, d, lo, hi), outs[k].mask[static_cast<std::size_t>(d)] |= axes;
      }
      break;
    }
    case OpKind::AllToAll: {
      // S(concat) -> S(split) moves the shard; on values the axes do not shard along concat_dim (V) each rank's
      // split dim shrinks and its concat dim grows (the global shape of a V is its per-rank shape).
      int sd = dim_of(at.dim, *xs[0]), cd = dim_of(at.dim2, *xs[0]);
      bool moves = (xs[0]->mask[static_cast<std::size_t>(cd)] & axes) == axes;
      // Exchanging values labelled V gives each rank pieces of every rank's values: no single-device value,
      // even when the ranks held copies of one value (Convert R -> V).
      if (global_ && !moves && (xs[0]->vlabel & axes) && taint.empty()) taint = "AllToAll of per-rank values (V) mixes every rank's values";
      if (global_ && !moves && sd != cd && !taint.empty()) {
        // A V value has no single-device meaning, but later ops need its per-rank shape: split by the real group.
        const std::int64_t g = ranks_over(axes, real_sizes_);
        Val v = *xs[0];
        if (v.gshape[static_cast<std::size_t>(sd)] % g) throw InterpError("AllToAll cannot split dim " + std::to_string(sd) + " into " + std::to_string(g));
        v.gshape[static_cast<std::size_t>(sd)] /= g;
        v.gshape[static_cast<std::size_t>(cd)] *= g;
        v.t = Tensor(v.gshape, 0.0);
        outs[0] = std::move(v);
        break;
      }
      // `split_sizes` (all_to_all_single's input_split_sizes): each sender's offsets of the pieces it sends, evaluated on
      // the sender (they may use axis_index); without them the torch.chunk blocks. One device: the identity.
      std::vector<std::vector<std::int64_t>> offsets;
      if (at.shape != kNoIndex && n > 1) {
        const auto& sizes = p_.shapes[at.shape];
        if (sizes.size() != n)
          throw InterpError("AllToAll lists " + std::to_string(sizes.size()) + " split sizes for a group of " + std::to_string(n) + " ranks");
        for (std::size_t j = 0; j < n; ++j) {
          failed_rank = members[j];
          std::vector<std::int64_t> off{0};
          for (ExprId e : sizes) off.push_back(off.back() + eval(e, "a split size of AllToAll"));
          std::int64_t have = xs[j]->t.shape[static_cast<std::size_t>(sd)];
          if (off.back() != have)
            throw InterpError("AllToAll's split sizes add up to " + std::to_string(off.back()) + ", but dim " + std::to_string(sd) + " of rank " +
                              coord_text(p_, coords(members[j])) + "'s piece has " + std::to_string(have));
          offsets.push_back(std::move(off));
        }
        failed_rank = members[0];
      }
      for (std::size_t k = 0; k < n; ++k) {
        std::vector<Tensor> parts;
        for (std::size_t j = 0; j < n; ++j) {
          std::int64_t lo, hi;
          if (offsets.empty()) chunk_range(xs[j]->t.shape[static_cast<std::size_t>(sd)], static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), lo, hi);
          else lo = offsets[j][k], hi = offsets[j][k + 1];
          parts.push_back(slice(xs[j]->t, sd, lo, hi));
        }
        outs[k] = *xs[k], outs[k].t = concat(parts, cd);
        if (moves || sd == cd) {
          outs[k].mask[static_cast<std::size_t>(cd)] &= ~axes;
          outs[k].mask[static_cast<std::size_t>(sd)] |= axes;
        } else {
          outs[k].gshape[static_cast<std::size_t>(sd)] /= static_cast<std::int64_t>(n);
          outs[k].gshape[static_cast<std::size_t>(cd)] *= static_cast<std::int64_t>(n);
        }
      }
      break;
    }
    case OpKind::MatMul:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Multiply:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Where:
    case OpKind::Neg:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::SiLU:
    case OpKind::GELU:
    case OpKind::ReLU:
    case OpKind::Dropout:
    case OpKind::LayerNorm:
    case OpKind::RMSNorm:
    case OpKind::Softmax:
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::LogSumExp:
    case OpKind::FlashAttention:
    case OpKind::Embedding:
    case OpKind::CrossEntropyLoss:
    case OpKind::Step:
    case OpKind::TopKGate:
    case OpKind::Expand:
    case OpKind::PointwiseGrad:
    case OpKind::NormGrad:
    case OpKind::AttentionGrad:
    case OpKind::EmbeddingGrad:
    case OpKind::CrossEntropyGrad:
    case OpKind::TopKGrad:
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::Wait:
    case OpKind::WaitAll:
    case OpKind::WaitStream:
    case OpKind::RecordEvent:
    case OpKind::WaitEvent:
    case OpKind::OverlapRegion:
    case OpKind::Cast:
    case OpKind::LossScale:
    case OpKind::FP8Quantize:
    case OpKind::FP8Dequantize:
    case OpKind::AmaxUpdate:
    case OpKind::AmaxHistory:
    case OpKind::FP8Scale:
    case OpKind::Reshape:
    case OpKind::Transpose:
    case OpKind::Reinterpret:
    case OpKind::Convert:
    case OpKind::SPMDGuard:
    case OpKind::ZeROPartitionOptState:
    case OpKind::RingRotate:
    case OpKind::RingAttentionStep:
    case OpKind::RingAttention:
    case OpKind::LoadBalance:
    case OpKind::MoEDispatch:
    case OpKind::MoECombine:
    case OpKind::Slice:
    case OpKind::Split:
    case OpKind::Concat:
    case OpKind::Stack:
    case OpKind::Pad:
    case OpKind::Arange:
    case OpKind::Full:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::RoPE:
    case OpKind::IndexSelect:
    case OpKind::IndexAdd:
    case OpKind::Sigmoid:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::And:
    case OpKind::Or:
    case OpKind::Not:
    case OpKind::CumSum:
    case OpKind::Detach:
    case OpKind::OneHot:
    case OpKind::Bincount:
    case OpKind::ExpertCompute:
    case OpKind::MoEGateGrad:
    case OpKind::GradNormSq:  // returned above
    case OpKind::AdamWUpdate:
    case OpKind::SGDUpdate:
    case OpKind::ClipCoef:
      throw std::logic_error("step_group: not a collective: " + std::string(op_name(op.kind)));
  }
  // After the collective the value is no longer labelled V over its axes (AllToAll of V keeps the label).
  if (global_ && !(op.kind == OpKind::AllToAll && (xs[0]->mask[static_cast<std::size_t>(dim_of(at.dim2, *xs[0]))] & axes) != axes)) vlabel_in_ &= ~axes;
  for (std::size_t k = 0; k < n; ++k) {
    outs[k].taint.clear();
    set_out(member_op(oi, k), members[k], 0, std::move(outs[k]), taint);
  }
}

}  // namespace spmd::interp
