// autograd/derive.cpp - the VJP of every op (one exhaustive switch), emitted as ops of the same IR.
//
// The forward is read as SSA: every declaration and op output is a version; a gradient belongs to a
// version and is accumulated in place (`Add(x.grad, c) -> x.grad`) when several uses contribute.
// Each VJP knows the forward placements (from the spatial checker), so it knows the placement each
// contribution will have; where that differs from the dual placement of the input, it appends the
// conversion that makes it so (e.g. a per-rank contribution to a replicated input is V -> P).
#include "autograd/deriver.h"

namespace spmd {

Placement dual(Placement p) {
  switch (p.kind) {
    case PKind::R: return Placement::p();
    case PKind::I: return Placement::i();
    case PKind::V: return Placement::v();
    case PKind::S: return p;
    case PKind::P: return p.linear_partial() ? Placement::r() : Placement::v();
  }
  return p;
}

namespace autograd_detail {

void Deriver::vjp() {
  switch (op_->kind) {
    case OpKind::MatMul: return matmul();
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Multiply: return elementwise();
    case OpKind::SiLU:
    case OpKind::GELU:
    case OpKind::ReLU:
    case OpKind::Dropout:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
    case OpKind::Sigmoid: return pointwise();
    case OpKind::Neg: return neg();
    case OpKind::Div:
      if (op_->n_in == 1) return div_scalar();
      return div_tensor_vjp();
    case OpKind::Where: return where_vjp();
    // Masks and counts: piecewise constant in their inputs (and bool or integer, so never reached with a
    // gradient from a float loss); Detach stops the gradient by definition. No contribution is a zero one.
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::And:
    case OpKind::Or:
    case OpKind::Not:
    case OpKind::OneHot:
    case OpKind::Bincount:
    case OpKind::Detach: return;
    case OpKind::CumSum: return cumsum_vjp();
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::LogSumExp: no_vjp("its VJP is not derived yet (issue 10); write the backward by hand in `backward:`");
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: return norm();
    case OpKind::Softmax: return softmax();
    case OpKind::Sum:
    case OpKind::Mean: return reduction();
    case OpKind::FlashAttention: return attention();
    case OpKind::Embedding: return embedding();
    case OpKind::CrossEntropyLoss: return cross_entropy();
    case OpKind::TopKGate: return topk();
    case OpKind::AllReduce: return all_reduce();
    case OpKind::AllGather: return all_gather();
    case OpKind::ReduceScatter: return reduce_scatter();
    case OpKind::Broadcast: return broadcast();
    case OpKind::Reduce: return reduce();
    case OpKind::AllToAll: return all_to_all();
    case OpKind::Scatter: return scatter();
    case OpKind::Gather: return gather();
    case OpKind::Send: return;  // no output, so never reached with a gradient (see recv below)
    case OpKind::Recv: return;  // no input: a leaf; its gradient goes back to the peer with the schedule
    case OpKind::Wait:
    case OpKind::WaitAll:
    case OpKind::WaitStream:
    case OpKind::RecordEvent:
    case OpKind::WaitEvent: return;  // no values
    case OpKind::Cast: return identity();
    case OpKind::FP8Quantize:
    case OpKind::FP8Dequantize: return fp8();
    case OpKind::LossScale: return loss_scale();
    case OpKind::AmaxUpdate:
    case OpKind::AmaxHistory:
    case OpKind::FP8Scale: return;  // scaling statistics: no gradient flows through them (autograd/vjp_fp8.cpp)
    case OpKind::Reshape: return reshape();
    case OpKind::Transpose: return transpose();
    case OpKind::Reinterpret:
    case OpKind::Convert: return conversion();
    case OpKind::SPMDGuard: return guard();
    case OpKind::Expand: return expand();
    case OpKind::PointwiseGrad:
    case OpKind::NormGrad:
    case OpKind::AttentionGrad:
    case OpKind::EmbeddingGrad:
    case OpKind::CrossEntropyGrad:
    case OpKind::TopKGrad:
    case OpKind::MoEGateGrad: no_vjp("it is itself a gradient op, and second derivatives are not supported");
    case OpKind::Step: no_vjp("it is an opaque pipeline-schedule step with no known derivative");
    case OpKind::OverlapRegion: no_vjp("it is an opaque block of compute; write its backward by hand in `backward:`");
    case OpKind::MoEDispatch: return moe_dispatch();
    case OpKind::MoECombine: return moe_combine();
    case OpKind::ExpertCompute: return matmul();  // a batched MatMul: its VJP is MatMul's
    case OpKind::Slice: return slice_vjp();
    case OpKind::Split: return split_vjp();
    case OpKind::Concat: return concat_vjp(false);
    case OpKind::Stack: return concat_vjp(true);
    case OpKind::Pad: return pad_vjp();
    case OpKind::Arange: return;  // no inputs: never reached with one that needs a gradient
    case OpKind::Full: return;
    case OpKind::Sin:
    case OpKind::Cos: no_vjp("its VJP is not derived yet; write the backward by hand in `backward:`");
    case OpKind::RoPE: return rope_vjp();
    case OpKind::IndexSelect:
      no_vjp("its VJP (an IndexAdd into zeros of x's shape) is not derived yet; write the backward by hand in `backward:`");
    case OpKind::IndexAdd: return index_add_vjp();
    case OpKind::LoadBalance: return load_balance();
    case OpKind::RingRotate: return ring_rotate();
    case OpKind::RingAttention: return ring_attention();
    case OpKind::RingAttentionStep:
      no_vjp("the ring backward (the saved log-sum-exp, dk and dv rotating home) is not derived yet; in a training program use RingAttention "
             "(the whole loop), or write the backward by hand in `backward:`");
    case OpKind::ZeROGatherParam: return zero_gather();
    case OpKind::ZeROScatterGrad: return zero_scatter();
    case OpKind::ZeROPartitionOptState: return conversion();  // R -> S(d): the dual is S(d) -> P per axis, as Convert's
    case OpKind::GradNormSq:
    case OpKind::AdamWUpdate:
    case OpKind::SGDUpdate:
    case OpKind::ClipCoef: no_vjp("it is part of the optimizer step, which runs after the backward: write it under `optimizer:`");
  }
}

}  // namespace autograd_detail

Derived derive_backward(const Program& forward, const SpatialTypes& types, bool append_to_ops) {
  // a local-view program has no placements to derive by (its backward is hand-written, equiv/training.h)
  if (forward.local_view)
    throw LoadError(forward.view_loc, "a local-view program (`view: local`) has no derived backward: write each rank's backward under `backward:`");
  return autograd_detail::Deriver(forward, types, append_to_ops).run();
}

std::vector<std::int32_t> derive_backward_in_place(Program& program, const SpatialTypes& types) {
  return autograd_detail::Deriver(program, types).run().forward_op;
}

}  // namespace spmd
