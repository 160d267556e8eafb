// interp/ops_fp8.cpp - the numeric oracle: the FP8 ops.
//
// Ops: AmaxUpdate, AmaxHistory, FP8Scale, FP8Quantize, FP8Dequantize. Quantization is modelled as
// q = round_fp8(x) * scale: x rounded to the format's mantissa (e4m3: 3 bits, e5m2: 2; round to nearest, no
// saturation), then scaled; FP8Dequantize is q / scale. Rounding before scaling is exact for power-of-two
// scales and makes the round trip independent of the scale, so per-rank scales on data that stays local agree
// with the single-device run, while data decoded with another rank's scale (an FP8 all-gather with per-rank
// scales) or with a stale scale is off by the ratio of the scales. docs/semantics.md, "FP8 scales".
#include "interp/runner.h"

namespace spmd::interp {

namespace {

double round_fp8(double x, int mantissa) {
  if (x == 0 || !std::isfinite(x)) return x;
  double q = std::ldexp(1.0, std::ilogb(x) - mantissa);
  return std::round(x / q) * q;
}

// x rounded to the format's mantissa: a random function in the field lanes (keyed by the mantissa width).
Num round_fp8(const Num& x, int mantissa) {
  double d = round_fp8(x.d, mantissa);
  return uf(num::key_of(mantissa == 2 ? "round_fp8_e5m2" : "round_fp8_e4m3"), d, x);
}

bool finite(const Tensor& t) {
  return std::all_of(t.data.begin(), t.data.end(), [](const Num& e) { return std::isfinite(e.d); });
}

// The scalar scale operand `i` on rank r (static checks require a scalar; the oracle refuses anything else).
const Num& scale_of(const Val& s) {
  if (s.t.numel() != 1) throw InterpError("an FP8 scale must be a scalar, got shape " + shape_text(s.t.shape));
  return s.t.data[0];
}

}  // namespace

void Runner::amax(int oi, std::int64_t r, const std::string& taint) {
  const Val& x = in(oi, r, 0);
  Val v;
  v.t = Tensor({}, 0.0);
  for (const Num& e : x.t.data) v.t.data[0] = pick_max(v.t.data[0], abs(e));  // a selection: any reduction order picks the same
  return set_out(oi, r, 0, std::move(v), taint);
}

// [amax, history[0], ..., history[L-2]]
void Runner::amax_history(int oi, std::int64_t r, const std::string& taint) {
  Val v = in(oi, r, 0);
  const Val& m = in(oi, r, 1);
  if (v.t.rank() != 1 || m.t.numel() != 1) throw InterpError("AmaxHistory takes a rank-1 history and a scalar amax");
  for (std::size_t i = v.t.data.size(); i-- > 1;) v.t.data[i] = v.t.data[i - 1];
  if (!v.t.data.empty()) v.t.data[0] = m.t.data[0];
  v.taint.clear();
  return set_out(oi, r, 0, std::move(v), taint);
}

// fp8_max / (max(a, 2^-24) * 2^margin), a the window's max (algo: max) or its newest entry (most_recent):
// non-increasing in every entry, so the scale of a pending max is the pending min of the ranks' scales.
void Runner::fp8_scale(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  if (x.t.rank() > 1 || x.t.numel() == 0) throw InterpError("FP8Scale takes a scalar amax or a non-empty rank-1 history");
  Num a = x.t.data[0];
  if (op.attrs.choice != 1)
    for (const Num& e : x.t.data) a = std::isnan(e.d) || e.d > a.d ? e : a;
  double fmax = op.attrs.has_dtype && op.attrs.dtype == DType::FP8E5M2 ? 57344.0 : 448.0;
  Val v;
  // a function of the amax: a random function of it in the field lanes (keyed by the format and margin)
  double sd = std::isnan(a.d) ? a.d : fmax / std::ldexp(std::max(a.d, std::ldexp(1.0, -24)), op.attrs.k);
  v.t = Tensor({}, uf(num::key_of("fp8_scale") ^ static_cast<std::uint64_t>(fmax) ^ (static_cast<std::uint64_t>(op.attrs.k) << 20), sd, a));
  return set_out(oi, r, 0, std::move(v), taint);
}

void Runner::fp8_quantize(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  const Num s = op.n_in == 2 ? scale_of(in(oi, r, 1)) : Num(1.0);
  int mantissa = op.attrs.has_dtype && op.attrs.dtype == DType::FP8E5M2 ? 2 : 3;
  v.t = unary(v.t, [&](const Num& x) { return round_fp8(x, mantissa) * s; });
  return set_out(oi, r, 0, std::move(v), taint);
}

void Runner::fp8_dequantize(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  if (op.n_in == 1) return set_out(oi, r, 0, std::move(v), taint);
  const Num s = scale_of(in(oi, r, 1));
  const bool was_finite = global_ && finite(v.t) && std::isfinite(s.d);
  v.t = unary(v.t, [&](const Num& q) { return q / s; });
  std::string t = taint;
  if (was_finite && !finite(v.t))  // a zero scale: no real value, so the single-device run is not compared
    t = std::string(1, kExcluded) + "its value leaves the reals (an FP8 scale of zero) where its inputs did not";
  return set_out(oi, r, 0, std::move(v), t);
}

}  // namespace spmd::interp
