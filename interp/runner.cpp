// interp/runner.cpp - the numeric oracle: the Runner's machinery.
//
// Holds the layout of values on the mesh, declared inputs, the op loop (a scheduler over per-rank op
// lists) and step_local(), the one dispatch of per-rank ops.
#include "interp/runner.h"
#include <fmt/format.h>

#include <map>
#include <tuple>

namespace spmd::interp {

Runner::Runner(const Program& p, const std::vector<std::int64_t>& vars, std::vector<std::int64_t> axis_sizes, bool global, const OracleOptions& o,
       std::int64_t& work, std::vector<std::int64_t> real_sizes)
    : p_(p), vars_(vars), sizes_(std::move(axis_sizes)), real_sizes_(std::move(real_sizes)), global_(global), opt_(o), work_(work) {
  if (real_sizes_.empty()) real_sizes_ = sizes_;
  value_sizes_ = sizes_;
  tune_heap();
  set_alloc_limits({o.max_elements, o.max_bytes});
  ranks_ = 1;
  for (auto s : sizes_) ranks_ *= s;
  names_ = p.names.size();
  if (static_cast<double>(ranks_) * static_cast<double>(names_) > static_cast<double>(std::int64_t{1} << 28))  // (1 GiB of slots)
    throw BudgetError("the run is too large for the interpreter: " + std::to_string(ranks_) + " ranks of " + std::to_string(names_) + " names each");
  slot_.assign(static_cast<std::size_t>(ranks_) * names_, -1);
  env_.assign(static_cast<std::size_t>(ranks_), {});
  nonneg_ = nonnegative_inputs(p);
  coords_.resize(static_cast<std::size_t>(ranks_));
  for (std::int64_t r = 0; r < ranks_; ++r) {
    auto& c = coords_[static_cast<std::size_t>(r)];
    c.resize(sizes_.size());
    for (std::int64_t q = r, a = static_cast<std::int64_t>(sizes_.size()) - 1; a >= 0; --a) {
      c[static_cast<std::size_t>(a)] = q % sizes_[static_cast<std::size_t>(a)];
      q /= sizes_[static_cast<std::size_t>(a)];
    }
  }
  // AttentionGrad groups: the ops of one attention's gradient (the same inputs and attributes, each its wrt).
  std::map<std::tuple<std::vector<NameId>, bool, int, std::uint32_t, int, double, bool>, int> groups;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (op.kind != OpKind::AttentionGrad) continue;
    if (attn_group_.empty()) attn_group_.assign(p.ops.size(), -1);
    auto ins = p.ins(op);
    auto key = std::make_tuple(std::vector<NameId>(ins.begin(), ins.end()), op.attrs.causal, static_cast<int>(op.attrs.layout), op.attrs.axes,
                               static_cast<int>(op.attrs.order), op.attrs.number, op.attrs.has_number);
    auto [it, fresh] = groups.emplace(std::move(key), static_cast<int>(attn_wrts_.size()));
    if (fresh) attn_wrts_.push_back(0);
    attn_group_[i] = it->second;
    attn_wrts_[static_cast<std::size_t>(it->second)] |= static_cast<std::uint8_t>(1u << (op.attrs.choice < 3 ? op.attrs.choice : 0));
  }
  // Each rank's program: the first whose selector its coordinates match (the loader made that exactly one).
  range_.assign(static_cast<std::size_t>(ranks_), {0, static_cast<std::uint32_t>(p.ops.size())});
  if (p.per_rank && !p.programs.empty())
    for (std::int64_t r = 0; r < ranks_; ++r) {
      const auto& c = coords(r);
      range_[static_cast<std::size_t>(r)] = {0, 0};
      for (const auto& rp : p.programs)
        if (std::all_of(rp.selector.begin(), rp.selector.end(), [&](const auto& s) { return static_cast<std::size_t>(s.first) < c.size() && c[static_cast<std::size_t>(s.first)] == s.second; })) {
          range_[static_cast<std::size_t>(r)] = {rp.first_op, rp.first_op + rp.n_ops};
          break;
        }
    }
}

std::int64_t Runner::rank_of(const std::vector<std::int64_t>& c) const {
  std::int64_t r = 0;
  for (std::size_t a = 0; a < sizes_.size(); ++a) r = r * sizes_[a] + c[a];
  return r;
}

// Number of parts and this rank's part index for a set of axes (flattened in mesh order).
// With `ord` (a packed shard order, runner.h) the axes it lists come first, major first, then the rest in mesh order.
void Runner::part(std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& n, std::int64_t& idx, std::uint32_t ord) const {
  n = 1, idx = 0;
  std::uint32_t done = 0;
  for (; ord; ord >>= 4) {
    auto a = static_cast<std::size_t>((ord & 15u) - 1);
    if (a < sizes_.size() && (axes & (1u << a))) n *= sizes_[a], idx = idx * sizes_[a] + c[a], done |= 1u << a;
  }
  for (std::size_t a = 0; a < sizes_.size(); ++a)
    if ((axes & (1u << a)) && !(done & (1u << a))) n *= sizes_[a], idx = idx * sizes_[a] + c[a];
}

// The axes cut the dim one after another in the order part() walks them, each cutting the block the previous ones
// left as torch.chunk does: DTensor's nested Shard placements (6 over dp 2 x tp 4: 3, 3, then 1, 1, 1, 0 each).
// An even cut gives part()'s flat block.
void Runner::block(std::int64_t gsize, std::uint32_t axes, const std::vector<std::int64_t>& c, std::int64_t& lo, std::int64_t& hi, std::uint32_t ord) const {
  int order[kMaxAxes], k = 0;
  std::uint32_t done = 0;
  for (; ord; ord >>= 4) {
    auto a = static_cast<std::size_t>((ord & 15u) - 1);
    if (a < sizes_.size() && (axes & (1u << a)) && !(done & (1u << a))) order[k++] = static_cast<int>(a), done |= 1u << a;
  }
  for (std::size_t a = 0; a < sizes_.size(); ++a)
    if ((axes & (1u << a)) && !(done & (1u << a))) order[k++] = static_cast<int>(a);
  nested_chunk(gsize, order, k, sizes_.data(), c.data(), lo, hi);
}

Shape Runner::local_shape(const Val& v, const std::vector<std::int64_t>& c) const {
  Shape s(v.gshape.size());
  for (std::size_t d = 0; d < s.size(); ++d) {
    std::int64_t lo, hi;
    block(v.gshape[d], v.mask[d], c, lo, hi, ord_of(v, d));
    s[d] = hi - lo;
  }
  return s;
}

void Runner::declare(const TensorDecl& t, std::int64_t range, std::uint64_t seed) {
  try {
    declare_values(t, range, seed);
  } catch (BudgetError& e) {
    if (!e.loc.line) e.loc = t.loc;
    throw;
  }
}

void Runner::declare_values(const TensorDecl& t, std::int64_t range, std::uint64_t seed) {
  Shape g;
  for (ExprId e : t.shape) g.push_back(eval(e, "a dim of " + p_.name(t.name)));
  check_size(g);
  std::uint64_t key = mix(seed ^ std::hash<std::string>{}(p_.name(t.name)));
  std::map<std::tuple<std::uint64_t, Shape, Shape>, Tensor> drawn;  // (P / V key, block origin, block shape) -> elements
  for (std::int64_t r = 0; r < ranks_; ++r) {
    auto c = coords(r);
    Val v;
    v.defined = true;
    v.gshape = g;
    v.mask.assign(g.size(), 0);
    std::uint64_t pv = key;
    for (std::size_t a = 0; a < sizes_.size(); ++a) {
      Placement pl = t.placement[a];
      if (pl.is_s() && pl.dim >= 0 && pl.dim < static_cast<int>(g.size())) v.mask[static_cast<std::size_t>(pl.dim)] |= 1u << a;
      if (pl.is_p() || pl.is_v()) pv = mix(pv ^ (static_cast<std::uint64_t>(a) << 40) ^ static_cast<std::uint64_t>(c[a] + 1));
    }
    if (!global_ && has_strided(t.placement.data(), static_cast<int>(p_.mesh.size()))) {
      v.ord.assign(g.size(), 0);
      for (std::size_t d = 0; d < g.size(); ++d) v.ord[d] = pack_order(t.placement, static_cast<int>(p_.mesh.size()), static_cast<int>(d));
    }
    if (global_) {
      for (std::size_t a = 0; a < t.placement.size() && a < p_.mesh.size(); ++a)
        if (t.placement[a].is_v()) v.taint = p_.name(t.name) + " is declared V over " + p_.mesh[a].name, v.vlabel |= 1u << a;
    }
    Shape ls = local_shape(v, c);
    failed_rank = r;
    Shape lo(g.size());
    for (std::size_t d = 0; d < g.size(); ++d) {
      std::int64_t h;
      block(g[d], v.mask[d], c, lo[d], h, ord_of(v, d));
    }
    // Replicas (the ranks of an R / I axis, every stage of a pipeline for a parameter it does not hold) draw the same
    // elements: they share one buffer (copied on a write, NumBuffer), so a value is held once per distinct block.
    auto [seen, fresh] = drawn.try_emplace(std::make_tuple(pv, lo, ls));
    if (!fresh) {
      v.t = seen->second;
      if (p_.local_view) make_local(v);
      at(r, t.name) = std::move(v);
      continue;
    }
    v.t = Tensor::uninit(ls);
    Shape gst = strides_of(g);
    Shape idx(ls.size(), 0);
    for (std::size_t w = 0; w < v.t.data.size(); ++w) {
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < ls.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
      std::uint64_t h = mix(pv ^ static_cast<std::uint64_t>(flat));
      if (t.dtype == DType::Bool) range = 2;
      // the field lanes (when on) are drawn from the same hash: every run gives a global element one value
      v.t.data[w] = is_int(t.dtype) ? Num::input(static_cast<double>(h % static_cast<std::uint64_t>(std::max<std::int64_t>(1, range))), h, true)
                                    : Num::input(nonneg_[static_cast<std::size_t>(t.name)] ? unit(h) * 2.0 : unit(h) * 4.0 - 2.0, h,
                                                 false);  // [-2, 2): integer casts are not all 0; [0, 2) for a second moment
      for (int d = static_cast<int>(ls.size()) - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < ls[static_cast<std::size_t>(d)]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
    seen->second = v.t;
    if (p_.local_view) make_local(v);
    at(r, t.name) = std::move(v);
  }
}

void Runner::make_local(Val& v) {
  v.gshape = v.t.shape;
  v.mask.assign(v.t.shape.size(), 0);
  v.ord.clear();
}

void Runner::free_dead(std::vector<char> keep) {
  keep_ = std::move(keep);
  keep_.resize(p_.names.size(), 0);
  last_read_.assign(p_.names.size(), -1);
  for (std::size_t oi = 0; oi < p_.ops.size(); ++oi)
    for (NameId n : p_.ins(p_.ops[oi])) last_read_[static_cast<std::size_t>(n)] = static_cast<int>(oi);
}

void Runner::release_dead(int oi, std::int64_t r) {
  if (last_read_.empty()) return;
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto drop = [&](NameId n) {
    auto nu = static_cast<std::size_t>(n);
    if (!keep_[nu] && last_read_[nu] <= oi) at(r, n).t = Tensor();  // the layout stays: only the elements go
  };
  for (NameId n : p_.ins(op)) drop(n);
  for (NameId n : p_.outs(op)) drop(n);  // written and never read again
}

void Runner::run(std::uint64_t seed) {
  try {
    run_ops(seed);
  } catch (BudgetError& e) {
    if (!e.loc.line && failed_op >= 0) e.loc = p_.ops[static_cast<std::size_t>(failed_op)].loc;
    throw;
  }
}

void Runner::run_ops(std::uint64_t seed) {
  seed_ = seed;
  if (global_ && p_.per_rank) throw InterpError("per-rank programs have no single-device run");
  std::vector<std::uint32_t> pc(static_cast<std::size_t>(ranks_));
  for (std::int64_t r = 0; r < ranks_; ++r) pc[static_cast<std::size_t>(r)] = range_[static_cast<std::size_t>(r)].first;
  auto end = [&](std::int64_t r) { return range_[static_cast<std::size_t>(r)].second; };
  auto group_op = [&](const Op& op) {
    return op_info(op.kind).category == OpCategory::collective || op.kind == OpKind::MoEGateGrad ||
           ((op.kind == OpKind::CrossEntropyLoss || op.kind == OpKind::CrossEntropyGrad) && op.attrs.vocab_parallel);
  };
  std::vector<int> mops;
  for (;;) {
    bool progress = false, done = true;
    for (std::int64_t r = 0; r < ranks_; ++r) {
      auto& i = pc[static_cast<std::size_t>(r)];
      while (i < end(r)) {
        const Op& op = p_.ops[i];
        if (group_op(op)) break;
        if (op.kind == OpKind::Recv && !global_ && queue(op, r, true).empty()) break;
        step_local(static_cast<int>(i), r);
        if (after_op) after_op(static_cast<int>(i), r);
        release_dead(static_cast<int>(i), r);
        ++i;
        progress = true;
      }
      if (i < end(r)) done = false;
    }
    if (done) return;
    for (std::int64_t r = 0; r < ranks_; ++r) {
      auto i = pc[static_cast<std::size_t>(r)];
      if (i >= end(r) || !group_op(p_.ops[i])) continue;
      int oi = static_cast<int>(i);
      const Op& op = p_.ops[i];
      auto members = group(op, r);
      // Ready when every member is at a collective of this group (the next one of the group's sequence).
      bool ready = true, same = true;
      mops.clear();
      for (auto m : members) {
        auto j = pc[static_cast<std::size_t>(m)];
        if (j >= end(m) || !group_op(p_.ops[j])) {
          ready = false;
          break;
        }
        if (j != i && group(p_.ops[j], m) != members) {
          ready = false;
          break;
        }
        mops.push_back(static_cast<int>(j));
        same &= j == i;
      }
      if (!ready) continue;
      if (!same) {
        failed_op = oi;
        failed_rank = r;
        for (std::size_t k = 0; k < members.size(); ++k) {
          const Op& o = p_.ops[static_cast<std::size_t>(mops[k])];
          if (o.kind != op.kind || o.attrs.axes != op.attrs.axes || o.attrs.rop != op.attrs.rop)
            throw InterpError(std::string("the ranks of one group run different collectives at one position: ") + std::string(op_name(op.kind)) + " (line " +
                              std::to_string(op.loc.line) + ") on rank " + coord_text(p_, coords(members[0])) + ", " + std::string(op_name(o.kind)) +
                              " (line " + std::to_string(o.loc.line) + ") on rank " + coord_text(p_, coords(members[k])));
          // Kernels other than the plain collectives read and write their operands by name on every member.
          if (op_info(op.kind).category != OpCategory::collective || op.kind == OpKind::MoEDispatch || op.kind == OpKind::MoECombine ||
              op.kind == OpKind::RingRotate || op.kind == OpKind::RingAttention) {
            auto a = p_.ins(op), b = p_.ins(o), ao = p_.outs(op), bo = p_.outs(o);
            if (!std::equal(a.begin(), a.end(), b.begin(), b.end()) || !std::equal(ao.begin(), ao.end(), bo.begin(), bo.end()))
              throw InterpError(std::string(op_name(op.kind)) + " across per-rank programs that name its operands differently is not interpreted");
          }
        }
      }
      bool plain = op_info(op.kind).category == OpCategory::collective && op.kind != OpKind::MoEDispatch && op.kind != OpKind::MoECombine &&
                   op.kind != OpKind::RingRotate && op.kind != OpKind::RingAttention;
      member_ops_ = !same && plain ? &mops : nullptr;
      step_group(oi, members);
      member_ops_ = nullptr;
      for (std::size_t k = 0; k < members.size(); ++k) {
        if (after_op) after_op(same ? oi : mops[k], members[k]);
        ++pc[static_cast<std::size_t>(members[k])];
      }
      for (std::size_t k = 0; k < members.size(); ++k) release_dead(same ? oi : mops[k], members[k]);
      progress = true;
    }
    if (!progress) {
      // Per-rank programs: ops take effect at their positions, which a correct program whose async ops overlap a
      // blocking one may not allow; that is for the temporal checks to judge, not a value the run computed.
      std::string why = "no rank can make progress (a Recv with no matching Send, or a collective some ranks never reach)";
      if (p_.per_rank) throw BudgetError(why + "; the value run executes every op at its position in its program");
      throw InterpError(why);
    }
  }
}

std::int64_t Runner::eval(ExprId e, const std::string& what) const {
  std::optional<std::int64_t> v;
  if (p_.local_view) {  // axis_index and axis sizes take the current rank's values (all 0 / 1 on one device)
    auto c = coords(failed_rank);
    v = p_.exprs.eval(e, vars_, AxisEnv{&c, &sizes_});
  } else {
    v = p_.exprs.eval(e, vars_);
  }
  if (!v || *v < 0) throw InterpError(what + " (" + p_.expr_str(e) + ") has no value under these sizes");
  return *v;
}

std::int64_t Runner::real_global(int oi, int k, std::size_t d) const {
  if (!real_shapes) return -1;
  // A run at reduced sizes whose kernel needs an extent the types did not give: the reduced one would be a wrong
  // count (a Mean dividing by the reduced number of elements), so the run fails and the value check runs as declared.
  auto unknown = [&] {
    const Op* op = oi >= 0 && static_cast<std::size_t>(oi) < p_.ops.size() ? &p_.ops[static_cast<std::size_t>(oi)] : nullptr;
    return InterpError(fmt::format("the declared extent of dim {} of input {} of {} (line {}) is not known at the reduced sizes", d, k,
                                   op ? op_name(op->kind) : "an op", op ? op->loc.line : 0));
  };
  if (oi < 0 || static_cast<std::size_t>(oi) >= real_shapes->size()) throw unknown();
  const auto& ins = (*real_shapes)[static_cast<std::size_t>(oi)];
  if (k < 0 || static_cast<std::size_t>(k) >= ins.size() || d >= ins[static_cast<std::size_t>(k)].size() || ins[static_cast<std::size_t>(k)][d] < 0)
    throw unknown();
  return ins[static_cast<std::size_t>(k)][d];
}

std::int64_t Runner::ranks_over(std::uint32_t axes, const std::vector<std::int64_t>& mesh) {
  std::int64_t n = 1;
  for (std::size_t a = 0; a < mesh.size(); ++a)
    if (axes & (1u << a)) n *= mesh[a];
  return n;
}

std::int64_t Runner::real_local(std::int64_t real, std::int64_t reduced, std::uint32_t mask, std::uint32_t ord, const std::vector<std::int64_t>& c) const {
  if (real > 0 && value_sizes_ != sizes_) {  // on a reduced mesh: the real extent over the declared parts
    if (std::int64_t n = ranks_over(mask, value_sizes_); n != ranks_over(mask, sizes_)) {
      if (real % n) throw InterpError(fmt::format("a dim of {} elements is cut unevenly over {} ranks: its blocks are not known on the reduced mesh", real, n));
      return real / n;
    }
  }
  std::int64_t lo, hi;
  block(real > 0 ? real : reduced, mask, c, lo, hi, ord);
  return hi - lo;
}

std::int64_t Runner::real_count(int oi, int k, const Val& v, std::size_t d, const std::vector<std::int64_t>& c) const {
  if (d >= v.gshape.size()) return d < v.t.shape.size() ? v.t.shape[d] : 1;
  std::int64_t real = real_global(oi, k, d);
  if (real <= 0) return v.t.shape[d];
  return real_local(real, v.gshape[d], d < v.mask.size() ? v.mask[d] : 0, ord_of(v, d), c);
}

void Runner::check_size(const Shape& s) const {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d > opt_.max_elements || (n *= std::max<std::int64_t>(d, 1)) > opt_.max_elements) throw_too_large(s, opt_.max_elements);
  }
}

void Runner::charge(std::int64_t n) {
  work_ += n;
  if (work_ > opt_.max_work) throw_over_work(opt_.max_work);
}

const Val& Runner::in(int op, std::int64_t r, int i) {
  const Op& o = p_.ops[static_cast<std::size_t>(op)];
  NameId n = p_.ins(o)[static_cast<std::size_t>(i)];
  const Val& v = at(r, n);
  if (!v.defined) throw InterpError("reads '" + p_.name(n) + "', which nothing defines");
  return v;
}

std::string Runner::taint_of(int op, std::int64_t r) {
  std::string t;
  vlabel_in_ = 0;
  for (int i = 0; i < n_in(op); ++i) {
    const Val& v = in(op, r, i);
    if (!v.taint.empty() && (t.empty() || v.taint[0] == kExcluded)) t = v.taint;
    vlabel_in_ |= v.vlabel;
  }
  return t;
}

void Runner::set_out(int op, std::int64_t r, int k, Val v, const std::string& taint) {
  const Op& o = p_.ops[static_cast<std::size_t>(op)];
  v.defined = true;
  if (v.taint.empty() || (!taint.empty() && taint[0] == kExcluded)) v.taint = taint;
  if (global_) v.vlabel = vlabel_in_;
  if (p_.local_view) make_local(v);
  if (v.mask.size() != v.gshape.size()) v.mask.resize(v.gshape.size(), 0);
  check_size(v.gshape);
  Shape want = local_shape(v, coords(r));
  if (want != v.t.shape)
    throw InterpError("the local result has shape " + shape_text(v.t.shape) + ", but its layout (global " + shape_text(v.gshape) + ") needs " +
                      shape_text(want) + " on rank " + coord_text(p_, coords(r)));
  charge(v.t.numel() + 1);
  at(r, p_.outs(o)[static_cast<std::size_t>(k)]) = std::move(v);
}

// Slices `v` so that dim d holds the block of `target[d]` (the operand's own block must contain it).
Tensor Runner::align(const Val& v, const std::vector<std::uint32_t>& target, const std::vector<std::int64_t>& c, const std::string& what,
                     bool ones) const {
  Tensor t = v.t;
  for (std::size_t d = 0; d < v.gshape.size(); ++d) {
    if (target[d] == v.mask[d] || (ones && v.gshape[d] == 1)) continue;
    std::int64_t lo, hi, olo, ohi;
    block(v.gshape[d], target[d], c, lo, hi);
    block(v.gshape[d], v.mask[d], c, olo, ohi);
    if (lo < olo || hi > ohi)
      throw InterpError(what + " holds [" + std::to_string(olo) + ", " + std::to_string(ohi) + ") of dim " + std::to_string(d) + " on rank " +
                        coord_text(p_, c) + ", but the other operand needs [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "): no local slice gives it");
    t = slice(t, static_cast<int>(d), lo - olo, hi - olo);
  }
  return t;
}

// Right-aligned union of the masks of two operands (broadcast dims of size 1 carry no shard; a size-1 dim that
// meets only size-1 dims is not broadcast and keeps its shard: torch.chunk gives one rank the element).
std::vector<std::uint32_t> Runner::union_masks(const Val& x, const Val& y, std::size_t r, std::size_t skip_tail) {
  std::vector<std::uint32_t> m(r, 0);
  for (std::size_t k = 0; k + skip_tail < r; ++k) {
    auto dim_of = [&](const Val& v) -> std::ptrdiff_t {
      std::size_t rv = v.gshape.size() - skip_tail;
      return k + rv < r - skip_tail ? -1 : static_cast<std::ptrdiff_t>(k + rv - (r - skip_tail));
    };
    std::ptrdiff_t dx = dim_of(x), dy = dim_of(y);
    bool bcast = (dx >= 0 && x.gshape[static_cast<std::size_t>(dx)] != 1) || (dy >= 0 && y.gshape[static_cast<std::size_t>(dy)] != 1);
    auto pick = [&](const Val& v, std::ptrdiff_t d) -> std::uint32_t {
      if (d < 0) return 0;
      return bcast && v.gshape[static_cast<std::size_t>(d)] == 1 ? 0 : v.mask[static_cast<std::size_t>(d)];
    };
    m[k] = pick(x, dx) | pick(y, dy);
  }
  return m;
}

// The masks of `v`'s dims taken from an output-shaped mask (right-aligned).
std::vector<std::uint32_t> Runner::slice_target(const Val& v, const std::vector<std::uint32_t>& out, std::size_t skip_tail) {
  std::vector<std::uint32_t> t = v.mask;
  std::size_t rv = v.gshape.size() - skip_tail, r = out.size() - skip_tail;
  for (std::size_t d = 0; d < rv; ++d)
    if (v.gshape[d] != 1) t[d] = out[d + r - rv];
  return t;
}

std::vector<int> Runner::norm_dims(std::uint32_t list, int rank, bool default_last) const {
  std::vector<int> dims;
  if (list == kNoIndex) {
    if (default_last && rank > 0) dims.push_back(rank - 1);
    return dims;
  }
  for (int d : p_.int_lists[list]) {
    if (d < -rank || d >= rank) throw InterpError("dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
    d = d < 0 ? d + rank : d;
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) throw InterpError("dim listed twice");
    dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

int Runner::norm_dim(int d, int rank) {
  if (d == kUnset) d = -1;
  if (d < -rank || d >= rank) throw InterpError("dim " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
  return d < 0 ? d + rank : d;
}

void Runner::step_local(int oi, std::int64_t r) {
  failed_op = oi;
  failed_rank = r;
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const auto& c = coords(r);
  std::string taint = global_ ? taint_of(oi, r) : "";
  switch (op.kind) {
    case OpKind::MatMul: return matmul(oi, r, c, taint);
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Multiply:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::And:
    case OpKind::Or: return elementwise(oi, r, c, taint);
    case OpKind::Where: return where(oi, r, c, taint);
    case OpKind::ExpertCompute: return matmul(oi, r, c, taint);
    case OpKind::Neg:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::Sigmoid:
    case OpKind::Not:
    case OpKind::SiLU:
    case OpKind::GELU:
    case OpKind::ReLU:
    case OpKind::Cast:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::LossScale: return pointwise(oi, r, taint);
    case OpKind::FP8Quantize: return fp8_quantize(oi, r, taint);
    case OpKind::FP8Dequantize: return fp8_dequantize(oi, r, taint);
    case OpKind::AmaxHistory: return amax_history(oi, r, taint);
    case OpKind::FP8Scale: return fp8_scale(oi, r, taint);
    case OpKind::Dropout: return dropout(oi, r, c, taint);
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: return norm(oi, r, c, taint);
    case OpKind::Softmax: return softmax(oi, r, taint);
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::LogSumExp: return reduce_dims(oi, r, taint);
    case OpKind::FlashAttention: return attention(oi, r, taint);
    case OpKind::RingAttentionStep: return ring_step(oi, r, c, taint);
    case OpKind::LoadBalance: return load_balance(oi, r, taint);
    case OpKind::Embedding: return embedding(oi, r, c, taint);
    case OpKind::CrossEntropyLoss: return cross_entropy(oi, {r});
    case OpKind::TopKGate: return topk(oi, r, taint);
    case OpKind::AmaxUpdate: return amax(oi, r, taint);
    case OpKind::Reshape: return reshape(oi, r, taint);
    case OpKind::Expand: return expand(oi, r, taint);
    case OpKind::Transpose: return transpose_dims(oi, r, taint);
    case OpKind::Reinterpret:
      return set_out(oi, r, 0, in(oi, r, 0), global_ ? std::string(1, kExcluded) + "it passes through Reinterpret, which changes the global value on purpose" : "");
    case OpKind::Convert: return convert(oi, r, c, taint);
    case OpKind::ZeROPartitionOptState: return zero_partition(oi, r, c, taint);
    case OpKind::SPMDGuard:
      if (op.n_out) set_out(oi, r, 0, in(oi, r, 0), taint);
      return;
    case OpKind::Slice: return slice_op(oi, r, c, taint);
    case OpKind::Split: return split_op(oi, r, c, taint);
    case OpKind::Concat: return concat_op(oi, r, c, taint, false);
    case OpKind::Stack: return concat_op(oi, r, c, taint, true);
    case OpKind::Pad: return pad_op(oi, r, c, taint);
    case OpKind::Arange: return arange(oi, r, taint);
    case OpKind::Full: return full(oi, r, taint);
    case OpKind::RoPE: return rope(oi, r, c, taint);
    case OpKind::IndexSelect: return index_select(oi, r, taint);
    case OpKind::IndexAdd: return index_add(oi, r, c, taint);
    case OpKind::OneHot: return one_hot(oi, r, taint);
    case OpKind::Bincount: return bincount(oi, r, taint);
    case OpKind::CumSum: return cumsum(oi, r, taint);
    case OpKind::Detach: return set_out(oi, r, 0, in(oi, r, 0), taint);  // the same value (only the backward differs)
    case OpKind::Send: return send(oi, r);
    case OpKind::Recv: return recv(oi, r, c);
    case OpKind::Wait:
    case OpKind::WaitAll:
    case OpKind::WaitStream:
    case OpKind::RecordEvent:
    case OpKind::WaitEvent: return;  // async values are available at their op; stream order moves no data
    // Gradient ops of derived backwards (ops_grad.cpp); a vocab-parallel CrossEntropyGrad runs in step_group.
    case OpKind::PointwiseGrad: return pointwise_grad(oi, r, c, taint);
    case OpKind::NormGrad: return norm_grad(oi, r, c, taint);
    case OpKind::AttentionGrad: return attention_grad(oi, r, c, taint);
    case OpKind::EmbeddingGrad: return embedding_grad(oi, r, c, taint);
    case OpKind::CrossEntropyGrad: return cross_entropy_grad(oi, {r});
    case OpKind::TopKGrad: return topk_grad(oi, r, c, taint);
    // The optimizer step (ops_optim.cpp); GradNormSq runs in step_group.
    case OpKind::AdamWUpdate:
    case OpKind::SGDUpdate: return optimizer_update(oi, r, c, taint);
    case OpKind::ClipCoef: return clip_coef(oi, r, taint);
    // Opaque ops (OverlapRegion, a schedule's Step) have no numeric kernel: the program is skipped with the
    // reason (has_value_kernel), never counted as agreement. Collectives run in step_group
    // (ops_collectives.cpp) and the later ops are rejected by the loader: neither reaches here.
    case OpKind::Step:
    case OpKind::AllReduce:
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::AllToAll:
    case OpKind::Scatter:
    case OpKind::Gather:
    case OpKind::OverlapRegion:
    case OpKind::ZeROGatherParam:
    case OpKind::ZeROScatterGrad:
    case OpKind::RingRotate:
    case OpKind::RingAttention:
    case OpKind::MoEDispatch:
    case OpKind::MoECombine:
    case OpKind::MoEGateGrad:  // an all-to-all inside: step_group (ops_grad.cpp)
    case OpKind::GradNormSq:
      throw InterpError(std::string(op_name(op.kind)) + " has no numeric kernel in the oracle");
  }
}

}  // namespace spmd::interp
