// interp/ops_contraction.cpp - the numeric oracle: contractions.
//
// Ops: MatMul, FlashAttention, Embedding.
#include "interp/runner.h"

namespace spmd::interp {

void Runner::matmul(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& A = in(oi, r, 0);
  const Val& B = in(oi, r, 1);
  if (A.gshape.size() < 2 || B.gshape.size() < 2) throw InterpError("MatMul needs rank >= 2");
  Shape ab(A.gshape.begin(), A.gshape.end() - 2), bb(B.gshape.begin(), B.gshape.end() - 2);
  Val o;
  o.gshape = broadcast_shapes(ab, bb);
  std::size_t nb = o.gshape.size();
  o.gshape.push_back(A.gshape[A.gshape.size() - 2]);
  o.gshape.push_back(B.gshape.back());
  o.mask = union_masks(A, B, o.gshape.size(), 2);
  o.mask[nb] = A.mask[A.gshape.size() - 2];
  o.mask[nb + 1] = B.mask.back();
  auto target = [&](const Val& v) {
    auto t = slice_target(v, o.mask, 2);
    return t;
  };
  Tensor al = align(A, target(A), c, p_.name(p_.ins(op)[0]));
  Tensor bl = align(B, target(B), c, p_.name(p_.ins(op)[1]));
  charge(numel_of(al.shape) * bl.shape.back());
  o.t = interp::matmul(al, bl);
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::attention(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int b = 0, h = 1, s = 2, dd = 3;
  if (op.attrs.layout == AttnLayout::BSHD) s = 1, h = 2;
  if (op.attrs.layout == AttnLayout::SBHD) s = 0, b = 1, h = 2;
  const Val& q = in(oi, r, 0);
  const Val& k = in(oi, r, 1);
  const Val& v = in(oi, r, 2);
  if (q.t.rank() != 4 || k.t.rank() != 4 || v.t.rank() != 4) throw InterpError("FlashAttention needs rank-4 q, k, v");
  auto L = [](const Tensor& t, int d) { return t.shape[static_cast<std::size_t>(d)]; };
  std::int64_t B = L(q.t, b), HQ = L(q.t, h), SQ = L(q.t, s), D = L(q.t, dd), HK = L(k.t, h), SK = L(k.t, s), DV = L(v.t, dd);
  if (L(k.t, b) != B || L(v.t, b) != B || L(k.t, dd) != D || L(v.t, s) != SK || L(v.t, h) != HK || HK == 0 || HQ % HK != 0)
    throw InterpError("FlashAttention local shapes do not fit: q " + shape_text(q.t.shape) + ", k " + shape_text(k.t.shape) + ", v " + shape_text(v.t.shape));
  Val o;
  o.gshape = q.gshape;
  o.mask = q.mask;
  o.gshape[static_cast<std::size_t>(dd)] = v.gshape[static_cast<std::size_t>(dd)];
  o.mask[static_cast<std::size_t>(dd)] = v.mask[static_cast<std::size_t>(dd)];
  Shape os = q.t.shape;
  os[static_cast<std::size_t>(dd)] = DV;
  o.t = Tensor(os);
  auto idx = [&](const Tensor& t, std::int64_t bi, std::int64_t hi, std::int64_t si, std::int64_t di) {
    std::int64_t pos[4];
    pos[b] = bi, pos[h] = hi, pos[s] = si, pos[dd] = di;
    std::int64_t off = 0;
    for (int d = 0; d < 4; ++d) off = off * t.shape[static_cast<std::size_t>(d)] + pos[d];
    return static_cast<std::size_t>(off);
  };
  charge(B * HQ * SQ * SK * (D + DV));
  double scale = D ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
  std::vector<double> w(static_cast<std::size_t>(SK));
  for (std::int64_t bi = 0; bi < B; ++bi)
    for (std::int64_t hi = 0; hi < HQ; ++hi) {
      std::int64_t kh = hi / (HQ / HK);
      for (std::int64_t i = 0; i < SQ; ++i) {
        double m = -INFINITY;
        for (std::int64_t j = 0; j < SK; ++j) {
          double sc = 0;
          for (std::int64_t d = 0; d < D; ++d) sc += q.t.data[idx(q.t, bi, hi, i, d)] * k.t.data[idx(k.t, bi, kh, j, d)];
          w[static_cast<std::size_t>(j)] = op.attrs.causal && j > i ? -INFINITY : sc * scale;
          m = std::max(m, w[static_cast<std::size_t>(j)]);
        }
        double z = 0;
        for (auto& e : w) z += (e = std::isinf(e) ? 0.0 : std::exp(e - m));
        for (std::int64_t d = 0; d < DV; ++d) {
          double acc = 0;
          for (std::int64_t j = 0; j < SK; ++j) acc += w[static_cast<std::size_t>(j)] * v.t.data[idx(v.t, bi, kh, j, d)];
          o.t.data[idx(o.t, bi, hi, i, d)] = z > 0 ? acc / z : 0.0;
        }
      }
    }
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::note_range(NameId n, std::int64_t limit) {
  if (!int_range) return;
  auto& r = (*int_range)[static_cast<std::size_t>(n)];
  r = r < 0 ? limit : std::min(r, limit);
}

std::int64_t Runner::as_index(double x, std::int64_t limit, const char* what) {
  if (!(x >= 0) || x != std::floor(x) || x >= static_cast<double>(limit))
    throw InterpError(std::string(what) + " value " + std::to_string(x) + " is not an index below " + std::to_string(limit));
  return static_cast<std::int64_t>(x);
}

void Runner::embedding(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Val& ids = in(oi, r, 0);
  const Val& w = in(oi, r, 1);
  if (w.gshape.size() != 2) throw InterpError("Embedding weight must be [vocab, hidden]");
  note_range(p_.ins(p_.ops[static_cast<std::size_t>(oi)])[0], w.gshape[0]);
  std::int64_t lo, hi;
  block(w.gshape[0], w.mask[0], c, lo, hi);
  std::int64_t hl = w.t.shape[1];
  Val o;
  o.gshape = ids.gshape;
  o.gshape.push_back(w.gshape[1]);
  o.mask = ids.mask;
  o.mask.push_back(w.mask[1]);
  Shape s = ids.t.shape;
  s.push_back(hl);
  o.t = Tensor(s);
  for (std::size_t i = 0; i < ids.t.data.size(); ++i) {
    std::int64_t id = as_index(ids.t.data[i], w.gshape[0], "an Embedding id");
    if (id < lo || id >= hi) continue;  // masked lookup: another rank holds this row
    std::copy_n(w.t.data.begin() + static_cast<std::ptrdiff_t>((id - lo) * hl), hl, o.t.data.begin() + static_cast<std::ptrdiff_t>(i) * hl);
  }
  set_out(oi, r, 0, std::move(o), taint);
}

}  // namespace spmd::interp
