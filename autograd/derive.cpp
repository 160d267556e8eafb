// autograd/derive.cpp - the VJP of every op (one exhaustive switch), emitted as ops of the same IR.
//
// The forward is read as SSA: every declaration and op output is a version; a gradient belongs to a
// version and is accumulated in place (`Add(x.grad, c) -> x.grad`) when several uses contribute.
// Each VJP knows the forward placements (from the spatial checker), so it knows the placement each
// contribution will have; where that differs from the dual placement of the input, it appends the
// conversion that makes it so (e.g. a per-rank contribution to a replicated input is V -> P).
#include "autograd/derive.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace spmd {

Placement dual(Placement p) {
  switch (p.kind) {
    case PKind::R: return Placement::p();
    case PKind::I: return Placement::i();
    case PKind::V: return Placement::v();
    case PKind::S: return p;
    case PKind::P: return p.linear_partial() ? Placement::r() : Placement::v();
  }
  return p;
}

namespace {

bool floating(DType d) { return !(d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::Bool); }

// Same placement for the purpose of a gradient: S(d) is a V with a layout, so it serves where V is due.
bool same_for_grad(Placement have, Placement want) { return have == want || (want.is_v() && have.is_s()); }

struct Step {
  bool all_reduce;  // else Convert
  int axis;
  Placement to;
};

class Deriver {
 public:
  Deriver(const Program& f, const SpatialTypes& ty, bool append_to_ops) : f_(f), ty_(ty) {
    Program& p = d_.program;
    p = f;
    list_ = append_to_ops ? &p.ops : &p.backward;
    // A VJP emits a few ops per forward op (about 3.3 on a transformer): room for them once.
    list_->reserve(list_->size() + 4 * f.ops.size());
    p.operands.reserve(p.operands.size() + 10 * f.ops.size());
    p.names.reserve(p.names.size() + 3 * f.ops.size());
    p.name_ids.reserve(p.names.size() + 3 * f.ops.size());
    d_.forward_op.reserve(4 * f.ops.size());
    p.exprs = ty.exprs;
    p.backward.clear();
    p.has_backward = true;
    p.backward_loc = p.loss_loc;
    p.train = false;
    p.has_expect = false;
    p.expect.clear();
  }

  Derived run() {
    scan();
    if (f_.loss < 0) return std::move(d_);
    std::int64_t lv = cur_[static_cast<std::size_t>(f_.loss)];
    if (lv < 0 || !needs_[static_cast<std::size_t>(lv)]) return std::move(d_);
    grad_[static_cast<std::size_t>(lv)] = P().intern(f_.name(f_.loss) + ".grad");
    claim(grad_[static_cast<std::size_t>(lv)]);
    for (std::size_t i = f_.ops.size(); i-- > 0;) {
      op_ = &f_.ops[i];
      op_idx_ = static_cast<int>(i);
      bool has_dy = false, needs_in = false;
      for (int k = 0; k < op_->n_out; ++k) has_dy |= grad_[out_ver(k)] >= 0;
      for (int k = 0; k < op_->n_in; ++k) needs_in |= needs_[in_ver(k)] != 0;
      if (has_dy && needs_in) vjp();
    }
    return std::move(d_);
  }

 private:
  using Ver = std::size_t;
  Program& P() { return d_.program; }
  const Program& P() const { return d_.program; }

  // ---- versions -------------------------------------------------------------------------------
  void scan() {
    std::size_t nd = f_.tensors.size();
    cur_.assign(f_.names.size(), -1);
    in_ver_.assign(f_.operands.size(), 0);
    std::size_t nv = nd + ty_.outs.size();
    needs_.assign(nv, 0);
    grad_.assign(nv, -1);
    ver_name_.resize(nv);
    for (std::size_t t = 0; t < nd; ++t) {
      cur_[static_cast<std::size_t>(f_.tensors[t].name)] = static_cast<std::int64_t>(t);
      ver_name_[t] = f_.tensors[t].name;
      needs_[t] = floating(ty_.decls[t].dtype);
      claim(f_.tensors[t].name);
    }
    for (std::size_t i = 0; i < f_.ops.size(); ++i) {
      const Op& op = f_.ops[i];
      bool any = false;
      auto ins = f_.ins(op);
      for (std::size_t k = 0; k < ins.size(); ++k) {
        std::int64_t v = cur_[static_cast<std::size_t>(ins[k])];
        if (v < 0) throw std::logic_error("autograd: undefined input in a checked forward");
        in_ver_[op.first + k] = static_cast<std::uint32_t>(v);
        any |= needs_[static_cast<std::size_t>(v)] != 0;
        claim(ins[k]);
      }
      auto outs = f_.outs(op);
      for (std::size_t k = 0; k < outs.size(); ++k) {
        Ver v = nd + ty_.out_base[i] + k;
        cur_[static_cast<std::size_t>(outs[k])] = static_cast<std::int64_t>(v);
        ver_name_[v] = outs[k];
        needs_[v] = any && floating(ty_.outs[v - nd].dtype);
        claim(outs[k]);
      }
    }
  }
  Ver in_ver(int k) const { return in_ver_[op_->first + static_cast<std::size_t>(k)]; }
  Ver out_ver(int k) const { return f_.tensors.size() + ty_.out_base[static_cast<std::size_t>(op_idx_)] + static_cast<std::size_t>(k); }
  const ValueType& type(Ver v) const { return v < f_.tensors.size() ? ty_.decls[v] : ty_.outs[v - f_.tensors.size()]; }
  const ValueType& tin(int k) const { return type(in_ver(k)); }
  const ValueType& tout(int k = 0) const { return type(out_ver(k)); }
  NameId in_name(int k) const { return f_.ins(*op_)[static_cast<std::size_t>(k)]; }
  // A forward value the backward reads: the backward runs after the whole forward, so the value must
  // still be the one this op saw (not overwritten in place later).
  NameId fwd(NameId n, Ver v) const {
    if (cur_[static_cast<std::size_t>(n)] != static_cast<std::int64_t>(v)) {
      std::uint32_t line = 0;
      for (std::size_t j = static_cast<std::size_t>(op_idx_) + 1; j < f_.ops.size() && !line; ++j)
        for (NameId o : f_.outs(f_.ops[j]))
          if (o == n) line = f_.ops[j].loc.line;
      throw LoadError(op_->loc, "the backward of this " + std::string(op_name(op_->kind)) + " reads " + f_.name(n) +
                                    ", which is overwritten in place later in the forward" + (line ? " (line " + std::to_string(line) + ")" : "") +
                                    "; give the later value a new name so the backward can read this one");
    }
    return n;
  }
  NameId fin(int k) const { return fwd(in_name(k), in_ver(k)); }
  NameId fout(int k) const { return fwd(f_.outs(*op_)[static_cast<std::size_t>(k)], out_ver(k)); }
  NameId dy(int k = 0) const { return grad_[out_ver(k)]; }
  int axes() const { return f_.axis_count(); }

  Placements dual_pl(const ValueType& t) const {
    Placements d{};
    for (int a = 0; a < axes(); ++a) d[static_cast<std::size_t>(a)] = dual(t.pl[static_cast<std::size_t>(a)]);
    return d;
  }
  Placements dy_pl(int k = 0) const { return dual_pl(tout(k)); }

  // ---- names and emission ---------------------------------------------------------------------
  // A name no forward value and no earlier derived value has: `base`, else `base.1`, `base.2`, ...
  // Flags and counters are indexed by NameId (no hashing beyond interning the name itself).
  NameId fresh(const std::string& base) {
    NameId id = P().intern(base);
    if (claim(id)) return id;
    if (suffix_.size() <= static_cast<std::size_t>(id)) suffix_.resize(static_cast<std::size_t>(id) + 1, 0);
    for (;;) {
      int n = ++suffix_[static_cast<std::size_t>(id)];
      NameId k = P().intern(base + "." + std::to_string(n));
      if (claim(k)) return k;
    }
  }
  // Marks a name as taken; false if it was already.
  bool claim(NameId id) {
    auto i = static_cast<std::size_t>(id);
    if (used_.size() <= i) used_.resize(std::max(i + 1, used_.size() * 2), 0);
    return !std::exchange(used_[i], 1);
  }
  // A backward op runs where its forward op ran (as PyTorch's autograd runs a backward on its forward's stream).
  Op make(OpKind k) const {
    Op o;
    o.kind = k;
    o.loc = op_->loc;
    o.attrs.stream = op_->attrs.stream;
    return o;
  }
  NameId emit(Op o, std::initializer_list<NameId> ins, NameId out) {
    NameId outs[1] = {out};
    P().add_op(*list_, o, std::span<const NameId>(ins.begin(), ins.size()), std::span<const NameId>(outs, out >= 0 ? 1 : 0));
    d_.forward_op.push_back(op_idx_);
    return out;
  }
  std::uint32_t ints(std::vector<int> v) {
    P().int_lists.push_back(std::move(v));
    return static_cast<std::uint32_t>(P().int_lists.size() - 1);
  }
  std::uint32_t shape(std::span<const ExprId> s) {
    P().shapes.emplace_back(s.begin(), s.end());
    return static_cast<std::uint32_t>(P().shapes.size() - 1);
  }
  NameId tmp(NameId of, const char* tag) { return fresh(P().name(of) + "." + tag); }

  // ---- contributions --------------------------------------------------------------------------
  std::vector<Step> fixups(const Placements& have, const Placements& want) const {
    std::vector<Step> s;
    for (int a = 0; a < axes(); ++a) {
      Placement h = have[static_cast<std::size_t>(a)], w = want[static_cast<std::size_t>(a)];
      if (same_for_grad(h, w)) continue;
      if (w.is_p() && w.op == ReduceOp::Sum && h.varying()) s.push_back({false, a, Placement::p()});
      else if (w.is_v() && h.is_r()) s.push_back({false, a, Placement::v()});
      else if (w.is_s() && h.is_r()) s.push_back({false, a, w});
      else if (w.is_r() && h.is_i()) s.push_back({false, a, Placement::r()});
      else if (w.is_i() && h.varying()) s.push_back({false, a, Placement::p()}), s.push_back({true, a, Placement::i()});
      // anything else cannot be converted without changing the value; the backward's checks report it
    }
    return s;
  }

  // Emits a contribution to v's gradient: `body(dst)` emits ops whose last writes dst; `have` is the
  // placement dst will have. Converts it to the dual placement and accumulates.
  void contribute(Ver v, const Placements& have, const std::function<void(NameId)>& body) {
    if (!needs_[v]) return;
    std::vector<Step> steps = fixups(have, dual_pl(type(v)));
    bool first = grad_[v] < 0;
    NameId base = ver_name_[v];
    if (first) grad_[v] = fresh(f_.name(base) + ".grad");
    NameId target = first ? grad_[v] : fresh(f_.name(base) + ".grad.c");
    NameId cur = steps.empty() ? target : fresh(f_.name(base) + ".grad.c");
    body(cur);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      NameId o = i + 1 == steps.size() ? target : fresh(f_.name(base) + ".grad.c");
      Op op = make(steps[i].all_reduce ? OpKind::AllReduce : OpKind::Convert);
      op.attrs.axes = 1u << steps[i].axis;
      if (steps[i].all_reduce) {
        op.attrs.dst_invariant = true;
      } else {
        op.attrs.to = steps[i].to;
        op.attrs.has_to = true;
      }
      cur = emit(op, {cur}, o);
    }
    if (!first) emit(make(OpKind::Add), {grad_[v], target}, grad_[v]);
  }
  void contribute_in(int k, const Placements& have, const std::function<void(NameId)>& body) { contribute(in_ver(k), have, body); }

  // ---- placement predictions ------------------------------------------------------------------
  // A gradient of rank `rank` summed over `dims`: a shard on a summed dim becomes a pending sum.
  Placements summed(Placements pl, int rank, const std::vector<int>& dims, bool keepdim) const {
    for (int a = 0; a < axes(); ++a) {
      Placement& p = pl[static_cast<std::size_t>(a)];
      if (!p.is_s()) continue;
      bool gone = false;
      int shift = 0;
      for (int d : dims) {
        if (d == p.dim) gone = true;
        if (d < p.dim) ++shift;
      }
      if (gone) p = Placement::p();
      else if (!keepdim) p.dim = static_cast<std::int16_t>(p.dim - shift);
    }
    (void)rank;
    return pl;
  }
  // A gradient multiplied by another operand (rank ro, right-aligned into rank rg).
  Placements times(Placements g, const Placements& other, int rg, int ro) const {
    for (int a = 0; a < axes(); ++a) {
      Placement& x = g[static_cast<std::size_t>(a)];
      Placement y = other[static_cast<std::size_t>(a)];
      if (y.is_s()) y.dim = static_cast<std::int16_t>(y.dim + (rg - ro));
      if (x.is_p() || y.is_p()) x = Placement::p();
      else if (x == y || y.is_r()) continue;
      else if (x.is_r()) x = y;
      else x = Placement::v();
    }
    return g;
  }
  Placements want_in(int k) const { return dual_pl(tin(k)); }
  // The contribution's placement when the VJP preserves duality (the rule is exact except that a
  // per-rank output makes every contribution per-rank).
  Placements exact(int k) const {
    Placements w = want_in(k);
    for (int a = 0; a < axes(); ++a)
      if (tout().pl[static_cast<std::size_t>(a)].is_v() && !tin(k).pl[static_cast<std::size_t>(a)].is_v()) w[static_cast<std::size_t>(a)] = Placement::v();
    return w;
  }

  // ---- shared emitters --------------------------------------------------------------------------
  // Sums g (rank rg, placements pl) down to `target` (broadcasting reversed). Writes dst last.
  void sum_to(NameId g, int rg, std::span<const ExprId> target, DType dt, NameId dst, Placements* pl) {
    int rt = static_cast<int>(target.size());
    std::vector<int> lead, ones;
    for (int d = 0; d < rg - rt; ++d) lead.push_back(d);
    const ValueType& gt = tout();
    for (int d = 0; d < rt; ++d) {
      ExprId e = target[static_cast<std::size_t>(d)];
      int gd = d + rg - rt;
      bool one = P().exprs.is_const(e) && P().exprs.value(e) == 1;
      bool g_one = gd < gt.rank && P().exprs.is_const(gt.shape[static_cast<std::size_t>(gd)]) && P().exprs.value(gt.shape[static_cast<std::size_t>(gd)]) == 1;
      if (one && !g_one) ones.push_back(d);
    }
    if (lead.empty() && ones.empty()) {
      Op c = make(OpKind::Cast);
      c.attrs.dtype = dt;
      c.attrs.has_dtype = true;
      emit(c, {g}, dst);
      return;
    }
    NameId cur = g;
    if (!lead.empty()) {
      Op s = make(OpKind::Sum);
      s.attrs.dims = ints(lead);
      *pl = summed(*pl, rg, lead, false);
      cur = emit(s, {cur}, ones.empty() ? dst : tmp(dst, "s"));
    }
    if (!ones.empty()) {
      Op s = make(OpKind::Sum);
      s.attrs.dims = ints(ones);
      s.attrs.keepdim = true;
      *pl = summed(*pl, rt, ones, true);
      emit(s, {cur}, dst);
    }
  }

  void cast_to(NameId g, DType dt, NameId dst) {
    Op c = make(OpKind::Cast);
    c.attrs.dtype = dt;
    c.attrs.has_dtype = true;
    emit(c, {g}, dst);
  }

  [[noreturn]] void no_vjp(const std::string& why) const {
    throw LoadError(op_->loc, std::string(op_name(op_->kind)) + " has no VJP: " + why + "; the backward of this program cannot be derived");
  }

  // ---- the VJPs -------------------------------------------------------------------------------
  void vjp() {
    switch (op_->kind) {
      case OpKind::MatMul: return matmul();
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Multiply: return elementwise();
      case OpKind::SiLU:
      case OpKind::GELU:
      case OpKind::ReLU:
      case OpKind::Dropout:
      case OpKind::Exp:
      case OpKind::Log:
      case OpKind::Sqrt:
      case OpKind::Rsqrt: return pointwise();
      case OpKind::Neg: return neg();
      case OpKind::Div:
        if (op_->n_in == 1) return div_scalar();
        no_vjp("the VJP of a tensor divisor is not derived yet (issue 10); write the backward by hand in `backward:`");
      case OpKind::Maximum:
      case OpKind::Minimum:
      case OpKind::Where:
      case OpKind::ReduceMax:
      case OpKind::ReduceMin:
      case OpKind::LogSumExp: no_vjp("its VJP is not derived yet (issue 10); write the backward by hand in `backward:`");
      case OpKind::LayerNorm:
      case OpKind::RMSNorm: return norm();
      case OpKind::Softmax: return softmax();
      case OpKind::Sum:
      case OpKind::Mean: return reduction();
      case OpKind::FlashAttention: return attention();
      case OpKind::Embedding: return embedding();
      case OpKind::CrossEntropyLoss: return cross_entropy();
      case OpKind::TopKGate: return topk();
      case OpKind::AllReduce: return all_reduce();
      case OpKind::AllGather: return all_gather();
      case OpKind::ReduceScatter: return reduce_scatter();
      case OpKind::Broadcast: return broadcast();
      case OpKind::Reduce: return reduce();
      case OpKind::AllToAll: return all_to_all();
      case OpKind::Scatter: return scatter();
      case OpKind::Gather: return gather();
      case OpKind::Send: return;  // no output, so never reached with a gradient (see recv below)
      case OpKind::Recv: return;  // no input: a leaf; its gradient goes back to the peer with the schedule
      case OpKind::Wait:
      case OpKind::WaitAll:
      case OpKind::WaitStream:
      case OpKind::RecordEvent:
      case OpKind::WaitEvent: return;  // no values
      case OpKind::Cast:
      case OpKind::FP8Quantize:  // straight-through
      case OpKind::FP8Dequantize: return identity();
      case OpKind::LossScale: return loss_scale();
      case OpKind::AmaxUpdate: return;  // a scaling statistic: no gradient flows through it
      case OpKind::Reshape: return reshape();
      case OpKind::Transpose: return transpose();
      case OpKind::Reinterpret:
      case OpKind::Convert: return conversion();
      case OpKind::SPMDGuard: return guard();
      case OpKind::Expand: return expand();
      case OpKind::PointwiseGrad:
      case OpKind::NormGrad:
      case OpKind::AttentionGrad:
      case OpKind::EmbeddingGrad:
      case OpKind::CrossEntropyGrad:
      case OpKind::TopKGrad: no_vjp("it is itself a gradient op, and second derivatives are not supported");
      case OpKind::Step: no_vjp("it is an opaque pipeline-schedule step with no known derivative");
      case OpKind::OverlapRegion: no_vjp("it is an opaque block of compute; write its backward by hand in `backward:`");
      case OpKind::ZeROGatherParam:
      case OpKind::ZeROScatterGrad:
      case OpKind::ZeROPartitionOptState:
      case OpKind::RingRotate:
      case OpKind::RingAttentionStep:
      case OpKind::RingAttention:
      case OpKind::MoEDispatch:
      case OpKind::MoECombine:
      case OpKind::ExpertCompute:
        // The loader rejects these ("not supported yet"); reaching here is a bug, never a pass.
        throw std::logic_error("autograd reached unsupported op " + std::string(op_name(op_->kind)));
    }
  }

  void identity() {
    contribute_in(0, exact(0), [&](NameId dst) { cast_to(dy(), tin(0).dtype, dst); });
  }

  void matmul() {
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

  void elementwise() {
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
  void neg() {
    Placements g = dy_pl();
    for (auto& q : g)
      if (q.is_p() && (q.op == ReduceOp::Max || q.op == ReduceOp::Min)) q.op = q.op == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max;
    contribute_in(0, g, [&](NameId dst) { emit(make(OpKind::Neg), {dy()}, dst); });
  }

  // x / c: the gradient is dy / c (a negative c swaps a pending max and min)
  void div_scalar() {
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

  void pointwise() {
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

  std::uint8_t norm_choice(OpKind k) const {
    const auto& choices = op_info(OpKind::NormGrad).find_attr("of")->choices;
    for (std::size_t c = 0; c < choices.size(); ++c)
      if (choices[c] == op_name(k)) return static_cast<std::uint8_t>(c);
    return 0;
  }

  std::vector<int> norm_dims(int rank) const {
    std::vector<int> dims;
    if (op_->attrs.dims == kNoIndex) return {rank - 1};
    for (int d : f_.int_lists[op_->attrs.dims]) dims.push_back(d < 0 ? d + rank : d);
    return dims;
  }

  void norm() {
    int r = tin(0).rank;
    std::vector<int> nd = norm_dims(r), lead;
    for (int d = 0; d < r; ++d)
      if (std::find(nd.begin(), nd.end(), d) == nd.end()) lead.push_back(d);
    Placements g = dy_pl();
    contribute_in(0, g, [&](NameId dst) {
      Op o = make(OpKind::NormGrad);
      o.attrs.choice = norm_choice(op_->kind);
      o.attrs.dims = op_->attrs.dims;
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

  void softmax() {
    contribute_in(0, dy_pl(), [&](NameId dst) {
      Op o = make(OpKind::NormGrad);
      o.attrs.choice = norm_choice(OpKind::Softmax);
      o.attrs.dims = ints({op_->attrs.dim == kUnset ? -1 : op_->attrs.dim});
      emit(o, {dy(), fout(0)}, dst);
    });
  }

  void reduction() {
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
      if (P().exprs.is_const(e)) n *= P().exprs.value(e);
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

  void attention() {
    for (int k = 0; k < 3; ++k)
      contribute_in(k, exact(k), [&, k](NameId dst) {
        Op o = make(OpKind::AttentionGrad);
        o.attrs.choice = static_cast<std::uint8_t>(k);
        o.attrs.causal = op_->attrs.causal;
        o.attrs.layout = op_->attrs.layout;
        emit(o, {dy(), fin(0), fin(1), fin(2)}, dst);
      });
  }

  void embedding() {
    contribute_in(1, exact(1), [&](NameId dst) { emit(make(OpKind::EmbeddingGrad), {dy(), fin(0), fin(1)}, dst); });
  }

  void cross_entropy() {
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

  void topk() {
    if (dy(0) < 0) return;  // only the routing weights carry a gradient
    contribute_in(0, dy_pl(0), [&](NameId dst) { emit(make(OpKind::TopKGrad), {dy(0), fin(0), fout(1)}, dst); });
  }

  void loss_scale() {
    contribute_in(0, exact(0), [&](NameId dst) {
      Op o = make(OpKind::LossScale);
      o.attrs.number = op_->attrs.number;
      o.attrs.has_number = true;
      emit(o, {dy()}, dst);
    });
  }

  void reshape() {
    contribute_in(0, exact(0), [&](NameId dst) {
      Op o = make(OpKind::Reshape);
      o.attrs.shape = shape(tin(0).dims());
      emit(o, {dy()}, dst);
    });
  }

  void transpose() {
    contribute_in(0, exact(0), [&](NameId dst) {
      Op o = make(OpKind::Transpose);
      o.attrs.dims = op_->attrs.dims;
      emit(o, {dy()}, dst);
    });
  }

  void expand() {
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

  void guard() {
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

  std::vector<int> coll_axes() const {
    std::vector<int> v;
    for (int a = 0; a < axes(); ++a)
      if (op_->attrs.axes & (1u << a)) v.push_back(a);
    return v;
  }
  std::int64_t axes_size(std::uint32_t mask, bool& concrete) const {
    std::int64_t n = 1;
    concrete = true;
    for (int a = 0; a < axes(); ++a)
      if (mask & (1u << a)) {
        ExprId e = f_.mesh[static_cast<std::size_t>(a)].size;
        if (P().exprs.is_const(e)) n *= P().exprs.value(e);
        else concrete = false;
      }
    return n;
  }
  Op coll(OpKind k) const {
    Op o = make(k);
    o.attrs.axes = op_->attrs.axes;
    return o;
  }

  // AllReduce: P -> R is self-dual; P -> I (Megatron's g) has the identity backward, typed I -> R.
  void all_reduce() {
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

  void all_gather() {
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
  static int norm_dim(int d, int rank) { return d < 0 ? d + rank : d; }

  void reduce_scatter() {
    Placements have = want_in(0);
    for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::r();
    contribute_in(0, have, [&](NameId dst) {
      Op ag = coll(OpKind::AllGather);
      ag.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
      emit(ag, {dy()}, dst);
    });
  }

  void all_to_all() {
    contribute_in(0, exact(0), [&](NameId dst) {
      Op t = coll(OpKind::AllToAll);
      t.attrs.dim = op_->attrs.dim2;
      t.attrs.dim2 = op_->attrs.dim;
      emit(t, {dy()}, dst);
    });
  }

  void broadcast() {
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

  void reduce() {
    Placements have = want_in(0);
    for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::r();
    contribute_in(0, have, [&](NameId dst) {
      Op b = coll(OpKind::Broadcast);
      b.attrs.rank = op_->attrs.rank;
      emit(b, {dy()}, dst);
    });
  }

  void scatter() {
    Placements have = want_in(0);
    for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::v();
    contribute_in(0, have, [&](NameId dst) {
      Op g = coll(OpKind::Gather);
      g.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
      g.attrs.rank = op_->attrs.rank;
      emit(g, {dy()}, dst);
    });
  }

  void gather() {
    contribute_in(0, exact(0), [&](NameId dst) {
      Op s = coll(OpKind::Scatter);
      s.attrs.dim = static_cast<std::int16_t>(norm_dim(op_->attrs.dim, tin(0).rank));
      s.attrs.rank = op_->attrs.rank;
      emit(s, {dy()}, dst);
    });
  }

  // Convert and Reinterpret, per axis: I->R's dual is AllReduce(dst: I) (Megatron's f); R->S(d)'s is
  // S(d)->P; S(d)->P's is R->S(d); V->P's is R->V; R->V's is V->P; Reinterpret R->P is self-dual.
  void conversion() {
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

  const Program& f_;
  const SpatialTypes& ty_;
  Derived d_;
  std::vector<Op>* list_ = nullptr;  // where the backward goes: Program::backward, or after the forward in Program::ops
  std::vector<std::int64_t> cur_;
  std::vector<std::uint32_t> in_ver_;
  std::vector<char> needs_;
  std::vector<NameId> grad_;
  std::vector<NameId> ver_name_;
  std::vector<char> used_;   // per NameId: taken (a forward name or a derived one)
  std::vector<int> suffix_;  // per NameId of a base: the last numeric suffix tried
  const Op* op_ = nullptr;
  int op_idx_ = -1;
};

}  // namespace

Derived derive_backward(const Program& forward, const SpatialTypes& types, bool append_to_ops) {
  return Deriver(forward, types, append_to_ops).run();
}

}  // namespace spmd
