// interp/ops_elementwise.cpp - the numeric oracle: elementwise ops.
//
// Ops: SiLU/GELU/ReLU/FP8Quantize/Cast/LossScale/FP8Dequantize, Add/Sub/Multiply, Dropout, AmaxUpdate.
#include "interp/runner.h"

namespace spmd::interp {

// SiLU, GELU, ReLU, FP8Quantize, Cast, LossScale, FP8Dequantize: a function of each element.
void Runner::pointwise(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const OpAttrs& at = op.attrs;
  Val v = in(oi, r, 0);
  DType dt = at.has_dtype ? at.dtype : DType::F32;
  v.t = unary(v.t, [&](double x) {
    switch (op.kind) {
      case OpKind::SiLU: return x / (1 + std::exp(-x));
      case OpKind::GELU: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
      case OpKind::ReLU: return x > 0 ? x : 0.0;
      case OpKind::FP8Quantize: {  // e4m3-like: 3 mantissa bits, round to nearest
        if (x == 0 || !std::isfinite(x)) return x;
        int e = std::ilogb(x);
        double q = std::ldexp(1.0, e - 3);
        return std::round(x / q) * q;
      }
      case OpKind::Cast:
        if (!at.has_dtype || !is_int(dt)) return x;
        return dt == DType::Bool ? (x != 0 ? 1.0 : 0.0) : std::trunc(x);
      case OpKind::LossScale: return x * at.number;
      default: return x;
    }
  });
  return set_out(oi, r, 0, std::move(v), taint);
}

void Runner::amax(int oi, std::int64_t r, const std::string& taint) {
  const Val& x = in(oi, r, 0);
  Val v;
  v.t = Tensor({}, 0.0);
  for (double e : x.t.data) v.t.data[0] = std::max(v.t.data[0], std::abs(e));
  return set_out(oi, r, 0, std::move(v), taint);
}

void Runner::elementwise(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  auto f = [&](double a, double b) { return op.kind == OpKind::Add ? a + b : op.kind == OpKind::Sub ? a - b : a * b; };
  if (op.n_in == 1) {
    Val v = in(oi, r, 0);
    double s = op.attrs.number;
    v.t = unary(v.t, [&](double a) { return f(a, s); });
    return set_out(oi, r, 0, std::move(v), taint);
  }
  const Val& x = in(oi, r, 0);
  const Val& y = in(oi, r, 1);
  Val o;
  o.gshape = broadcast_shapes(x.gshape, y.gshape);
  o.mask = union_masks(x, y, o.gshape.size());
  Tensor xl = align(x, slice_target(x, o.mask), c, p_.name(p_.ins(op)[0]));
  Tensor yl = align(y, slice_target(y, o.mask), c, p_.name(p_.ins(op)[1]));
  o.t = binary(xl, yl, f);
  set_out(oi, r, 0, std::move(o), taint);
}

void Runner::dropout(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  double p = op.attrs.has_number ? op.attrs.number : 0.1;
  std::string t = taint;
  if (op.attrs.rng_per_rank && global_) t = "Dropout with `rng: per_rank` draws a different mask on every rank";
  // The mask is a function of the element's global position (and of the rank with rng: per_rank).
  std::uint64_t key = mix(seed_ * 7919 + static_cast<std::uint64_t>(oi));
  if (op.attrs.rng_per_rank) key = mix(key ^ static_cast<std::uint64_t>(r + 1));
  Shape lo(v.gshape.size());
  for (std::size_t d = 0; d < lo.size(); ++d) {
    std::int64_t h;
    block(v.gshape[d], v.mask[d], c, lo[d], h);
  }
  Shape gst = strides_of(v.gshape);
  Shape idx(v.t.shape.size(), 0);
  for (auto& x : v.t.data) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) flat += (lo[d] + idx[d]) * gst[d];
    x = unit(mix(key ^ static_cast<std::uint64_t>(flat))) < p ? 0.0 : x / (1 - p);
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < v.t.shape[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  set_out(oi, r, 0, std::move(v), t);
}

}  // namespace spmd::interp
