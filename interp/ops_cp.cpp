// interp/ops_cp.cpp - the numeric oracle: context parallelism.
//
// Ops: RingRotate and RingAttention (run across the ring's group, from step_group), RingAttentionStep and
// LoadBalance (per rank, from step_local), and the global causal positions FlashAttention uses with `cp`.
// In the single-device run every rank sees every key: RingRotate is the identity, a ring step is the whole
// attention (merging it again changes nothing), so a hand-rolled ring agrees only when it merges every key
// block once with the log-sum-exp rescale, with the positions of the blocks it holds.
#include "interp/runner.h"

namespace spmd::interp {

// The original position of row g of a sequence of `len` rows in `order` over a ring of n ranks: contiguous
// is the identity; zigzag gives rank i (rows [i*len/n, (i+1)*len/n)) the chunks i and 2n-1-i of 2n.
std::int64_t Runner::cp_position(std::int64_t g, std::int64_t len, std::int64_t n, bool zigzag) {
  if (!zigzag) return g;
  if (n <= 0 || len % (2 * n) != 0)
    throw InterpError("a zigzag order cuts a sequence of " + std::to_string(len) + " into 2 x " + std::to_string(n) + " chunks, which does not divide");
  std::int64_t chunk = len / (2 * n), blk = len / n, r = g / blk, j = g % blk;
  return j < chunk ? r * chunk + j : (2 * n - 1 - r) * chunk + (j - chunk);
}

// The size of the ring axis of `op` (its single `axis`, or `cp` of FlashAttention) in the real mesh.
std::int64_t Runner::cp_ring(const Op& op, int& axis) const {
  axis = -1;
  for (std::size_t a = 0; a < p_.mesh.size(); ++a)
    if (op.attrs.axes >> a & 1u) {
      if (axis >= 0) throw InterpError(std::string(op_name(op.kind)) + " runs a ring over one axis");
      axis = static_cast<int>(a);
    }
  if (axis < 0) throw InterpError(std::string(op_name(op.kind)) + " needs `axis`");
  return real_sizes_[static_cast<std::size_t>(axis)];
}

AttnShape attn_shape(AttnLayout layout, const std::string& nm, const Tensor& q, const Tensor& k, const Tensor& v,
                     const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, std::int64_t real_d, double scale) {
  AttnShape g;
  if (layout == AttnLayout::BSHD) g.s = 1, g.h = 2;
  if (layout == AttnLayout::SBHD) g.s = 0, g.b = 1, g.h = 2;
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) throw InterpError(nm + " needs rank-4 q, k, v");
  auto L = [](const Tensor& t, int d) { return t.shape[static_cast<std::size_t>(d)]; };
  g.B = L(q, g.b), g.HQ = L(q, g.h), g.SQ = L(q, g.s), g.D = L(q, g.dd), g.HK = L(k, g.h), g.SK = L(k, g.s), g.DV = L(v, g.dd);
  if (L(k, g.b) != g.B || L(v, g.b) != g.B || L(k, g.dd) != g.D || L(v, g.s) != g.SK || L(v, g.h) != g.HK || (g.HK == 0 ? g.HQ != 0 : g.HQ % g.HK != 0))  // no heads at all: an empty shard
    throw InterpError(nm + " local shapes do not fit: q " + shape_text(q.shape) + ", k " + shape_text(k.shape) + ", v " + shape_text(v.shape));
  if (static_cast<std::int64_t>(qpos.size()) != g.SQ || static_cast<std::int64_t>(kpos.size()) != g.SK)
    throw InterpError(nm + " positions do not fit the local q and k");
  std::int64_t D = real_d > 0 ? real_d : g.D;
  g.scale = scale > 0 ? scale : D ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
  return g;
}

Num attn_row(const AttnShape& g, bool causal, const Tensor& q, const Tensor& k, const std::vector<std::int64_t>& qpos,
             const std::vector<std::int64_t>& kpos, std::int64_t bi, std::int64_t hi, std::int64_t i, std::vector<Num>& w, Num& m) {
  std::int64_t kh = hi / (g.HQ / g.HK);
  w.resize(static_cast<std::size_t>(g.SK));
  double md = -INFINITY;
  for (std::int64_t j = 0; j < g.SK; ++j) {
    Num sc = 0.0;
    for (std::int64_t d = 0; d < g.D; ++d) sc += q.data[g.at(q, bi, hi, i, d)] * k.data[g.at(k, bi, kh, j, d)];
    bool masked = causal && kpos[static_cast<std::size_t>(j)] > qpos[static_cast<std::size_t>(i)];
    w[static_cast<std::size_t>(j)] = masked ? Num(-INFINITY) : sc * g.scale;
    md = std::max(md, w[static_cast<std::size_t>(j)].d);
  }
  m = Num::stabilizer(md);
  Num z = 0.0;
  for (auto& e : w) z += (e = std::isinf(e.d) ? Num(0.0) : exp(e - m));
  return z;
}

// Attention of q over k, v (local tensors in `layout`) with the causal mask kpos[j] > qpos[i]; writes the
// output and, when asked, the log-sum-exp of the scaled scores per query row (-inf for a row with no key).
// The max subtracted from the scores is a stabilizer (interp/num.h): shift 0 in the field lanes.
void attend_kernel(AttnLayout layout, bool causal, const std::string& nm, const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, Tensor& out, Tensor* lse, std::int64_t real_d,
                   double scale) {
  const AttnShape g = attn_shape(layout, nm, q, k, v, qpos, kpos, real_d, scale);
  Shape os = q.shape;
  os[static_cast<std::size_t>(g.dd)] = g.DV;
  out = Tensor(os);
  Shape ls = q.shape;
  ls[static_cast<std::size_t>(g.dd)] = 1;
  if (lse) *lse = Tensor(ls);
  std::vector<Num> w;
  Num m;
  for (std::int64_t bi = 0; bi < g.B; ++bi)
    for (std::int64_t hi = 0; hi < g.HQ; ++hi) {
      std::int64_t kh = hi / (g.HQ / g.HK);
      for (std::int64_t i = 0; i < g.SQ; ++i) {
        const Num z = attn_row(g, causal, q, k, qpos, kpos, bi, hi, i, w, m);
        for (std::int64_t d = 0; d < g.DV; ++d) {
          Num acc = 0.0;
          for (std::int64_t j = 0; j < g.SK; ++j) acc += w[static_cast<std::size_t>(j)] * v.data[g.at(v, bi, kh, j, d)];
          out.data[g.at(out, bi, hi, i, d)] = z.d > 0 ? acc / z : Num(0.0);
        }
        if (lse) lse->data[g.at(*lse, bi, hi, i, 0)] = z.d > 0 ? m + log(z) : Num(-INFINITY);
      }
    }
}

// The log-sum-exp merge of a ring step (o, l) into the accumulator (O, L), in place in (o, l): with
// m = stabilizer(max(a, b)), lse = m + log(exp(a - m) + exp(b - m)), out = exp(a - lse) O + exp(b - lse) o.
// In the field lanes a = log(Za), b = log(Zb) (attend_kernel), so out = (Za O + Zb o) / (Za + Zb): exactly the
// attention over both key blocks.
void lse_merge(const Tensor& O, const Tensor& L, Tensor& o, Tensor& l) {
  if (O.shape != o.shape || L.shape != l.shape)
    throw InterpError("RingAttentionStep's accumulator has local shapes " + shape_text(O.shape) + " and " + shape_text(L.shape) + ", the step " +
                      shape_text(o.shape) + " and " + shape_text(l.shape));
  std::int64_t rows = l.numel(), DV = rows ? o.numel() / rows : 0;
  // head_dim is the last dim in every layout: row i of lse is the DV values of out from i * DV.
  for (std::int64_t i = 0; i < rows; ++i) {
    const Num a = L.data[static_cast<std::size_t>(i)], b = l.data[static_cast<std::size_t>(i)];
    double md = std::max(a.d, b.d);
    const Num m = Num::stabilizer(md);
    Num lse = std::isinf(md) && md < 0 ? Num(-INFINITY) : m + log(exp(a - m) + exp(b - m));
    Num wa = std::isinf(a.d) && a.d < 0 ? Num(0.0) : exp(a - lse), wb = std::isinf(b.d) && b.d < 0 ? Num(0.0) : exp(b - lse);
    for (std::int64_t d = 0; d < DV; ++d) {
      auto e = static_cast<std::size_t>(i * DV + d);
      o.data[e] = wa * O.data[e] + wb * o.data[e];
    }
    l.data[static_cast<std::size_t>(i)] = lse;
  }
}

void Runner::attend(const Op& op, const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<std::int64_t>& qpos,
                    const std::vector<std::int64_t>& kpos, Tensor& out, Tensor* lse) {
  std::string nm(op_name(op.kind));
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) throw InterpError(nm + " needs rank-4 q, k, v");
  int b = 0, h = 1, s = 2, dd = 3;
  if (op.attrs.layout == AttnLayout::BSHD) s = 1, h = 2;
  if (op.attrs.layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
  auto L = [](const Tensor& t, int d) { return t.shape[static_cast<std::size_t>(d)]; };
  std::int64_t B = L(q, b), HQ = L(q, h), SQ = L(q, s), D = L(q, dd), HK = L(k, h), SK = L(k, s), DV = L(v, dd);
  if (L(k, b) != B || L(v, b) != B || L(k, dd) != D || L(v, s) != SK || L(v, h) != HK || (HK == 0 ? HQ != 0 : HQ % HK != 0))
    throw InterpError(nm + " local shapes do not fit: q " + shape_text(q.shape) + ", k " + shape_text(k.shape) + ", v " + shape_text(v.shape));
  charge(B * HQ * SQ * SK * (D + DV));
  // the head dim (whole on every rank) the default scale uses: the real one under shape reduction
  std::int64_t real_d = real_global(static_cast<int>(&op - p_.ops.data()), 0, 3);
  attend_kernel(op.attrs.layout, op.attrs.causal, nm, q, k, v, qpos, kpos, out, lse, real_d, op.attrs.has_number ? op.attrs.number : 0);
}

namespace {

int seq_dim(const Op& op) { return op.attrs.layout == AttnLayout::BSHD ? 1 : op.attrs.layout == AttnLayout::SBHD ? 0 : 2; }

std::vector<std::int64_t> iota_from(std::int64_t lo, std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), lo);
  return v;
}

}  // namespace

// RingRotate and RingAttention, across the ring's group (members in ring order).
void Runner::ring_group(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  std::size_t n = members.size();
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  int axis;
  std::int64_t N = cp_ring(op, axis);
  std::vector<Val> outs(n);
  if (op.kind == OpKind::RingRotate) {
    bool prev = op.attrs.choice == 1;
    for (std::size_t m = 0; m < n; ++m) {
      std::size_t from = prev ? (m + 1) % n : (m + n - 1) % n;  // next: rank m receives the block of rank m - 1
      outs[m] = in(oi, members[m], 0);
      outs[m].t = in(oi, members[from], 0).t;
      charge(outs[m].t.numel());
    }
  } else {  // RingAttention: each rank's queries over every key block, masked by global positions
    int s = seq_dim(op);
    std::vector<Tensor> ks, vs;
    for (auto r : members) ks.push_back(in(oi, r, 1).t), vs.push_back(in(oi, r, 2).t);
    Tensor kf = concat(ks, s), vf = concat(vs, s);
    bool zz = op.attrs.order == 1 && op.attrs.causal;  // positions matter only to the causal mask
    std::int64_t SK = kf.shape[static_cast<std::size_t>(s)];
    std::vector<std::int64_t> kpos(static_cast<std::size_t>(SK));
    for (std::int64_t j = 0; j < SK; ++j) kpos[static_cast<std::size_t>(j)] = cp_position(j, SK, N, zz);
    for (std::size_t m = 0; m < n; ++m) {
      const Val& q = in(oi, members[m], 0);
      std::int64_t SQ = q.t.shape[static_cast<std::size_t>(s)], total = SQ * static_cast<std::int64_t>(n);
      std::vector<std::int64_t> qpos = iota_from(static_cast<std::int64_t>(m) * SQ, SQ);
      for (auto& g : qpos) g = cp_position(g, total, N, zz);
      outs[m] = q;
      attend(op, q.t, kf, vf, qpos, kpos, outs[m].t, nullptr);
      std::size_t dd = 3;
      outs[m].gshape[dd] = in(oi, members[m], 2).gshape[dd];
      outs[m].mask[dd] = in(oi, members[m], 2).mask[dd];
    }
  }
  for (std::size_t m = 0; m < n; ++m) {
    outs[m].taint.clear();
    set_out(oi, members[m], 0, std::move(outs[m]), taint);
  }
}

// One ring step on rank r: its q block over the key block `step` rotations away (the kernel's positions come
// from its rank and `step`), merged into the accumulator by the log-sum-exp rescale. In the single-device
// run the step is the whole attention, and merging it into the accumulator changes nothing.
void Runner::ring_step(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int axis;
  std::int64_t N = cp_ring(op, axis);
  int s = seq_dim(op);
  std::size_t dd = 3;
  const Val& q = in(oi, r, 0);
  const Val& k = in(oi, r, 1);
  const Val& v = in(oi, r, 2);
  if (q.t.rank() != 4 || k.t.rank() != 4) throw InterpError("RingAttentionStep needs rank-4 q, k, v");
  bool zz = op.attrs.order == 1 && op.attrs.causal;  // positions matter only to the causal mask
  std::int64_t SQ = q.t.shape[static_cast<std::size_t>(s)], SK = k.t.shape[static_cast<std::size_t>(s)];
  std::int64_t me = global_ ? 0 : c[static_cast<std::size_t>(axis)], n = global_ ? 1 : N;
  std::int64_t kb = ((me - op.attrs.k) % n + n) % n;
  std::vector<std::int64_t> qpos = iota_from(me * SQ, SQ), kpos = iota_from(kb * SK, SK);
  for (auto& g : qpos) g = cp_position(g, SQ * n, N, zz);
  for (auto& g : kpos) g = cp_position(g, SK * n, N, zz);
  Val o = q, l = q;
  o.gshape[dd] = v.gshape[dd];
  o.mask[dd] = v.mask[dd];
  l.gshape[dd] = 1;
  l.mask[dd] = 0;
  attend(op, q.t, k.t, v.t, qpos, kpos, o.t, &l.t);
  if (op.n_in == 5 && !global_) {
    const Val& O = in(oi, r, 3);
    const Val& L = in(oi, r, 4);
    lse_merge(O.t, L.t, o.t, l.t);
    charge(o.t.numel());
  }
  set_out(oi, r, 0, std::move(o), taint);
  set_out(oi, r, 1, std::move(l), taint);
}

// LoadBalance: permute dim `dim` of the local tensor into zigzag order (or back), over the ring's size.
void Runner::load_balance(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int axis;
  std::int64_t N = cp_ring(op, axis);
  const Val& x = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim, x.t.rank());
  if (d < 0) throw InterpError("LoadBalance dim is out of range");
  std::int64_t len = x.t.shape[static_cast<std::size_t>(d)];
  std::vector<Tensor> rows;
  for (std::int64_t g = 0; g < len; ++g) rows.push_back(slice(x.t, d, g, g + 1));
  std::vector<Tensor> parts(static_cast<std::size_t>(len));
  for (std::int64_t g = 0; g < len; ++g) {
    std::int64_t p = cp_position(g, len, N, true);
    if (op.attrs.choice == 1) parts[static_cast<std::size_t>(p)] = rows[static_cast<std::size_t>(g)];
    else parts[static_cast<std::size_t>(g)] = rows[static_cast<std::size_t>(p)];
  }
  Val o = x;
  if (len) o.t = concat(parts, d);
  charge(x.t.numel());
  set_out(oi, r, 0, std::move(o), taint);
}

}  // namespace spmd::interp
