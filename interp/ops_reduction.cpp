// interp/ops_reduction.cpp - the numeric oracle: reductions, norms and the loss.
//
// Ops: Softmax, LayerNorm/RMSNorm, Sum/Mean/ReduceMax/ReduceMin/LogSumExp, TopKGate, CrossEntropyLoss (also vocab-parallel, whose max
// and sums all-reduce inside).
#include "interp/runner.h"

namespace spmd::interp {

void Runner::softmax(int oi, std::int64_t r, const std::string& taint) {
  const OpAttrs& at = p_.ops[static_cast<std::size_t>(oi)].attrs;
  Val v = in(oi, r, 0);
  int d = norm_dim(at.dim, v.t.rank());
  for_each_group(v.t, {d}, softmax_line);
  return set_out(oi, r, 0, std::move(v), taint);
}

// exp(x - m) / sum exp(x - m), m = stabilizer(max): in the field lanes the shift is 0 (the result does not depend on it).
void Runner::softmax_line(std::vector<Num>& x) {
  double md = -INFINITY;
  for (const Num& v : x) md = std::max(md, v.d);
  const Num m = Num::stabilizer(md);
  Num s = 0.0;
  for (Num& v : x) s += (v = exp(v - m));
  for (Num& v : x) v /= s;
}

void Runner::norm(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  auto dims = norm_dims(op.attrs.dims, v.t.rank(), true);
  const Num eps = op.attrs.has_number ? op.attrs.number : 1e-5;
  bool rms = op.kind == OpKind::RMSNorm;
  std::int64_t count = 1;  // the normalized elements: the real count under shape reduction
  for (int d : dims) count *= real_count(oi, 0, v, static_cast<std::size_t>(d), c);
  const Num n = static_cast<double>(count);
  for_each_group(v.t, dims, [&](std::vector<Num>& x) {
    if (x.empty()) return;
    Num mean = 0.0, var = 0.0;
    if (!rms) {
      for (const Num& e : x) mean += e;
      mean /= n;
    }
    for (const Num& e : x) var += (e - mean) * (e - mean);
    var /= n;
    const Num sd = sqrt(var + eps);
    for (Num& e : x) e = (e - mean) / sd;
  });
  // weight (and bias) span the normalized dims: each rank reads its own block of them.
  for (int i = 1; i < op.n_in; ++i) {
    const Val& w = in(oi, r, i);
    if (w.gshape.size() != dims.size()) throw InterpError("a norm weight must have the shape of the normalized dims");
    std::vector<std::uint32_t> target(dims.size());
    for (std::size_t k = 0; k < dims.size(); ++k) target[k] = v.mask[static_cast<std::size_t>(dims[k])];
    Tensor wl = align(w, target, c, p_.name(p_.ins(op)[static_cast<std::size_t>(i)]));
    // Move the weight's dims to the normalized positions: broadcast by reshaping to rank(x) with ones.
    Shape ws(v.t.shape.size(), 1);
    for (std::size_t k = 0; k < dims.size(); ++k) ws[static_cast<std::size_t>(dims[k])] = wl.shape[k];
    wl = interp::reshape(wl, ws);
    v.t = binary(v.t, wl, [&](const Num& a, const Num& b) { return i == 1 ? a * b : a + b; });
  }
  set_out(oi, r, 0, std::move(v), taint);
}

void Runner::reduce_dims(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  auto dims = norm_dims(op.attrs.dims, x.t.rank(), false);
  Val o;
  auto sum = [](const Num& a, const Num& b) { return a + b; };
  // max and min have no identity: over an empty slice (a rank's torch.chunk shard of a short dim) torch.amax
  // raises, and an infinite stand-in would leak into later arithmetic (0 x -inf); so does this run
  if (op.kind == OpKind::ReduceMax || op.kind == OpKind::ReduceMin)
    for (int d : dims)
      if (x.t.shape[static_cast<std::size_t>(d)] == 0)
        throw InterpError(std::string(op_name(op.kind)) + " over dim " + std::to_string(d) + ", which is empty on this rank: max and min have no identity");
  // max / min reductions pick an element (by d): any grouping and order of the fold picks the same one
  if ((op.kind == OpKind::ReduceMax || op.kind == OpKind::ReduceMin) && num::sets()) {  // as sets (num.h, set_extreme)
    Shape keep, st_out;
    reduce_layout(x.t, dims, op.attrs.keepdim, keep, st_out);
    o.t = Tensor::uninit(keep);
    std::vector<std::int64_t> bases, offs;
    group_layout(x.t.shape, dims, bases, offs);
    std::vector<const Num*> line(offs.size());
    for (std::size_t b = 0; b < bases.size(); ++b) {
      for (std::size_t j = 0; j < offs.size(); ++j) line[j] = &x.t.data[static_cast<std::size_t>(bases[b] + offs[j])];
      o.t.data[b] = num::set_extreme(line.data(), line.size(), op.kind == OpKind::ReduceMax);
    }
  } else if (op.kind == OpKind::ReduceMax) o.t = reduce(x.t, dims, op.attrs.keepdim, -INFINITY, [](const Num& a, const Num& b) { return pick_max(a, b); });
  else if (op.kind == OpKind::ReduceMin) o.t = reduce(x.t, dims, op.attrs.keepdim, INFINITY, [](const Num& a, const Num& b) { return pick_min(a, b); });
  else if (op.kind == OpKind::LogSumExp) {  // m + log(sum(exp(x - m))), m = stabilizer(the max of each group)
    Tensor m = reduce(x.t, dims, true, -INFINITY, [](const Num& a, const Num& b) { return Num::stabilizer(std::max(a.d, b.d)); });
    Tensor e = binary(x.t, m, [](const Num& a, const Num& b) { return std::isinf(b.d) ? Num(0.0) : exp(a - b); });
    Tensor s = reduce(e, dims, true, 0.0, sum);
    Tensor l = binary(s, m, [](const Num& a, const Num& b) { return std::isinf(b.d) ? b : b + log(a); });
    o.t = op.attrs.keepdim ? l : reduce(l, dims, false, 0.0, sum);  // drop the kept size-1 dims
  } else o.t = reduce(x.t, dims, op.attrs.keepdim, 0.0, sum);
  if (op.kind == OpKind::Mean) {
    std::int64_t n = 1, real = 1;  // the local count; the real one divides (shape reduction: equal without it)
    auto c = coords(r);
    for (int d : dims) n *= x.t.shape[static_cast<std::size_t>(d)], real *= real_count(oi, 0, x, static_cast<std::size_t>(d), c);
    const Num nn = static_cast<double>(real);
    for (auto& e : o.t.data) e = n ? e / nn : Num(NAN);
  }
  for (std::size_t d = 0; d < x.gshape.size(); ++d) {
    bool red = std::find(dims.begin(), dims.end(), static_cast<int>(d)) != dims.end();
    if (red && !op.attrs.keepdim) continue;
    o.gshape.push_back(red ? 1 : x.gshape[d]);
    o.mask.push_back(red ? 0 : x.mask[d]);
  }
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::topk(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  if (x.t.rank() < 1) throw InterpError("TopKGate needs an expert dim");
  std::int64_t E = x.t.shape.back(), K = size_of(op, "k", 1);
  if (K > E) throw InterpError("TopKGate k = " + std::to_string(K) + " exceeds the " + std::to_string(E) + " local experts");
  Val vals, idxs;
  vals.gshape = idxs.gshape = x.gshape;
  vals.gshape.back() = idxs.gshape.back() = K;
  vals.mask = idxs.mask = x.mask;
  vals.mask.back() = idxs.mask.back() = 0;
  Shape s = x.t.shape;
  s.back() = K;
  vals.t = idxs.t = Tensor(s);
  std::int64_t rows = E ? x.t.numel() / E : 0;
  std::vector<Num> line(static_cast<std::size_t>(E));
  std::vector<std::int64_t> order(static_cast<std::size_t>(E));
  for (std::int64_t row = 0; row < rows; ++row) {
    std::copy_n(x.t.data.begin() + row * E, E, line.begin());
    softmax_line(line);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b2) { return line[static_cast<std::size_t>(a)] > line[static_cast<std::size_t>(b2)]; });
    for (std::int64_t j = 0; j < K; ++j) {
      vals.t.data[static_cast<std::size_t>(row * K + j)] = line[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      idxs.t.data[static_cast<std::size_t>(row * K + j)] = static_cast<double>(order[static_cast<std::size_t>(j)]);  // routing: exact integers
    }
  }
  set_out(oi, r, 0, std::move(vals), taint);
  set_out(oi, r, 1, std::move(idxs), taint);
}

// Softmax cross-entropy per token; with vocab_parallel the vocab dim is split over the group and the
// max, the sum of exponentials and the target logit are all-reduced (Megatron's
// vocab_parallel_cross_entropy: rank g owns labels [g * local_vocab, (g + 1) * local_vocab)).
void Runner::cross_entropy(int oi, const std::vector<std::int64_t>& members) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  std::size_t n = members.size();
  struct Part {
    Tensor lg, lb;
    Val tok;
    std::vector<double> mx;  // the max is a stabilizer: real values only
    std::vector<Num> se, tgt;
    std::int64_t real_tokens = 0;  // the tokens a mean divides by (real extents under shape reduction)
  };
  std::vector<Part> parts(n);
  std::int64_t T = -1;
  for (std::size_t k = 0; k < n; ++k) {
    std::int64_t r = members[k];
    const auto& c = coords(r);
    const Val& lg = in(oi, r, 0);
    const Val& lb = in(oi, r, 1);
    if (lg.gshape.empty() || lb.gshape.size() + 1 != lg.gshape.size()) throw InterpError("CrossEntropyLoss labels must have the logits' shape without the vocab dim");
    note_index_ranges(oi, r);
    Part& P = parts[k];
    P.tok.gshape = lb.gshape;
    P.tok.mask.assign(lb.gshape.size(), 0);
    for (std::size_t d = 0; d < lb.gshape.size(); ++d) P.tok.mask[d] = lb.mask[d] | (lg.gshape[d] == 1 ? 0 : lg.mask[d]);
    std::vector<std::uint32_t> tl = lg.mask;
    for (std::size_t d = 0; d < lb.gshape.size(); ++d) tl[d] = P.tok.mask[d];
    P.lg = align(lg, tl, c, p_.name(p_.ins(op)[0]));
    P.lb = align(lb, P.tok.mask, c, p_.name(p_.ins(op)[1]));
    Shape ts(P.lg.shape.begin(), P.lg.shape.end() - 1);
    if (ts != P.lb.shape) throw InterpError("CrossEntropyLoss local logits " + shape_text(P.lg.shape) + " and labels " + shape_text(P.lb.shape) + " do not fit");
    std::int64_t t = P.lb.numel();
    if (T >= 0 && t != T) throw InterpError("ranks of one vocab-parallel group hold different token counts");
    T = t;
    P.real_tokens = 1;
    for (std::size_t d = 0; d < lb.gshape.size(); ++d) P.real_tokens *= real_local(real_global(oi, 1, d), lb.gshape[d], P.tok.mask[d], 0, c);
    std::int64_t V = P.lg.shape.back();
    std::int64_t off = static_cast<std::int64_t>(k) * V;  // Megatron: vocab_start_index = rank * partition_vocab_size
    P.mx.assign(static_cast<std::size_t>(t), -INFINITY);
    P.se.assign(static_cast<std::size_t>(t), 0);
    P.tgt.assign(static_cast<std::size_t>(t), 0);
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t v = 0; v < V; ++v) P.mx[static_cast<std::size_t>(i)] = std::max(P.mx[static_cast<std::size_t>(i)], P.lg.data[static_cast<std::size_t>(i * V + v)].d);
    for (std::int64_t i = 0; i < t; ++i) {
      std::int64_t label = as_index(P.lb.data[static_cast<std::size_t>(i)], lg.gshape.back(), "a CrossEntropyLoss label");
      if (!op.attrs.vocab_parallel && label >= V) throw InterpError("a label indexes past the " + std::to_string(V) + " local logits");
      if (label >= off && label < off + V) P.tgt[static_cast<std::size_t>(i)] = P.lg.data[static_cast<std::size_t>(i * V + label - off)];
    }
    charge(t * V);
  }
  // all-reduce max, then the sums
  std::vector<double> gmax(static_cast<std::size_t>(T), -INFINITY);
  std::vector<Num> gse(static_cast<std::size_t>(T), 0.0), gtgt(static_cast<std::size_t>(T), 0.0);
  for (auto& P : parts)
    for (std::size_t i = 0; i < gmax.size(); ++i) gmax[i] = std::max(gmax[i], P.mx[i]);
  for (auto& P : parts) {
    std::int64_t V = P.lg.shape.back();
    for (std::size_t i = 0; i < gmax.size(); ++i) {
      const Num m = Num::stabilizer(gmax[i]);
      for (std::int64_t v = 0; v < V; ++v) gse[i] += exp(P.lg.data[i * static_cast<std::size_t>(V) + static_cast<std::size_t>(v)] - m);
      gtgt[i] += P.tgt[i];
    }
  }
  std::string taint = global_ ? taint_of(oi, members[0]) : "";
  for (std::size_t k = 0; k < n; ++k) {
    Part& P = parts[k];
    Val o = P.tok;
    o.t = Tensor(P.lb.shape);
    for (std::size_t i = 0; i < gmax.size(); ++i) o.t.data[i] = log(gse[i]) + Num::stabilizer(gmax[i]) - gtgt[i];
    if (op.attrs.reduction != Reduction::None) {
      Num s = 0.0;
      for (const Num& e : o.t.data) s += e;
      if (op.attrs.reduction == Reduction::Mean) s = o.t.data.empty() ? Num(NAN) : s / Num(static_cast<double>(P.real_tokens));
      o.t = Tensor({}, s);
      o.gshape.clear();
      o.mask.clear();
    }
    set_out(oi, members[k], 0, std::move(o), taint);
  }
}

}  // namespace spmd::interp
