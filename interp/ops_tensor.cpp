// interp/ops_tensor.cpp - the numeric oracle: the tensor ops of issue 10.
//
// Ops: Slice, Split, Concat, Stack, Pad, Arange, Full, RoPE, IndexSelect, IndexAdd. Each rank runs what a per-rank
// program runs on its local piece: an op on a dim sharded over some axes cuts, joins or pads the local block
// with the offsets divided by the shard count (a local program's view), so a cut that is not the whole dim
// gives the interleaved result a real run gives, never the global one.
#include "interp/runner.h"

namespace spmd::interp {

namespace {

// The sizes of the dims before d (outer) and after d (inner) of shape s.
void dims3(const Shape& s, int d, std::int64_t& outer, std::int64_t& inner) {
  outer = 1, inner = 1;
  for (int k = 0; k < d; ++k) outer *= s[static_cast<std::size_t>(k)];
  for (std::size_t k = static_cast<std::size_t>(d) + 1; k < s.size(); ++k) inner *= s[k];
}

}  // namespace

// The axes of mask m that have more than one rank in this run (the single-device run has none).
std::uint32_t Runner::live(std::uint32_t m) const {
  std::uint32_t out = 0;
  for (std::size_t a = 0; a < sizes_.size(); ++a)
    if ((m >> a & 1u) && sizes_[a] > 1) out |= 1u << a;
  return out;
}

std::int64_t Runner::size_of(const Op& op, const char* attr, std::int64_t dflt) const {
  ExprId e = p_.size_attr(op, attr);
  return e < 0 ? dflt : eval(e, std::string("`") + attr + "` of " + std::string(op_name(op.kind)));
}

// Local offsets of a cut [lo, hi) of a dim of global size n sharded into `parts` blocks: the global offsets
// divided by the shard count, as a per-rank program computes them; a cut that does not divide is a failed run.
void Runner::local_cut(std::int64_t n, std::int64_t parts, std::int64_t& lo, std::int64_t& hi, const char* what) {
  if (parts == 1) return;
  if (n % parts || lo % parts || hi % parts)
    throw InterpError(std::string(what) + " [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of a dim of " + std::to_string(n) + " sharded " +
                      std::to_string(parts) + " ways has no local counterpart");
  lo /= parts, hi /= parts;
}

void Runner::slice_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val o = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim, o.t.rank());
  auto du = static_cast<std::size_t>(d);
  std::int64_t n = o.gshape[du], start = size_of(op, "start", 0), end = size_of(op, "end", n);
  if (start < 0 || start > end || end > n) throw InterpError("Slice [" + std::to_string(start) + ", " + std::to_string(end) + ") out of range for " + std::to_string(n));
  std::int64_t parts, idx;
  part(o.mask[du], c, parts, idx);
  std::int64_t lo = start, hi = end;
  if (start == 0 && end == n) {  // the whole dim: every rank keeps its shard, even or torch.chunk-uneven
    set_out(oi, r, 0, std::move(o), taint);
    return;
  }
  local_cut(n, parts, lo, hi, "Slice");
  o.t = slice(o.t, d, lo, hi);
  o.gshape[du] = end - start;
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::split_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim, x.t.rank());
  auto du = static_cast<std::size_t>(d);
  std::int64_t n = x.gshape[du], k = op.n_out;
  std::vector<std::int64_t> sizes;
  if (op.attrs.shape != kNoIndex) {
    for (ExprId e : p_.shapes[op.attrs.shape]) sizes.push_back(eval(e, "a Split size"));
  } else {
    if (n % k) throw InterpError("Split of " + std::to_string(n) + " into " + std::to_string(k) + " equal pieces");
    sizes.assign(static_cast<std::size_t>(k), n / k);
  }
  if (static_cast<std::int64_t>(sizes.size()) != k || std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}) != n)
    throw InterpError("Split sizes do not add up to the dim");
  std::int64_t parts, idx;
  part(x.mask[du], c, parts, idx);
  std::int64_t at = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t lo = at, hi = at + sizes[static_cast<std::size_t>(j)];
    at = hi;
    Val o = x;
    local_cut(n, parts, lo, hi, "a Split piece");
    o.t = slice(x.t, d, lo, hi);
    o.gshape[du] = sizes[static_cast<std::size_t>(j)];
    set_out(oi, r, static_cast<int>(j), std::move(o), taint);
  }
}

void Runner::concat_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint, bool stack) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  int n = n_in(oi);
  const Val& x0 = in(oi, r, 0);
  int rank = x0.t.rank();
  int d = norm_dim(op.attrs.dim, stack ? rank + 1 : rank);
  std::vector<std::uint32_t> target(static_cast<std::size_t>(rank), 0);
  for (int i = 0; i < n; ++i) {
    const Val& x = in(oi, r, i);
    if (x.t.rank() != rank) throw InterpError("Concat/Stack of tensors of different ranks");
    for (int e = 0; e < rank; ++e) target[static_cast<std::size_t>(e)] |= x.mask[static_cast<std::size_t>(e)];  // nothing broadcasts here
  }
  std::int64_t parts = 1, idx = 0;
  if (!stack) part(target[static_cast<std::size_t>(d)], c, parts, idx);
  std::vector<Tensor> pieces;
  Val o;
  o.gshape = x0.gshape;
  o.mask = target;
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const Val& x = in(oi, r, i);
    std::vector<std::uint32_t> t = target;
    if (!stack) t[static_cast<std::size_t>(d)] = x.mask[static_cast<std::size_t>(d)];  // each joins its own block along the dim
    if (!stack && x.mask[static_cast<std::size_t>(d)] != target[static_cast<std::size_t>(d)])
      throw InterpError("Concat of inputs sharded differently along the joined dim");
    for (int e = 0; e < rank; ++e) {
      if (e == d && !stack) continue;
      if (x.gshape[static_cast<std::size_t>(e)] != x0.gshape[static_cast<std::size_t>(e)]) throw InterpError("Concat/Stack of mismatched shapes");
    }
    Tensor a = align(x, t, c, "an input of " + std::string(op_name(op.kind)), false);
    if (stack) {
      Shape s = a.shape;
      s.insert(s.begin() + d, 1);
      a = interp::reshape(a, s);
    }
    total += stack ? 1 : x.gshape[static_cast<std::size_t>(d)];
    pieces.push_back(std::move(a));
  }
  // Along a sharded dim each rank joins its own blocks: the layout is the joined dim's, the data interleaved.
  (void)parts, (void)idx;
  o.t = concat(pieces, d);
  if (stack) {
    o.gshape.insert(o.gshape.begin() + d, n);
    o.mask.insert(o.mask.begin() + d, 0);
  } else {
    o.gshape[static_cast<std::size_t>(d)] = total;
  }
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::pad_op(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val o = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim, o.t.rank());
  auto du = static_cast<std::size_t>(d);
  std::int64_t before = size_of(op, "before", 0), after = size_of(op, "after", 0), n = o.gshape[du];
  std::int64_t parts, idx;
  part(o.mask[du], c, parts, idx);
  std::int64_t lb = before, la = after;
  if (parts > 1 && (before || after))  // each rank would pad its own block: the pads land between the shards
    throw InterpError("Pad of a dim sharded " + std::to_string(parts) + " ways: each rank pads its own block, which has no global counterpart");
  const Num value = op.attrs.has_number ? op.attrs.number : 0.0;
  Shape sb = o.t.shape, sa = o.t.shape;
  sb[du] = lb;
  sa[du] = la;
  o.t = concat({Tensor(sb, value), o.t, Tensor(sa, value)}, d);
  o.gshape[du] = before + n + after;
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::arange(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  std::int64_t start = size_of(op, "start", 0), end = size_of(op, "end", 0);
  if (start > end) throw InterpError("Arange with start > end");
  Val o;
  o.gshape = {end - start};
  o.mask = {0};
  check_size(o.gshape);
  o.t = Tensor(o.gshape);
  for (std::int64_t i = 0; i < end - start; ++i) o.t.data[static_cast<std::size_t>(i)] = static_cast<double>(start + i);
  set_out(oi, r, 0, std::move(o), taint);
}

// Full: every element `value` (an exact constant), replicated.
void Runner::full(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val o;
  for (ExprId e : p_.shapes[op.attrs.shape]) o.gshape.push_back(eval(e, "a dim of a Full"));
  o.mask.assign(o.gshape.size(), 0);
  check_size(o.gshape);
  o.t = Tensor(o.gshape);
  const Num v(op.attrs.has_number ? op.attrs.number : 0.0);
  std::fill(o.t.data.begin(), o.t.data.end(), v);
  set_out(oi, r, 0, std::move(o), taint);
}

// out[..., i] = x_i cos(a) - x_{i+D/2} sin(a), out[..., i+D/2] = x_{i+D/2} cos(a) + x_i sin(a), with
// a = pos * theta^(-2i/D) (negated for `inverse`): rotate-half, as Llama's and torchtitan's RoPE.
void Runner::rope(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val o = in(oi, r, 0);
  const Val& pos = in(oi, r, 1);
  int rank = o.t.rank();
  if (rank < 2 || pos.t.rank() != 1) throw InterpError("RoPE shapes");
  int d = norm_dim(op.attrs.dim == kUnset ? (rank >= 3 ? -3 : -2) : op.attrs.dim, rank), last = rank - 1;
  if (d == last) throw InterpError("RoPE's sequence dim is the rotated dim");
  auto du = static_cast<std::size_t>(d), lu = static_cast<std::size_t>(last);
  if (pos.gshape[0] != o.gshape[du]) throw InterpError("RoPE positions of length " + std::to_string(pos.gshape[0]) + " for a dim of " + std::to_string(o.gshape[du]));
  if (live(o.mask[lu])) throw InterpError("RoPE of a tensor whose rotated dim is sharded");
  std::int64_t D = o.gshape[lu];
  if (D % 2) throw InterpError("RoPE of an odd last dim");
  // x whole along the sequence with S(0) positions: x is read as the slice matching the positions' block
  if (pos.gshape[0] != 1 && (pos.mask[0] & ~o.mask[du])) {
    std::vector<std::uint32_t> t = o.mask;
    t[du] |= pos.mask[0];
    o.t = align(o, t, c, "x of RoPE");
    o.mask = t;
  }
  Tensor p = align(pos, {o.mask[du]}, c, "the positions of RoPE");
  if (p.shape[0] != o.t.shape[du]) throw InterpError("RoPE positions do not line up with x's local block");
  double theta = op.attrs.has_number ? op.attrs.number : 10000.0;
  // the rotated dim's size in the frequencies theta^(-2i/D): the real one under shape reduction (a value, not an extent)
  std::int64_t Dr = real_global(oi, 0, lu);
  const double Dv = static_cast<double>(Dr > 0 ? Dr : D);
  const Num sign = op.attrs.inverse ? -1.0 : 1.0;
  Shape st = strides_of(o.t.shape);
  const Tensor x = o.t;
  std::int64_t h = D / 2, S = o.t.shape[du];
  // The angle of (position s, frequency i): a position (exact) times a constant; its cos and sin as interp/num.h
  // defines them (cos^2 + sin^2 = 1), computed once per angle rather than per element (the same values: an element's
  // rotation depends on its s and i only).
  std::vector<Num> freq(static_cast<std::size_t>(h)), ca(static_cast<std::size_t>(S * h)), sa(ca.size());
  for (std::int64_t i = 0; i < h; ++i) freq[static_cast<std::size_t>(i)] = Num(std::pow(theta, -2.0 * static_cast<double>(i) / Dv));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t i = 0; i < h; ++i) {
      const Num a = sign * p.data[static_cast<std::size_t>(s)] * freq[static_cast<std::size_t>(i)];
      ca[static_cast<std::size_t>(s * h + i)] = cos(a), sa[static_cast<std::size_t>(s * h + i)] = sin(a);
    }
  for (std::size_t w = 0; w < x.data.size(); ++w) {
    std::int64_t i = static_cast<std::int64_t>(w / static_cast<std::size_t>(st[lu])) % D;
    if (i >= h) continue;
    std::int64_t s = static_cast<std::int64_t>(w / static_cast<std::size_t>(st[du])) % S;
    const Num &x1 = x.data[w], &x2 = x.data[w + static_cast<std::size_t>(h * st[lu])];
    const Num &c = ca[static_cast<std::size_t>(s * h + i)], &sn = sa[static_cast<std::size_t>(s * h + i)];
    o.t.data[w] = x1 * c - x2 * sn;
    o.t.data[w + static_cast<std::size_t>(h * st[lu])] = x2 * c + x1 * sn;
  }
  charge(x.numel());
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::index_select(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  const Val& ix = in(oi, r, 1);
  int d = norm_dim(op.attrs.dim, x.t.rank());
  auto du = static_cast<std::size_t>(d);
  if (ix.t.rank() != 1) throw InterpError("IndexSelect takes a 1-D index");
  note_range(p_.ins(op)[1], x.gshape[du]);
  if (live(x.mask[du])) throw InterpError("IndexSelect along a sharded dim: the indices are global");
  for (auto m : x.mask)
    if (live(m & ix.mask[0])) throw InterpError("IndexSelect with the index and x sharded over one axis");
  std::int64_t outer, inner, n = x.t.shape[du], k = ix.t.shape[0];
  dims3(x.t.shape, d, outer, inner);
  Val o;
  o.gshape = x.gshape;
  o.gshape[du] = ix.gshape[0];
  o.mask = x.mask;
  o.mask[du] = ix.mask[0];
  Shape s = x.t.shape;
  s[du] = k;
  o.t = Tensor(s);
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t row = as_index(ix.t.data[static_cast<std::size_t>(j)], n, "an IndexSelect index");
    for (std::int64_t a = 0; a < outer; ++a)
      std::copy_n(x.t.data.begin() + static_cast<std::ptrdiff_t>((a * n + row) * inner), inner,
                  o.t.data.begin() + static_cast<std::ptrdiff_t>((a * k + j) * inner));
  }
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::index_add(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  const Val& ix = in(oi, r, 1);
  const Val& src = in(oi, r, 2);
  int d = norm_dim(op.attrs.dim, x.t.rank());
  auto du = static_cast<std::size_t>(d);
  if (ix.t.rank() != 1 || src.t.rank() != x.t.rank()) throw InterpError("IndexAdd shapes");
  note_range(p_.ins(op)[1], x.gshape[du]);
  // A sharded index with the source cut alike along it: each rank adds its own rows into its copy of x (a partial
  // sum of the scatter; the checker says which x may take it)
  if (live(x.mask[du]) || live(src.mask[du]) != live(ix.mask[0])) throw InterpError("IndexAdd along a sharded dim or with a sharded index");
  std::vector<std::uint32_t> t(x.mask.size(), 0);
  for (std::size_t e = 0; e < t.size(); ++e)
    if (e != du) t[e] = (x.gshape[e] == 1 ? 0 : x.mask[e]) | (src.gshape[e] == 1 ? 0 : src.mask[e]);
  Tensor xa = align(x, t, c, "x of IndexAdd");
  std::vector<std::uint32_t> ts = t;
  ts[du] = src.mask[du];  // this rank's rows, as its index holds their indices
  Tensor sa = align(src, ts, c, "the source of IndexAdd");
  std::int64_t outer, inner, n = xa.shape[du], k = sa.shape[du];
  dims3(xa.shape, d, outer, inner);
  if (k != ix.t.shape[0]) throw InterpError("IndexAdd source and index lengths differ");
  for (std::size_t e = 0; e < xa.shape.size(); ++e)  // a program the checker rejects may still reach here (the oracle runs every program)
    if (e != du && xa.shape[e] != sa.shape[e]) throw InterpError("IndexAdd source and x differ outside the indexed dim");
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t row = as_index(ix.t.data[static_cast<std::size_t>(j)], n, "an IndexAdd index");
    for (std::int64_t a = 0; a < outer; ++a)
      for (std::int64_t q = 0; q < inner; ++q)
        xa.data[static_cast<std::size_t>((a * n + row) * inner + q)] += sa.data[static_cast<std::size_t>((a * k + j) * inner + q)];
  }
  Val o;
  o.gshape = x.gshape;
  o.mask = t;
  o.t = std::move(xa);
  set_out(oi, r, 0, std::move(o), taint);
}

}  // namespace spmd::interp
