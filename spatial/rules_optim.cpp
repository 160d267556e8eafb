// spatial/rules_optim.cpp - placement and shape rules of the optimizer ops
//
// Ops: AdamWUpdate and SGDUpdate (the update of one parameter and its states: elementwise, so every operand is whole
// or sharded alike on each axis, ZeRO's "each rank updates its shard with the gradient shard it holds"), GradNormSq
// (the global squared gradient norm, a collective over the axes the gradients are sharded over) and ClipCoef (the
// clipping coefficient of a norm, which must be whole). Dispatched from Checker::apply() in rules.cpp;
// docs/semantics.md, section 4.5.
#include "spatial/checker.h"

namespace spmd::detail {

namespace {

// What operand i of an update is, for messages.
std::string role(OpKind k, int i) {
  static const char* const adamw[] = {"the parameter", "the gradient", "the optimizer state exp_avg", "the optimizer state exp_avg_sq"};
  static const char* const sgd[] = {"the parameter", "the gradient", "the momentum buffer"};
  return k == OpKind::AdamWUpdate ? adamw[i] : sgd[i];
}

}  // namespace

// AdamWUpdate (param, grad, exp_avg, exp_avg_sq -> param, exp_avg, exp_avg_sq) and SGDUpdate (param, grad,
// [buffer] -> param, [buffer]): every operand has the parameter's shape; per axis no operand is pending or
// per-rank, and the sharded ones are sharded alike (dim and shard order), so the rank's pieces line up.
void Checker::optimizer_update() {
  const OpKind k = op_->kind;
  const Value& p = in(0);
  for (int i = 1; i < n_in(); ++i) {
    const Value& x = in(i);
    if (x.rank != p.rank)
      return report(CheckId::ShapeMismatch,
                    fmt::format("{}: {} {} has shape {} but {} {} has shape {}", opname(), role(k, i), iname(i), sstr(x.dims()), role(k, 0), iname(0),
                                sstr(p.dims())),
                    iname(i));
    for (int d = 0; d < p.rank; ++d)
      if (!same_dim(x.shape[static_cast<std::size_t>(d)], p.shape[static_cast<std::size_t>(d)],
                    [&] { return fmt::format("{}: dim {} of {} {} (left) and of {} {} (right)", opname(), d, role(k, i), iname(i), role(k, 0), iname(0)); },
                    iname(i)))
        return;
  }
  Value o = p;
  o.uneven = false;
  for (int i = 0; i < n_in(); ++i) o.uneven |= in(i).uneven;
  for (int a = 0; a < axes(); ++a) {
    int sharded = -1;  // the first operand sharded over a
    bool all_i = true;
    for (int i = 0; i < n_in(); ++i) {
      Placement x = pin(i, a);
      all_i &= x.is_i();
      if (x.is_p())
        return partial_misuse(i, a,
                              i == 1 ? fmt::format("every rank would step with its own partial gradient and the replicas of {} drift apart (the "
                                                   "gradient's reduction over {} is missing: it belongs in `grad_sync:`)",
                                                   iname(0), axn(a))
                                     : fmt::format("{} is a pending sum, not a value an optimizer can update", role(k, i)));
      if (x.is_v()) {
        std::vector<Note> notes;
        origin_note(notes, in(i), a);
        return report(CheckId::PlacementMismatch,
                      fmt::format("{}: {} {} is V over {} (a different value on every rank): the update needs it whole (R) or sharded (S) like the "
                                  "other operands",
                                  opname(), role(k, i), iname(i), axn(a)),
                      iname(i), std::move(notes));
      }
      if (x.is_s() && sharded < 0) sharded = i;
    }
    // Sharded operands must agree. The odd one out is blamed against the placement most of them hold (ties: the
    // gradient's), so a gradient reduce-scattered along another dim than the parameter and states is the one named.
    int bad = -1, ref = -1, best = 0;
    for (int i = 0; i < n_in(); ++i) {
      if (!pin(i, a).is_s()) continue;
      int votes = 0;
      for (int j = 0; j < n_in(); ++j) votes += pin(j, a) == pin(i, a);
      if (votes > best || (votes == best && i == 1)) best = votes, ref = i;
    }
    for (int i = 0; i < n_in() && ref >= 0; ++i)
      if (pin(i, a).is_s() && !(pin(i, a) == pin(ref, a))) {
        bad = i;
        break;
      }
    if (bad >= 0) {
      Placement x = pin(bad, a), want = pin(ref, a);
      std::vector<Note> notes;
      origin_note(notes, in(bad), a);
      std::string what = x.dim == want.dim ? fmt::format("{} in another shard order", ps(x)) : ps(x);
      notes.push_back(fix(fmt::format("{} {} along dim {} over {} as {} is (the same placement, so each rank holds the slice of every operand it "
                                      "updates)",
                                      bad == 1 ? "reduce-scatter" : "partition", iname(bad), want.dim, axn(a), iname(ref))));
      std::string unlike = bad == 1 ? "a gradient shard unlike the parameter and states it updates"
                           : bad >= 2 ? (ref == 1 ? "an optimizer state partitioned unlike its gradient" : "an optimizer state partitioned unlike its parameter")
                                      : "a parameter partitioned unlike its gradient";
      return report(CheckId::PlacementMismatch,
                    fmt::format("{}: {} {} is {} over {}, but {} {} is {}: each rank would combine its slice of {} with another slice of {} ({})", opname(),
                                role(k, bad), iname(bad), what, axn(a), role(k, ref), iname(ref), ps(want), iname(ref), iname(bad), unlike),
                    iname(bad), std::move(notes));
    }
    if (sharded >= 0) set_from(o, a, pin(sharded, a), sharded);
    else set_from(o, a, all_i ? Placement::i() : Placement::r(), 0);
  }
  // Outputs: the parameter, then each state, with the common layout and their own dtypes.
  for (int j = 0; j < op_->n_out; ++j) {
    Value& v = out(j);
    v = o;
    v.dtype = in(j == 0 ? 0 : j + 1).dtype;
  }
}

// GradNormSq: each rank's sum of the squares of its pieces of the gradients, summed over `axis` (Megatron's
// get_grad_norm_fp32: a local norm, then an all-reduce over the model-parallel group). Over a listed axis every
// gradient must be sharded (S): a gradient replicated there would be counted once per rank (NVIDIA-NeMo/RL#3788,
// ByteDance-Seed/VeOmni#184). The result is a scalar, R over the listed axes and where every gradient is whole, P(sum)
// over an unlisted axis some gradient is sharded over (each rank holds the norm of its own shards).
void Checker::grad_norm_sq() {
  std::uint32_t sharded = 0;
  for (int i = 0; i < n_in(); ++i)
    for (int a = 0; a < axes(); ++a) {
      Placement x = pin(i, a);
      if (x.is_p())
        return partial_misuse(i, a,
                              fmt::format("the squared norm of a pending sum is not the sum of the ranks' squared norms: reduce {} over {} (in "
                                          "`grad_sync:`) before taking its norm",
                                          iname(i), axn(a)));
      if (x.is_v()) {
        std::vector<Note> notes;
        origin_note(notes, in(i), a);
        return report(CheckId::PlacementMismatch,
                      fmt::format("GradNormSq: {} is V over {} (a different value on every rank): its norm needs it whole (R) or sharded (S)", iname(i),
                                  axn(a)),
                      iname(i), std::move(notes));
      }
      bool one = pool_.is_const(axis_size(a)) && pool_.value(axis_size(a)) == 1;  // a mesh of ones (the single-device step)
      if (x.is_s()) sharded |= 1u << a;
      else if ((at().axes & (1u << a)) && !one) {
        std::string ax = axn(a);
        std::vector<Note> notes;
        notes.push_back(fix(fmt::format("take the norm of {} in a GradNormSq without {} in `axis` and add the two norms (Megatron counts a "
                                        "tensor-parallel duplicate once)",
                                        iname(i), ax)));
        return report(CheckId::IllegalCollective,
                      fmt::format("GradNormSq sums the ranks' squared norms over {}, but {} is {} over {}: every rank of {} holds the same elements "
                                  "of it, so its squares are counted {} times (grad-norm double counting: NVIDIA-NeMo/RL#3788, "
                                  "ByteDance-Seed/VeOmni#184)",
                                  ax, iname(i), ps(x), ax, ax, axsize(a)),
                      iname(i), std::move(notes));
      }
    }
  Value& o = out();
  o = Value();
  o.rank = 0;
  o.dtype = DType::F32;
  for (int a = 0; a < axes(); ++a) {
    if (at().axes & (1u << a)) continue;
    if (sharded & (1u << a))
      set_new(o, a, Placement::p(ReduceOp::Sum),
              fmt::format("GradNormSq does not reduce over {}, where a gradient is sharded: each rank holds the squared norm of its own shards", axn(a)));
  }
}

// ClipCoef: min(1, max_norm / (sqrt(norm_sq) + eps)), a nonlinear function of the norm: a pending norm is an error.
void Checker::clip_coef() {
  Value& o = out() = in(0);
  o.dtype = DType::F32;
  for (int a = 0; a < axes(); ++a)
    if (pin(0, a).is_p())
      return partial_misuse(0, a,
                            fmt::format("the clipping coefficient is not linear in the squared norm, so each rank would clip by the norm of its own "
                                        "shards only (the global norm is the sum over {}: a clip by the local norm)",
                                        axn(a)),
                            fmt::format("reduce the squared norm first: insert {{op: AllReduce, in: [{}], out: {}_global, axis: {}}} before this op and read "
                                        "{}_global here (or list {} in the GradNormSq's `axis`)",
                                        iname(0), iname(0), axn(a), iname(0), axn(a)));
}

}  // namespace spmd::detail
