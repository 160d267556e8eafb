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

// FlashAttention: the causal mask uses local positions (row i of the local q block, key j of the local k),
// as a kernel given no offsets does; with `cp` the global positions of this rank's q block along that axis
// in `order` (interp/ops_cp.cpp).
void Runner::attention(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int s = op.attrs.layout == AttnLayout::BSHD ? 1 : op.attrs.layout == AttnLayout::SBHD ? 0 : 2, dd = 3;
  const Val& q = in(oi, r, 0);
  const Val& k = in(oi, r, 1);
  const Val& v = in(oi, r, 2);
  if (q.t.rank() != 4 || k.t.rank() != 4 || v.t.rank() != 4) throw InterpError("FlashAttention needs rank-4 q, k, v");
  std::int64_t SQ = q.t.shape[static_cast<std::size_t>(s)], SK = k.t.shape[static_cast<std::size_t>(s)];
  std::vector<std::int64_t> qpos, kpos;
  attn_positions(op, coords(r), SQ, SK, qpos, kpos);
  Val o;
  o.gshape = q.gshape;
  o.mask = q.mask;
  o.gshape[static_cast<std::size_t>(dd)] = v.gshape[static_cast<std::size_t>(dd)];
  o.mask[static_cast<std::size_t>(dd)] = v.mask[static_cast<std::size_t>(dd)];
  attend(op, q.t, k.t, v.t, qpos, kpos, o.t, nullptr);
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::attn_positions(const Op& op, const std::vector<std::int64_t>& c, std::int64_t SQ, std::int64_t SK, std::vector<std::int64_t>& qpos,
                            std::vector<std::int64_t>& kpos) {
  qpos.resize(static_cast<std::size_t>(SQ));
  kpos.resize(static_cast<std::size_t>(SK));
  std::iota(qpos.begin(), qpos.end(), 0);
  std::iota(kpos.begin(), kpos.end(), 0);
  if (!op.attrs.axes || !op.attrs.causal) return;
  int axis;
  std::int64_t N = cp_ring(op, axis);
  std::int64_t me = c[static_cast<std::size_t>(axis)], n = sizes_[static_cast<std::size_t>(axis)];
  bool zz = op.attrs.order == 1;
  for (auto& g : qpos) g = cp_position(me * SQ + g, SQ * n, N, zz);
  for (auto& g : kpos) g = cp_position(g, SK, N, zz);
}

void Runner::note_range(NameId n, std::int64_t limit) {
  if (int_range) narrow_range(*int_range, n, limit);
}

std::int64_t index_extent(OpKind kind, int k, const std::vector<Shape>& ins) {
  auto dim = [&](std::size_t i, bool last) -> std::int64_t {
    if (i >= ins.size() || ins[i].empty() || (!last && ins[i].size() != 2)) return -1;
    return last ? ins[i].back() : ins[i][0];
  };
  if (kind == OpKind::Embedding && k == 0) return dim(1, false);
  if (kind == OpKind::EmbeddingGrad && k == 1) return dim(2, false);
  if (kind == OpKind::CrossEntropyLoss && k == 1) return dim(0, true);
  if (kind == OpKind::CrossEntropyGrad && k == 2) return dim(1, true);
  return -1;
}

void Runner::note_index_ranges(int oi, std::int64_t r) {
  if (!int_range) return;
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto ins = p_.ins(op);
  std::vector<Shape> shapes;
  for (int k = 0; k < op.n_in; ++k) shapes.push_back(in(oi, r, k).gshape);
  for (int k = 0; k < op.n_in; ++k)
    if (std::int64_t e = index_extent(op.kind, k, shapes); e >= 0) note_range(ins[static_cast<std::size_t>(k)], e);
}

std::int64_t Runner::as_index(const Num& xn, std::int64_t limit, const char* what) {
  double x = xn.d;  // indices are routing: decided by the real value
  if (!(x >= 0) || x != std::floor(x) || x >= static_cast<double>(limit))
    throw InterpError(std::string(what) + " value " + std::to_string(x) + " is not an index below " + std::to_string(limit));
  return static_cast<std::int64_t>(x);
}

void Runner::embedding(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Val& ids = in(oi, r, 0);
  const Val& w = in(oi, r, 1);
  if (w.gshape.size() != 2) throw InterpError("Embedding weight must be [vocab, hidden]");
  note_index_ranges(oi, r);
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
