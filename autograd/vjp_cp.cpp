// autograd/vjp_cp.cpp - the VJPs of context parallelism
//
// Ops: LoadBalance (the inverse reorder), RingRotate (the rotation the other way), RingAttention (the
// all-gather-KV backward: k and v gathered, dq on the q block, dk and dv pending over the ring and
// reduce-scattered back to their blocks, as Llama 3's context parallelism does). RingAttentionStep has none
// yet (vjp() in derive.cpp says so). Dispatched from Deriver::vjp() in derive.cpp.
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

void Deriver::load_balance() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = coll(OpKind::LoadBalance);
    o.attrs.dim = op_->attrs.dim;
    o.attrs.choice = op_->attrs.choice == 1 ? 0 : 1;
    emit(o, {dy()}, dst);
  });
}

void Deriver::ring_rotate() {
  contribute_in(0, exact(0), [&](NameId dst) {
    Op o = coll(OpKind::RingRotate);
    o.attrs.choice = op_->attrs.choice == 1 ? 0 : 1;
    emit(o, {dy()}, dst);
  });
}

void Deriver::ring_attention() {
  int s = op_->attrs.layout == AttnLayout::BSHD ? 1 : op_->attrs.layout == AttnLayout::SBHD ? 0 : 2;
  for (int k = 0; k < 3; ++k)
    contribute_in(k, exact(k), [&, k](NameId dst) {
      Op g = coll(OpKind::AllGather);
      g.attrs.dim = static_cast<std::int16_t>(s);
      NameId kf = emit(g, {fin(1)}, tmp(dst, "k_full"));
      NameId vf = emit(g, {fin(2)}, tmp(dst, "v_full"));
      Op o = make(OpKind::AttentionGrad);
      o.attrs.choice = static_cast<std::uint8_t>(k);
      o.attrs.causal = op_->attrs.causal;
      o.attrs.layout = op_->attrs.layout;
      o.attrs.axes = op_->attrs.axes;
      o.attrs.order = op_->attrs.order;
      o.attrs.number = op_->attrs.number;  // `scale`
      o.attrs.has_number = op_->attrs.has_number;
      if (k == 0) {
        emit(o, {dy(), fin(0), kf, vf}, dst);
        return;
      }
      NameId full = emit(o, {dy(), fin(0), kf, vf}, tmp(dst, "full"));  // pending over the ring: each rank's queries
      Op rs = coll(OpKind::ReduceScatter);
      rs.attrs.dim = static_cast<std::int16_t>(s);
      emit(rs, {full}, dst);
    });
}

}  // namespace spmd::autograd_detail
