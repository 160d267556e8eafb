// autograd/deriver.h - the backward deriver's state and helpers, shared by derive.cpp (the driver and the
// exhaustive VJP switch) and the vjp_*.cpp files (the VJPs, one file per op family). Internal to autograd/.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "autograd/derive.h"
#include "ir/memory.h"

namespace spmd::autograd_detail {

inline bool floating(DType d) { return !(d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::Bool); }

// Same placement for the purpose of a gradient: S(d) is a V with a layout, so it serves where V is due.
inline bool same_for_grad(Placement have, Placement want) { return have == want || (want.is_v() && have.is_s()); }

struct Step {
  bool all_reduce;  // else Convert
  int axis;
  Placement to;
};

class Deriver {
 public:
  // A copy of the forward with the backward in `backward` (or appended to its ops).
  Deriver(const Program& f, const SpatialTypes& ty, bool append_to_ops) : f_(f), ty_(ty), n_ops_(f.ops.size()), out_(&d_.program) {
    d_.program = f;
    setup(append_to_ops);
  }
  // In place: the backward is appended to the forward's own ops (the forward is read as the prefix it stays).
  Deriver(Program& forward, const SpatialTypes& ty) : f_(forward), ty_(ty), n_ops_(forward.ops.size()), out_(&forward) { setup(true); }

  void setup(bool append_to_ops) {
    Program& p = P();
    list_ = append_to_ops ? &p.ops : &p.backward;
    // A VJP emits a few ops per forward op (about 3.9 on a transformer): room for them once.
    // (on huge pages, ir/memory.h: first-touch page faults were a large part of a 10^6-op derivation)
    std::size_t n = n_ops_;
    reserve_huge(*list_, list_->size() + 4 * n);
    reserve_huge(p.operands, p.operands.size() + 10 * n);
    reserve_huge(p.names, p.names.size() + 3 * n);
    p.name_ids.reserve(p.names.size() + 3 * n);
    reserve_huge(d_.forward_op, 4 * n);
    p.exprs = ty_.exprs;
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
    for (std::size_t i = n_ops_; i-- > 0;) {
      op_copy_ = f_.ops[i];  // a copy: in place, the ops the VJPs append may move the forward's
      op_ = &op_copy_;
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
  Program& P() { return *out_; }
  const Program& P() const { return *out_; }

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
    for (std::size_t i = 0; i < n_ops_; ++i) {
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
        needs_[v] = any && floating(ty_.outs[v - nd].dtype) && op.kind != OpKind::Detach;  // no gradient flows back through Detach
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
      for (std::size_t j = static_cast<std::size_t>(op_idx_) + 1; j < n_ops_ && !line; ++j)
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
  // The text is built in one reused buffer (no string made and freed per temporary).
  NameId fresh(std::string_view base) { return fresh(base, {}); }
  NameId fresh(std::string_view base, std::string_view tag) {
    buf_.assign(base);  // copied before interning, which may move the name `base` points into
    buf_ += tag;
    NameId id = P().intern(buf_);
    if (claim(id)) return id;
    if (suffix_.size() <= static_cast<std::size_t>(id)) suffix_.resize(static_cast<std::size_t>(id) + 1, 0);
    std::size_t len = buf_.size();
    for (;;) {
      int n = ++suffix_[static_cast<std::size_t>(id)];
      char digits[16];
      auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
      buf_.resize(len);
      buf_ += '.';
      buf_.append(digits, end);
      NameId k = P().intern(buf_);
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
  // A shard the backward creates of a value that is uneven in the forward keeps its torch.chunk layout
  // (`uneven: true`, docs/semantics.md section 1): the gradient of an uneven shard is as uneven as the shard.
  Op make(OpKind k) const {
    Op o;
    o.kind = k;
    o.loc = op_->loc;
    o.attrs.stream = op_->attrs.stream;
    bool uneven = false;
    for (int i = 0; i < op_->n_in && !uneven; ++i) uneven = tin(i).uneven;
    for (int i = 0; i < op_->n_out && !uneven; ++i) uneven = tout(i).uneven;
    o.attrs.uneven = uneven;
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
  NameId tmp(NameId of, const char* tag) {
    tag_.assign(".");
    tag_ += tag;
    return fresh(P().name(of), tag_);
  }

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
    if (first) grad_[v] = fresh(f_.name(base), ".grad");
    NameId target = first ? grad_[v] : fresh(f_.name(base), ".grad.c");
    NameId cur = steps.empty() ? target : fresh(f_.name(base), ".grad.c");
    body(cur);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      NameId o = i + 1 == steps.size() ? target : fresh(f_.name(base), ".grad.c");
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


  // ---- the VJPs (derive.cpp: the switch; vjp_compute.cpp, vjp_comm.cpp: the bodies) -------------
  void vjp();
  void identity();
  void fp8();  // vjp_fp8.cpp
  void matmul();
  void elementwise();
  void neg();
  void div_scalar();
  void pointwise();
  void norm();
  void softmax();
  void reduction();
  void attention();
  void embedding();
  void cross_entropy();
  void topk();
  void loss_scale();
  void reshape();
  void transpose();
  void expand();
  void guard();
  void all_reduce();
  void all_gather();
  void reduce_scatter();
  void all_to_all();
  void broadcast();
  void reduce();
  void scatter();
  void gather();
  // ZeRO / FSDP (vjp_zero.cpp)
  void zero_gather();
  void zero_scatter();
  void conversion();
  void moe_dispatch();  // vjp_moe.cpp
  void moe_combine();
  // vjp_math.cpp
  void broadcast_dims(int k, std::vector<int>& lead, std::vector<int>& ones) const;
  void where_vjp();
  void div_tensor_vjp();
  // vjp_tensor.cpp
  NameId pad_back(NameId g, int d, ExprId before, ExprId n, ExprId len, NameId dst);
  NameId slice_of(NameId g, int d, ExprId start, ExprId end, NameId dst);
  void slice_vjp();
  void pad_vjp();
  void split_vjp();
  void concat_vjp(bool stack);
  void rope_vjp();
  void index_add_vjp();
  void cumsum_vjp();
  void load_balance();  // vjp_cp.cpp
  void ring_rotate();
  void ring_attention();

  // ---- helpers of the VJPs ---------------------------------------------------------------------
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
  static int norm_dim(int d, int rank) { return d < 0 ? d + rank : d; }

  // The forward: in place, the same program as P(), whose ops, operands and names grow past the forward's
  // (n_ops_ is the forward's op count; names and operands are read by index, never held across an emit).
  const Program& f_;
  const SpatialTypes& ty_;
  std::size_t n_ops_;
  Derived d_;
  Program* out_;  // where the derived ops go: d_.program (a copy of the forward) or the forward itself
  Op op_copy_;
  std::vector<Op>* list_ = nullptr;  // where the backward goes: Program::backward, or after the forward in Program::ops
  std::vector<std::int64_t> cur_;
  std::vector<std::uint32_t> in_ver_;
  std::vector<char> needs_;
  std::vector<NameId> grad_;
  std::vector<NameId> ver_name_;
  std::vector<char> used_;   // per NameId: taken (a forward name or a derived one)
  std::vector<int> suffix_;  // per NameId of a base: the last numeric suffix tried
  std::string buf_, tag_;    // fresh's and tmp's name buffers
  const Op* op_ = nullptr;
  int op_idx_ = -1;
};

}  // namespace spmd::autograd_detail
