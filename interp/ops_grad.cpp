// interp/ops_grad.cpp - the numeric oracle: the gradient ops of derived backward programs.
//
// Ops: PointwiseGrad, NormGrad, AttentionGrad, EmbeddingGrad, TopKGrad (per rank, from step_local),
// CrossEntropyGrad (per rank, or across the vocab-parallel group from step_group, like its forward) and MoEGateGrad
// (across its axis's group from step_group, like MoEDispatch and MoECombine).
// Each kernel is the exact chain rule of its forward kernel's formula, written on Num: the double is the real
// derivative, and the field lanes use the forward's random functions (exp, sqrt) with exact relations for their
// derivatives (exp' = exp, sqrt'(x) = sqrt(x) / (2x), rsqrt'(x) = -rsqrt(x) / (2x)), so the backward of a
// primitive composition (RMSNorm from Mean and Rsqrt, Softmax from Exp, Sum and Div) agrees with the fused
// gradient op in the lanes. Derivatives with no such relation (GELU, ReLU) are fresh random functions.
// docs/equivalence.md, "Gradient ops".
#include "interp/runner.h"

#include <numbers>

namespace spmd::interp {

namespace {

// The name of an op's `of` choice (PointwiseGrad, NormGrad).
std::string_view of_choice(const Op& op) {
  const auto& ch = op_info(op.kind).find_attr("of")->choices;
  return op.attrs.choice < ch.size() ? std::string_view(ch[op.attrs.choice]) : std::string_view();
}

}  // namespace

int dropout_forward(const Program& p, const std::vector<Op>& ops, const Op& grad) {
  if (grad.kind != OpKind::PointwiseGrad || grad.n_in < 2) return -1;
  NameId x = p.ins(grad)[1];
  int found = -1;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == OpKind::Dropout && ops[i].n_in >= 1 && p.ins(ops[i])[0] == x) {
      if (found >= 0) return -1;  // two masks: which one this gradient belongs to is not said
      found = static_cast<int>(i);
    }
  return found;
}

// dy * f'(x), f the op `of`. Lanes: Exp dy E(x); Log dy / x; Sqrt dy S(x) / (2x); Rsqrt -dy / (2 x S(x));
// SiLU dy (s + x s (1 - s)) with s = 1 / (1 + E(-x)) (the derivative of the forward's lane formula); GELU and
// ReLU dy times a random function of x keyed by the derivative's own name; Dropout dy times the forward's own
// mask / (1 - p), redrawn from the forward Dropout (the one Dropout reading x; none: no value kernel).
void Runner::pointwise_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& dy = in(oi, r, 0);
  const Val& x = in(oi, r, 1);
  auto ins = p_.ins(op);
  Val o;
  o.gshape = broadcast_shapes(dy.gshape, x.gshape);
  o.mask = union_masks(dy, x, o.gshape.size());
  Tensor dl = align(dy, slice_target(dy, o.mask), c, p_.name(ins[0]));
  Tensor xl = align(x, slice_target(x, o.mask), c, p_.name(ins[1]));
  std::string_view of = of_choice(op);
  std::string t = taint;
  if (of == "Dropout") {
    int fw = dropout_forward(p_, p_.ops, op);
    if (fw < 0) throw InterpError("PointwiseGrad of Dropout has no forward Dropout of its x to take the mask from");
    const Op& dop = p_.ops[static_cast<std::size_t>(fw)];
    if (o.gshape != x.gshape || dl.shape != xl.shape) throw InterpError("PointwiseGrad of Dropout needs dy of x's shape");
    double p = dop.attrs.has_number ? dop.attrs.number : 0.1;
    const Num keep = 1 - p;
    if (dop.attrs.rng_per_rank && global_) t = "Dropout with `rng: per_rank` draws a different mask on every rank";
    // the forward's mask: a function of the element's global position (and of the rank with rng: per_rank)
    std::uint64_t key = mix(seed_ * 7919 + static_cast<std::uint64_t>(fw));
    if (dop.attrs.rng_per_rank) key = mix(key ^ static_cast<std::uint64_t>(r + 1));
    Shape lo(o.gshape.size());
    for (std::size_t d = 0; d < lo.size(); ++d) {
      std::int64_t h;
      block(o.gshape[d], o.mask[d], c, lo[d], h);
    }
    Shape gst = strides_of(o.gshape);
    Shape idx(dl.shape.size(), 0);
    o.t = dl;
    for (auto& e : o.t.data) {
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
      e = unit(mix(key ^ static_cast<std::uint64_t>(flat))) < p ? Num(0.0) : e / keep;
      for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < o.t.shape[static_cast<std::size_t>(d)]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
    return set_out(oi, r, 0, std::move(o), t);
  }
  auto apply = [&](auto f) { o.t = binary(dl, xl, f); };  // picked once, inlined per element
  if (of == "Exp") apply([](const Num& g, const Num& a) { return g * exp(a); });
  else if (of == "Log") apply([](const Num& g, const Num& a) { return g / a; });
  else if (of == "Sqrt")
    apply([](const Num& g, const Num& a) {
      Num v = g * sqrt(a) / (Num(2.0) * a);  // sqrt'(x) = sqrt(x) / (2x): Sqrt then Div agrees with Rsqrt and NormGrad
      v.d = g.d * 0.5 / std::sqrt(a.d);      // the same real value, finite at sqrt(x) = 0 as the textbook form
      return v;
    });
  else if (of == "Rsqrt") apply([](const Num& g, const Num& a) { return g * (Num(-0.5) * rsqrt(a) / a); });
  else if (of == "SiLU" || of == "Sigmoid") {
    // s = 1 / (1 + E(-x)) for every element, the quotients sharing one field inverse (div_many)
    const Num one = 1.0;  // made here: a constant's lanes are set only while the lanes are on
    const bool silu = of == "SiLU";
    const bool same = dl.shape == xl.shape;
    const Tensor gs = same ? dl : binary(dl, xl, [](const Num& g, const Num&) { return g; });
    const Tensor xs = same ? xl : binary(dl, xl, [](const Num&, const Num& a) { return a; });
    Tensor s = unary(xs, [&](const Num& a) { return one + exp(-a); });
    Num* sw = s.data.data();  // s, then the gradient in its place
    div_many(nullptr, sw, sw, s.data.size());
    const Num *g = gs.data.data(), *a = xs.data.data();
    for (std::size_t w = 0; w < s.data.size(); ++w)  // exact: the derivative of the forward's lane formula
      sw[w] = silu ? g[w] * (sw[w] + a[w] * sw[w] * (one - sw[w])) : g[w] * (sw[w] * (one - sw[w]));
    o.t = std::move(s);
  }
  else if (of == "GELU")
    apply([](const Num& g, const Num& a) {
      double cdf = 0.5 * (1 + std::erf(a.d / std::sqrt(2.0))), pdf = std::exp(-0.5 * a.d * a.d) / std::sqrt(2 * std::numbers::pi);
      return g * uf(num::key_of("gelu'"), cdf + a.d * pdf, a);
    });
  else if (of == "ReLU") apply([](const Num& g, const Num& a) { return g * uf(num::key_of("relu'"), a.d > 0 ? 1.0 : 0.0, a); });
  else throw InterpError("PointwiseGrad of an unknown op");
  charge(o.t.numel());
  t = leaves_reals(global_, o.t, {&dl, &xl}, t);
  set_out(oi, r, 0, std::move(o), t);
}

// The input gradient of LayerNorm / RMSNorm (dy, x, [weight]) and of Softmax (dy, its output y) over `dims`.
// With g = dy * weight, c = x - mean (RMSNorm: mean 0), s = var + eps, sd = sqrt(s) as the forward computes them:
//   dx = (g - mean(g)) / sd - c * sum(g c) / (n s sd)     (RMSNorm: no mean(g) term)
// which is the chain rule of the forward's formula with sqrt'(s) = sqrt(s) / (2s), i.e. rsqrt'(s) = -rsqrt(s) / (2s):
// the derived backward of the same norm written with Mean, Rsqrt and Multiply gives it in the lanes.
// Softmax: dx = y (dy - sum(dy y)).
void Runner::norm_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& dy = in(oi, r, 0);
  const Val& x = in(oi, r, 1);
  auto ins = p_.ins(op);
  if (dy.gshape != x.gshape) throw InterpError("NormGrad's dy " + shape_text(dy.gshape) + " and x " + shape_text(x.gshape) + " differ in shape");
  Val o;
  o.gshape = x.gshape;
  o.mask = union_masks(dy, x, o.gshape.size());
  Tensor g = align(dy, o.mask, c, p_.name(ins[0]));
  Tensor xl = align(x, o.mask, c, p_.name(ins[1]));
  std::string_view of = of_choice(op);
  bool softmax = of == "Softmax", rms = of == "RMSNorm";
  auto dims = norm_dims(op.attrs.dims, xl.rank(), true);
  if (op.n_in == 3) {
    if (softmax) throw InterpError("NormGrad of Softmax takes no weight");
    const Val& w = in(oi, r, 2);
    if (w.gshape.size() != dims.size()) throw InterpError("a norm weight must have the shape of the normalized dims");
    std::vector<std::uint32_t> target(dims.size());
    for (std::size_t k = 0; k < dims.size(); ++k) target[k] = o.mask[static_cast<std::size_t>(dims[k])];
    Tensor wl = align(w, target, c, p_.name(ins[2]));
    Shape ws(xl.shape.size(), 1);
    for (std::size_t k = 0; k < dims.size(); ++k) ws[static_cast<std::size_t>(dims[k])] = wl.shape[k];
    g = binary(g, interp::reshape(wl, ws), [](const Num& a, const Num& b) { return a * b; });
  }
  const Num eps = op.attrs.has_number ? op.attrs.number : 1e-5;
  std::vector<std::int64_t> bases, offs;
  group_layout(xl.shape, dims, bases, offs);
  o.t = Tensor(xl.shape);
  std::int64_t count = 1;  // the normalized elements: the real count under shape reduction
  for (int d : dims) count *= real_local(real_global(oi, 1, static_cast<std::size_t>(d)), x.gshape[static_cast<std::size_t>(d)],
                                         o.mask[static_cast<std::size_t>(d)], 0, c);
  const Num n = static_cast<double>(count);
  auto at = [](const Tensor& t, std::int64_t i) -> const Num& { return t.data[static_cast<std::size_t>(i)]; };
  Num* out = o.t.data.data();
  for (auto b : bases) {
    if (softmax) {
      Num s = 0.0;
      for (auto j : offs) s += at(g, b + j) * at(xl, b + j);
      for (auto j : offs) out[b + j] = at(xl, b + j) * (at(g, b + j) - s);
      continue;
    }
    Num mean = 0.0, var = 0.0, gmean = 0.0, gc = 0.0;
    if (!rms) {
      for (auto j : offs) mean += at(xl, b + j), gmean += at(g, b + j);
      mean /= n, gmean /= n;
    }
    for (auto j : offs) var += (at(xl, b + j) - mean) * (at(xl, b + j) - mean);
    var /= n;
    const Num s = var + eps, sd = sqrt(s);
    for (auto j : offs) gc += at(g, b + j) * (at(xl, b + j) - mean);
    const Num k = gc / (n * s * sd);
    for (auto j : offs) out[b + j] = (rms ? at(g, b + j) : at(g, b + j) - gmean) / sd - (at(xl, b + j) - mean) * k;
  }
  charge(o.t.numel() * 4);
  std::string t = leaves_reals(global_, o.t, {&g, &xl}, taint);
  set_out(oi, r, 0, std::move(o), t);
}

namespace {

// The gradient of attend_kernel (ops_cp.cpp) with respect to q, k or v (the non-null outputs), for the output
// gradient dy: P recomputed as the forward does (the same scale, mask, stabilizer and exp), then
// dV = P^T dY, dP = dY V^T, D = rowsum(P * dP), dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q;
// the query heads of a kv head (GQA) add into its dK and dV.
void attend_grad_kernel(AttnLayout layout, bool causal, const Tensor& dy, const Tensor& q, const Tensor& k, const Tensor& v,
                        const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, Tensor* dq, Tensor* dk, Tensor* dv, std::int64_t real_d,
                        double scale) {
  const AttnShape g = attn_shape(layout, "AttentionGrad", q, k, v, qpos, kpos, real_d, scale);
  Shape ys = q.shape;
  ys[static_cast<std::size_t>(g.dd)] = g.DV;
  if (dy.shape != ys) throw InterpError("AttentionGrad dy has local shape " + shape_text(dy.shape) + ", the attention output " + shape_text(ys));
  if (dq) *dq = Tensor(q.shape, 0.0);
  if (dk) *dk = Tensor(k.shape, 0.0);
  if (dv) *dv = Tensor(v.shape, 0.0);
  std::vector<Num> w, dp(static_cast<std::size_t>(g.SK));
  Num m;
  for (std::int64_t bi = 0; bi < g.B; ++bi)
    for (std::int64_t hi = 0; hi < g.HQ; ++hi) {
      std::int64_t kh = hi / (g.HQ / g.HK);
      for (std::int64_t i = 0; i < g.SQ; ++i) {
        const Num z = attn_row(g, causal, q, k, qpos, kpos, bi, hi, i, w, m);
        if (!(z.d > 0)) continue;  // a row with no key: the forward's output is 0, so is every gradient
        for (auto& e : w) e = e / z;  // P
        if (dv)
          for (std::int64_t j = 0; j < g.SK; ++j)
            for (std::int64_t d = 0; d < g.DV; ++d) dv->data[g.at(*dv, bi, kh, j, d)] += w[static_cast<std::size_t>(j)] * dy.data[g.at(dy, bi, hi, i, d)];
        if (!dq && !dk) continue;
        Num rowsum = 0.0;
        for (std::int64_t j = 0; j < g.SK; ++j) {
          Num a = 0.0;
          for (std::int64_t d = 0; d < g.DV; ++d) a += dy.data[g.at(dy, bi, hi, i, d)] * v.data[g.at(v, bi, kh, j, d)];
          dp[static_cast<std::size_t>(j)] = a;
          rowsum += w[static_cast<std::size_t>(j)] * a;
        }
        for (std::int64_t j = 0; j < g.SK; ++j) {
          if (causal && kpos[static_cast<std::size_t>(j)] > qpos[static_cast<std::size_t>(i)]) continue;  // masked: P = 0
          const Num ds = w[static_cast<std::size_t>(j)] * (dp[static_cast<std::size_t>(j)] - rowsum) * g.scale;
          if (dq)
            for (std::int64_t d = 0; d < g.D; ++d) dq->data[g.at(*dq, bi, hi, i, d)] += ds * k.data[g.at(k, bi, kh, j, d)];
          if (dk)
            for (std::int64_t d = 0; d < g.D; ++d) dk->data[g.at(*dk, bi, kh, j, d)] += ds * q.data[g.at(q, bi, hi, i, d)];
        }
      }
    }
}

}  // namespace

// AttentionGrad (dy, q, k, v; `wrt`): the gradient of FlashAttention, with the forward's positions (with `cp`
// and causal: the global positions of this rank's q block; k and v whole).
void Runner::attention_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int s = op.attrs.layout == AttnLayout::BSHD ? 1 : op.attrs.layout == AttnLayout::SBHD ? 0 : 2, dd = 3;
  int wrt = op.attrs.choice < 3 ? op.attrs.choice : 0;
  const Val& dy = in(oi, r, 0);
  const Val& q = in(oi, r, 1);
  const Val& k = in(oi, r, 2);
  const Val& v = in(oi, r, 3);
  if (dy.t.rank() != 4 || q.t.rank() != 4 || k.t.rank() != 4 || v.t.rank() != 4) throw InterpError("AttentionGrad needs rank-4 dy, q, k, v");
  std::int64_t SQ = q.t.shape[static_cast<std::size_t>(s)], SK = k.t.shape[static_cast<std::size_t>(s)];
  std::vector<std::int64_t> qpos, kpos;
  attn_positions(op, c, SQ, SK, qpos, kpos);
  std::vector<std::uint32_t> ym = q.mask;
  ym[static_cast<std::size_t>(dd)] = v.mask[static_cast<std::size_t>(dd)];
  const std::int64_t real_d = real_global(oi, 1, 3);
  const Val& src = wrt == 0 ? q : wrt == 1 ? k : v;
  Val o;
  o.gshape = src.gshape;
  o.mask = src.mask;
  o.ord = src.ord;
  std::int64_t B = q.t.numel() / std::max<std::int64_t>(1, SQ * q.t.shape[static_cast<std::size_t>(dd)]);
  charge(B * SQ * SK * (q.t.shape[static_cast<std::size_t>(dd)] + v.t.shape[static_cast<std::size_t>(dd)]) * 2);
  // A sibling's pass of the same attention (runner.h, AttnGradShare) may have left this gradient already.
  const int group = attn_group_.empty() ? -1 : attn_group_[static_cast<std::size_t>(oi)];
  auto same = [](const Tensor& a, const Tensor& b) { return a.data.data() == b.data.data() && a.shape == b.shape; };
  if (auto it = attn_share_.find(r); group >= 0 && it != attn_share_.end()) {
    AttnGradShare& sh = it->second;
    if (sh.group == group && (sh.left >> wrt & 1u) && same(sh.dy, dy.t) && same(sh.q, q.t) && same(sh.k, k.t) && same(sh.v, v.t) && sh.qpos == qpos &&
        sh.kpos == kpos && sh.ym == ym && sh.real_d == real_d) {
      o.t = std::move(sh.out[wrt]);
      sh.left = static_cast<std::uint8_t>(sh.left & ~(1u << wrt));
      if (!sh.left) attn_share_.erase(it);
      set_out(oi, r, 0, std::move(o), taint);
      return;
    }
  }
  const std::uint8_t wrts = group >= 0 ? static_cast<std::uint8_t>(attn_wrts_[static_cast<std::size_t>(group)] | (1u << wrt)) : static_cast<std::uint8_t>(1u << wrt);
  Tensor grads[3];
  const Tensor dyl = align(dy, ym, c, p_.name(p_.ins(op)[0]));
  attend_grad_kernel(op.attrs.layout, op.attrs.causal, dyl, q.t, k.t, v.t, qpos, kpos, (wrts & 1u) ? &grads[0] : nullptr, (wrts & 2u) ? &grads[1] : nullptr,
                     (wrts & 4u) ? &grads[2] : nullptr, real_d, op.attrs.has_number ? op.attrs.number : 0);
  o.t = std::move(grads[wrt]);
  if (const std::uint8_t others = static_cast<std::uint8_t>(wrts & ~(1u << wrt)); others) {
    AttnGradShare& sh = attn_share_[r];
    sh = AttnGradShare{group, dy.t, q.t, k.t, v.t, qpos, kpos, ym, real_d, {}, others};
    for (int w = 0; w < 3; ++w)
      if (others >> w & 1u) sh.out[w] = std::move(grads[w]);
  } else {
    attn_share_.erase(r);
  }
  set_out(oi, r, 0, std::move(o), taint);
}

// EmbeddingGrad (dy, ids, weight): zeros of the weight's local block; each id in this rank's vocab block (the
// forward's masked lookup) adds its dy row at its columns.
void Runner::embedding_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto ins = p_.ins(op);
  const Val& dy = in(oi, r, 0);
  const Val& ids = in(oi, r, 1);
  const Val& w = in(oi, r, 2);
  if (w.gshape.size() != 2) throw InterpError("EmbeddingGrad weight must be [vocab, hidden]");
  Shape want = ids.gshape;
  want.push_back(w.gshape[1]);
  if (dy.gshape != want) throw InterpError("EmbeddingGrad dy has shape " + shape_text(dy.gshape) + ", the lookup's output " + shape_text(want));
  note_index_ranges(oi, r);
  std::int64_t lo, hi, wlo, whi, clo, chi;
  block(w.gshape[0], w.mask[0], c, lo, hi);
  std::vector<std::uint32_t> tok(ids.gshape.size());
  for (std::size_t d = 0; d < tok.size(); ++d) tok[d] = ids.mask[d] | dy.mask[d];
  std::vector<std::uint32_t> ym = tok;
  ym.push_back(dy.mask.back() | w.mask[1]);
  Tensor idl = align(ids, tok, c, p_.name(ins[1]));
  Tensor dyl = align(dy, ym, c, p_.name(ins[0]));
  block(w.gshape[1], w.mask[1], c, wlo, whi);
  block(w.gshape[1], ym.back(), c, clo, chi);
  std::int64_t hl = w.t.shape[1], off = clo - wlo, cols = chi - clo;
  if (off < 0 || off + cols > hl) throw InterpError("EmbeddingGrad dy's columns fall outside the weight's block");
  Val o;
  o.gshape = w.gshape;
  o.mask = w.mask;
  o.t = Tensor(w.t.shape, 0.0);
  for (std::size_t i = 0; i < idl.data.size(); ++i) {
    std::int64_t id = as_index(idl.data[i], w.gshape[0], "an EmbeddingGrad id");
    if (id < lo || id >= hi) continue;  // another rank holds this row
    for (std::int64_t j = 0; j < cols; ++j)
      o.t.data[static_cast<std::size_t>((id - lo) * hl + off + j)] += dyl.data[i * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j)];
  }
  charge(dyl.numel() + o.t.numel());
  set_out(oi, r, 0, std::move(o), taint);
}

// TopKGrad (dweights, logits, indices): the forward's weights are softmax(logits) at the chosen experts, so with
// u the weight gradients scattered to their experts, dlogits = p (u - sum(u p)) (the softmax backward).
void Runner::topk_grad(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto ins = p_.ins(op);
  const Val& dw = in(oi, r, 0);
  const Val& x = in(oi, r, 1);
  const Val& ix = in(oi, r, 2);
  if (x.t.rank() < 1 || dw.gshape.size() != x.gshape.size() || ix.gshape != dw.gshape) throw InterpError("TopKGrad needs dweights and indices [..., k] of the logits [..., experts]");
  std::vector<std::uint32_t> tm = x.mask;
  tm.back() = 0;
  Tensor dwl = align(dw, tm, c, p_.name(ins[0]));
  Tensor ixl = align(ix, tm, c, p_.name(ins[2]));
  std::int64_t E = x.t.shape.back(), K = dwl.shape.back();
  std::int64_t rows = E ? x.t.numel() / E : 0;
  if (dwl.numel() != rows * K || ixl.shape != dwl.shape) throw InterpError("TopKGrad local dweights " + shape_text(dwl.shape) + " do not fit the logits " + shape_text(x.t.shape));
  Val o = x;
  o.t = Tensor(x.t.shape, 0.0);
  std::vector<Num> line(static_cast<std::size_t>(E)), u(static_cast<std::size_t>(E));
  for (std::int64_t row = 0; row < rows; ++row) {
    std::copy_n(x.t.data.begin() + row * E, E, line.begin());
    softmax_line(line);
    std::fill(u.begin(), u.end(), Num(0.0));
    for (std::int64_t j = 0; j < K; ++j) {
      auto e = static_cast<std::size_t>(as_index(ixl.data[static_cast<std::size_t>(row * K + j)], E, "a TopKGrad index"));
      u[e] += dwl.data[static_cast<std::size_t>(row * K + j)];
    }
    Num a = 0.0;
    for (std::size_t e = 0; e < u.size(); ++e) a += u[e] * line[e];
    for (std::size_t e = 0; e < u.size(); ++e) o.t.data[static_cast<std::size_t>(row * E) + e] = line[e] * (u[e] - a);
  }
  charge(x.t.numel() * 3);
  set_out(oi, r, 0, std::move(o), taint);
}

// CrossEntropyGrad (dloss, logits, labels): (softmax(logits) - onehot(labels)) * dloss, divided by the token count
// for `mean` as the forward divides (the tokens this rank holds). With vocab_parallel the vocab is split over the
// group and the max and the sum of exponentials span it (as Runner::cross_entropy); a rank's labels outside its
// vocab block have no one-hot entry there.
void Runner::cross_entropy_grad(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto ins = p_.ins(op);
  bool none = op.attrs.reduction == Reduction::None, mean = op.attrs.reduction == Reduction::Mean;
  std::size_t n = members.size();
  struct Part {
    Tensor dl, lg, lb;
    Val out;
    std::int64_t real_tokens = 0;  // the tokens a mean divides by (real extents under shape reduction)
  };
  std::vector<Part> parts(n);
  std::int64_t T = -1;
  for (std::size_t k = 0; k < n; ++k) {
    std::int64_t r = members[k];
    failed_rank = r;
    const auto& c = coords(r);
    const Val& dl = in(oi, r, 0);
    const Val& lg = in(oi, r, 1);
    const Val& lb = in(oi, r, 2);
    if (lg.gshape.empty() || lb.gshape.size() + 1 != lg.gshape.size()) throw InterpError("CrossEntropyGrad labels must have the logits' shape without the vocab dim");
    if (none ? dl.gshape != lb.gshape : numel_of(dl.gshape) != 1)
      throw InterpError("CrossEntropyGrad dloss has shape " + shape_text(dl.gshape) + (none ? ", the labels " + shape_text(lb.gshape) : ", not one value"));
    note_index_ranges(oi, r);
    Part& P = parts[k];
    std::vector<std::uint32_t> tok(lb.gshape.size());
    for (std::size_t d = 0; d < tok.size(); ++d) tok[d] = lb.mask[d] | (lg.gshape[d] == 1 ? 0 : lg.mask[d]) | (none ? dl.mask[d] : 0);
    std::vector<std::uint32_t> tl = lg.mask;
    for (std::size_t d = 0; d < tok.size(); ++d) tl[d] = tok[d];
    P.lg = align(lg, tl, c, p_.name(ins[1]));
    P.lb = align(lb, tok, c, p_.name(ins[2]));
    P.dl = none ? align(dl, tok, c, p_.name(ins[0])) : dl.t;
    P.real_tokens = 1;
    for (std::size_t d = 0; d < tok.size(); ++d) P.real_tokens *= real_local(real_global(oi, 2, d), lb.gshape[d], tok[d], 0, c);
    Shape ts(P.lg.shape.begin(), P.lg.shape.end() - 1);
    if (ts != P.lb.shape) throw InterpError("CrossEntropyGrad local logits " + shape_text(P.lg.shape) + " and labels " + shape_text(P.lb.shape) + " do not fit");
    std::int64_t t = P.lb.numel();
    if (T >= 0 && t != T) throw InterpError("ranks of one vocab-parallel group hold different token counts");
    T = t;
    P.out.gshape = lg.gshape;
    P.out.mask = tl;
    charge(P.lg.numel());
  }
  const std::size_t nt = static_cast<std::size_t>(std::max<std::int64_t>(T, 0));
  std::vector<double> gmax(nt, -INFINITY);
  std::vector<Num> gse(nt, 0.0);
  for (auto& P : parts) {
    std::size_t V = static_cast<std::size_t>(P.lg.shape.back());
    for (std::size_t i = 0; i < nt; ++i)
      for (std::size_t v = 0; v < V; ++v) gmax[i] = std::max(gmax[i], P.lg.data[i * V + v].d);
  }
  for (auto& P : parts) {
    std::size_t V = static_cast<std::size_t>(P.lg.shape.back());
    for (std::size_t i = 0; i < nt; ++i) {
      const Num m = Num::stabilizer(gmax[i]);
      for (std::size_t v = 0; v < V; ++v) gse[i] += exp(P.lg.data[i * V + v] - m);
    }
  }
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  for (std::size_t k = 0; k < n; ++k) {
    Part& P = parts[k];
    const Num count = static_cast<double>(P.real_tokens);
    failed_rank = members[k];
    std::int64_t V = P.lg.shape.back(), vocab = P.out.gshape.back();
    std::int64_t off = static_cast<std::int64_t>(k) * V;  // as the forward: rank g owns labels [g * V, (g + 1) * V)
    P.out.t = Tensor(P.lg.shape);
    const Num one = 1.0;
    for (std::size_t i = 0; i < nt; ++i) {
      std::int64_t label = as_index(P.lb.data[i], vocab, "a CrossEntropyGrad label");
      if (!op.attrs.vocab_parallel && label >= V) throw InterpError("a label indexes past the " + std::to_string(V) + " local logits");
      Num coef = none ? P.dl.data[i] : P.dl.data[0];
      if (mean) coef = coef / count;
      const Num m = Num::stabilizer(gmax[i]);
      for (std::int64_t v = 0; v < V; ++v) {
        const std::size_t e = i * static_cast<std::size_t>(V) + static_cast<std::size_t>(v);
        Num p = exp(P.lg.data[e] - m) / gse[i];
        if (label == off + v) p = p - one;
        P.out.t.data[e] = p * coef;
      }
    }
    set_out(oi, members[k], 0, std::move(P.out), taint);
  }
}

// MoEGateGrad (tokens [..., T, H], buffer [..., E, C, H], indices [..., T, k]; `axis`): per (token, choice) the dot
// product of the token with its expert slot, the slot found as MoEDispatch / MoECombine find it (the same capacity
// groups, member k's slots of expert e on the rank holding e); a dropped choice has no slot and gets 0.
void Runner::moe_gate_grad(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto n = static_cast<std::int64_t>(members.size());
  // capacity groups per member: the single-device run holds every rank's tokens (as Runner::moe)
  const std::int64_t G = global_ ? ranks_over(op.attrs.axes, real_sizes_) : 1;
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  NameId idx_name = p_.ins(op)[2];
  const Val& b0 = in(oi, members[0], 1);
  if (b0.t.rank() < 3) throw InterpError("MoEGateGrad's buffer must be [..., E, C, H]");
  std::size_t nl = b0.t.shape.size() - 3;
  std::int64_t El = b0.t.shape[nl], Cl = b0.t.shape[nl + 1], H = b0.t.shape[nl + 2], E = El * n;
  if (Cl % (n * G)) throw InterpError("MoEGateGrad cannot split " + std::to_string(Cl) + " capacity slots over " + std::to_string(n * G) + " ranks");
  std::int64_t c = Cl / (n * G);
  for (std::int64_t k = 0; k < n; ++k)
    if (in(oi, members[static_cast<std::size_t>(k)], 1).t.shape != b0.t.shape) throw InterpError("MoEGateGrad ranks hold buffers of different shapes");
  std::vector<Val> outs(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    failed_rank = members[static_cast<std::size_t>(k)];
    const Val& x = in(oi, members[static_cast<std::size_t>(k)], 0);
    const Val& idx = in(oi, members[static_cast<std::size_t>(k)], 2);
    if (x.t.rank() != static_cast<int>(nl) + 2 || idx.t.rank() != static_cast<int>(nl) + 2 || x.t.shape[nl + 1] != H ||
        idx.t.shape[nl] != x.t.shape[nl] || !std::equal(x.t.shape.begin(), x.t.shape.begin() + static_cast<std::ptrdiff_t>(nl), b0.t.shape.begin()))
      throw InterpError("MoEGateGrad local tokens " + shape_text(x.t.shape) + ", buffer " + shape_text(b0.t.shape) + " and indices " +
                        shape_text(idx.t.shape) + " do not fit");
    // member k's slots of every expert: from rank j, expert block j
    Tensor Bk;
    if (n == 1) {
      Bk = b0.t;
    } else {
      std::vector<Tensor> parts;
      for (std::int64_t j = 0; j < n; ++j) parts.push_back(slice(in(oi, members[static_cast<std::size_t>(j)], 1).t, static_cast<int>(nl) + 1, k * c, (k + 1) * c));
      Bk = concat(parts, static_cast<int>(nl));
    }
    std::int64_t B = numel_of(Shape(idx.t.shape.begin(), idx.t.shape.begin() + static_cast<std::ptrdiff_t>(nl))), T = idx.t.shape[nl],
                 K = idx.t.shape[nl + 1], GC = G * c;
    auto slot = moe_slots(idx, E, G, c, idx_name);
    Val o;
    o.gshape = idx.gshape;
    o.mask = idx.mask;
    o.t = Tensor(idx.t.shape, 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t j = 0; j < K; ++j) {
          std::size_t at = static_cast<std::size_t>((b * T + t) * K + j);
          if (slot[at] < 0) continue;
          std::int64_t e = static_cast<std::int64_t>(idx.t.data[at].d);
          std::int64_t src = ((b * E + e) * GC + slot[at]) * H, tok = (b * T + t) * H;
          Num acc = 0.0;
          for (std::int64_t h = 0; h < H; ++h) acc += x.t.data[static_cast<std::size_t>(tok + h)] * Bk.data[static_cast<std::size_t>(src + h)];
          o.t.data[at] = acc;
        }
    charge(B * T * K * H);
    outs[static_cast<std::size_t>(k)] = std::move(o);
  }
  for (std::int64_t k = 0; k < n; ++k) set_out(oi, members[static_cast<std::size_t>(k)], 0, std::move(outs[static_cast<std::size_t>(k)]), taint);
}

}  // namespace spmd::interp
