// autograd/vjp_zero.cpp - the VJPs of the ZeRO / FSDP ops (see deriver.h). ZeROPartitionOptState's is
// conversion() (vjp_comm.cpp): R -> S(d) per axis, whose dual is S(d) -> P.
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

namespace {
int zero_dim(const OpAttrs& a) { return a.dim == kUnset ? 0 : a.dim; }
}  // namespace

// ZeROGatherParam (S(d) -> R): the gradient of the gathered parameter is a pending sum on every rank, which
// FSDP reduce-scatters into the rank's shard (P -> S(d)).
void Deriver::zero_gather() {
  int d = norm_dim(zero_dim(op_->attrs), tin(0).rank);
  contribute_in(0, exact(0), [&](NameId dst) {
    Op rs = coll(OpKind::ZeROScatterGrad);
    rs.attrs.dim = static_cast<std::int16_t>(d);
    emit(rs, {dy()}, dst);
  });
}

// ZeROScatterGrad (P(op) -> S(d)): every rank needs the whole gradient, gathered (S(d) -> R); an average
// scales it by 1/N, as AllReduce(avg)'s VJP does.
void Deriver::zero_scatter() {
  Placements have = want_in(0);
  for (int a : coll_axes()) have[static_cast<std::size_t>(a)] = Placement::r();
  bool concrete = true;
  std::int64_t n = axes_size(op_->attrs.axes, concrete);
  contribute_in(0, have, [&](NameId dst) {
    Op ag = coll(OpKind::ZeROGatherParam);
    ag.attrs.dim = static_cast<std::int16_t>(norm_dim(zero_dim(op_->attrs), tin(0).rank));
    if (op_->attrs.rop != ReduceOp::Avg || !concrete || n <= 1) {
      emit(ag, {dy()}, dst);
      return;
    }
    NameId g = emit(ag, {dy()}, tmp(dst, "g"));
    Op m = make(OpKind::Multiply);
    m.attrs.number = 1.0 / static_cast<double>(n);
    m.attrs.has_number = true;
    emit(m, {g}, dst);
  });
}

}  // namespace spmd::autograd_detail
