// interp/ops_zero.cpp - the numeric oracle: ZeRO / FSDP ops.
//
// ZeROGatherParam and ZeROScatterGrad move data across a group, so they run in step_group (ops_collectives.cpp)
// with the meaning of AllGather and ReduceScatter (torch.chunk slices: ceil-div chunks, the last ones smaller or
// empty when `uneven: true`). ZeROPartitionOptState is local: this rank's slice of the state.
#include "interp/runner.h"

namespace spmd::interp {

// R -> S(dim) over the listed axes (dim 0 by default); a second operand (the gradient shard) is read by the
// checker only, for its layout.
void Runner::zero_partition(int oi, std::int64_t r, const std::vector<std::int64_t>& c, const std::string& taint) {
  const Op& op = p_.ops[static_cast<std::size_t>(oi)];
  Val v = in(oi, r, 0);
  int d = norm_dim(op.attrs.dim == kUnset ? 0 : op.attrs.dim, v.t.rank());
  std::uint32_t axes = op.attrs.axes & ~v.mask[static_cast<std::size_t>(d)];
  std::int64_t n, idx, lo, hi;
  part(axes, c, n, idx);
  chunk_range(v.t.shape[static_cast<std::size_t>(d)], n, idx, lo, hi);
  v.t = slice(v.t, d, lo, hi);
  auto du = static_cast<std::size_t>(d);
  std::uint32_t w = add_to_order(ord_of(v, du), v.mask[du], axes);
  if (w || du < v.ord.size()) v.ord.resize(std::max(v.ord.size(), v.mask.size()), 0), v.ord[du] = w;
  v.mask[du] |= axes;
  vlabel_in_ &= ~op.attrs.axes;
  set_out(oi, r, 0, std::move(v), taint);
}

}  // namespace spmd::interp
