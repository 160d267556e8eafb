// interp/ops_shape.cpp - the numeric oracle: shape ops.
//
// Ops: Reshape, Transpose, Expand.
#include "interp/runner.h"

namespace spmd::interp {

void Runner::transpose_dims(int oi, std::int64_t r, const std::string& taint) {
  const OpAttrs& at = p_.ops[static_cast<std::size_t>(oi)].attrs;
  Val v = in(oi, r, 0);
  const auto& dims = p_.int_lists[at.dims];
  if (dims.size() != 2) throw InterpError("Transpose takes two dims");
  int d0 = norm_dim(dims[0], v.t.rank()), d1 = norm_dim(dims[1], v.t.rank());
  v.t = transpose(v.t, d0, d1);
  std::swap(v.gshape[static_cast<std::size_t>(d0)], v.gshape[static_cast<std::size_t>(d1)]);
  std::swap(v.mask[static_cast<std::size_t>(d0)], v.mask[static_cast<std::size_t>(d1)]);
  return set_out(oi, r, 0, std::move(v), taint);
}

// Reshape: a shard on an input dim moves to the first output dim of its group (the dims whose sizes
// multiply to the same product); local target shapes follow from that layout.
void Runner::reshape(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  Val o;
  for (ExprId e : p_.shapes[op.attrs.shape]) o.gshape.push_back(eval(e, "a dim of a Reshape target"));
  if (numel_of(o.gshape) != numel_of(x.gshape))
    throw InterpError("Reshape of " + shape_text(x.gshape) + " to " + shape_text(o.gshape) + " changes the element count");
  o.mask.assign(o.gshape.size(), 0);
  std::size_t i = 0, j = 0, ri = x.gshape.size(), rj = o.gshape.size();
  while (i < ri) {
    if (x.gshape[i] == 1) {
      ++i;
      continue;
    }
    while (j < rj && o.gshape[j] == 1) ++j;
    if (j >= rj) break;
    std::size_t i0 = i, j0 = j;
    std::int64_t pi = x.gshape[i++], pj = o.gshape[j++];
    while (pi != pj) {
      if (pi < pj && i < ri) pi *= x.gshape[i++];
      else if (pj < pi && j < rj) pj *= o.gshape[j++];
      else break;
    }
    for (std::size_t k = i0; k < i; ++k) o.mask[j0] |= x.mask[k];
  }
  o.t = interp::reshape(x.t, local_shape(o, coords(r)));
  set_out(oi, r, 0, std::move(o), taint);
}

// Expand: x broadcast to `shape` (right-aligned; a size-1 dim grows, any other must equal the target's), times
// `scale`. A sharded dim stays sharded alike; new leading dims are whole.
void Runner::expand(int oi, std::int64_t r, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  const Val& x = in(oi, r, 0);
  Val o;
  for (ExprId e : p_.shapes[op.attrs.shape]) o.gshape.push_back(eval(e, "a dim of an Expand target"));
  if (o.gshape.size() < x.gshape.size())
    throw InterpError("Expand of " + shape_text(x.gshape) + " to " + shape_text(o.gshape) + " drops dims");
  std::size_t lead = o.gshape.size() - x.gshape.size();
  o.mask.assign(o.gshape.size(), 0);
  for (std::size_t d = 0; d < x.gshape.size(); ++d) {
    if (x.gshape[d] != 1 && x.gshape[d] != o.gshape[lead + d])
      throw InterpError("Expand of " + shape_text(x.gshape) + " to " + shape_text(o.gshape) + ": dim " + std::to_string(d) + " is neither 1 nor the target's");
    if (d < x.mask.size() && x.gshape[d] != 1) o.mask[lead + d] = x.mask[d];
  }
  if (!x.ord.empty()) throw InterpError("Expand of a value sharded in a strided order is not modelled by the oracle");
  o.taint = x.taint;
  o.vlabel = x.vlabel;
  Num s = op.attrs.has_number ? Num(op.attrs.number) : Num(1.0);
  o.t = broadcast_map(x.t, local_shape(o, coords(r)), [&](const Num& a) { return op.attrs.has_number ? a * s : a; });
  set_out(oi, r, 0, std::move(o), taint);
}

}  // namespace spmd::interp
