// spatial/rules_zero.cpp - placement and shape rules of the ZeRO / FSDP ops
//
// Ops: ZeROGatherParam (all-gather a parameter shard before use), ZeROScatterGrad (reduce-scatter a gradient
// into this rank's shard), ZeROPartitionOptState (this rank's slice of an optimizer state, lined up with the
// gradient shard it updates). Dispatched from Checker::apply() in rules.cpp; docs/semantics.md, section 4.4.
#include "spatial/checker.h"

namespace spmd::detail {

namespace {
int zero_dim(const OpAttrs& a) { return a.dim == kUnset ? 0 : a.dim; }
}  // namespace

// S(dim) -> R over every listed axis (innermost first, as AllGather): the parameter is whole for its use.
void Checker::zero_gather() {
  Value& o = out() = in(0);
  int d = norm_dim(zero_dim(at()), in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a : coll_axes(true)) {
    Placement p = pl_of(o, a);
    if (!p.is_s(d)) {
      std::string fix_text = p.is_s()   ? fmt::format("gather the dim the shard is on: `dim: {}`", p.dim)
                             : p.is_p() ? fix_allreduce(iname(0), a, p)
                             : p.is_v() ? "declare the pieces' layout (S(d)) with Convert or SPMDGuard first"
                                        : fmt::format("remove this ZeROGatherParam: {} is already whole on every rank of {}", iname(0), axn(a));
      return illegal(fmt::format("ZeROGatherParam over {} along dim {} of {}, which is {} over {}: it gathers a parameter sharded S({})", axn(a), d,
                                 iname(0), ps(p), axn(a), d),
                     a, fix_text);
    }
    if (!can_remove_shard(o, d, a)) return;
    set_new(o, a, Placement::r(), fmt::format("ZeROGatherParam over {} (the parameter gathered for its use)", axn(a)));
  }
}

// P(reduce) (or per-rank V summands) -> S(dim), as ReduceScatter: each rank keeps the reduced slice it owns.
void Checker::zero_scatter() {
  Value& o = out() = in(0);
  int d = norm_dim(zero_dim(at()), in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a : coll_axes(false)) {
    Placement p = pl_of(o, a);
    if (p.is_p() && p.op != at().rop)
      return illegal(fmt::format("ZeROScatterGrad({}) of {}, which is {} over {}: the reduce op must match the pending reduction", reduce_name(at().rop),
                                 iname(0), ps(p), axn(a)),
                     a, fmt::format("use `reduce: {}`", reduce_name(p.op)));
    bool copies = (p.is_r() || p.is_i()) && at().rop != ReduceOp::Sum;
    if (!(p.is_p() || p.is_v() || copies))
      return illegal(fmt::format("ZeROScatterGrad({}) over {} of {}, which is {} over {}: it reduce-scatters a gradient that is pending (P) or per-rank "
                                 "(V){}",
                                 reduce_name(at().rop), axn(a), iname(0), ps(p), axn(a),
                                 p.is_r() || p.is_i() ? fmt::format("; a sum of the {} equal copies is {} times the gradient", axsize(a), axsize(a))
                                 : p.is_s()           ? "; summing different shards adds unrelated slices"
                                                      : ""),
                     a, p.is_r() || p.is_i() ? fmt::format("the gradient is already whole: keep this rank's slice with {{op: Convert, in: [{}], out: {}_shard, axis: {}, to: S({})}}",
                                                           iname(0), iname(0), axn(a), d)
                                             : "");
    if (!reduction_ok(a, at().rop)) return;
    if (!can_add_shard(o, d, a)) return;
    set_new(o, a, Placement::s(d), fmt::format("ZeROScatterGrad over {} along dim {}", axn(a), d));
  }
}

// R -> S(dim), no communication; with a second operand (the gradient shard the state updates) the slice must
// have its placement on every axis and its global shape.
void Checker::zero_partition() {
  Value& o = out() = in(0);
  int d = norm_dim(zero_dim(at()), in(0).rank, "dim", iname(0));
  if (d < 0) return;
  for (int a : coll_axes(false)) {
    Placement p = pl_of(o, a);
    if (p.is_s(d)) continue;  // already partitioned there
    if (!p.is_r())
      return illegal(fmt::format("ZeROPartitionOptState over {} of {}, which is {} over {}: it keeps the local slice of a replicated optimizer state (R)",
                                 axn(a), iname(0), ps(p), axn(a)),
                     a, p.is_p() ? fix_allreduce(iname(0), a, p) : p.is_s() ? fix_allgather(iname(0), a, p.dim) : "");
    if (!can_add_shard(o, d, a)) return;
    set_new(o, a, Placement::s(d), fmt::format("ZeROPartitionOptState over {} along dim {}", axn(a), d));
  }
  if (n_in() < 2) return;
  const Value& g = in(1);
  if (g.rank != o.rank)
    return report(CheckId::ShapeMismatch,
                  fmt::format("ZeROPartitionOptState: the state {} has shape {} but the gradient {} it updates has shape {}", iname(0), sstr(o.dims()),
                              iname(1), sstr(g.dims())),
                  iname(0));
  for (int a = 0; a < axes(); ++a) {
    Placement want = pl_of(g, a), got = pl_of(o, a);
    if (want == got) continue;
    std::vector<Note> notes;
    origin_note(notes, g, a);
    std::string fix_text = want.is_s() && got.is_s() ? fmt::format("partition along the gradient's dim: `dim: {}`", want.dim)
                           : want.is_s()              ? fmt::format("partition over {} too (add it to `axis`)", axn(a))
                           : got.is_s()               ? fmt::format("the gradient is {} over {}: reduce-scatter it there (ZeROScatterGrad, axis: {}, dim: {})",
                                                                    ps(want), axn(a), axn(a), got.dim)
                                                      : "";
    if (!fix_text.empty()) notes.push_back(fix(fix_text));
    return report(CheckId::PlacementMismatch,
                  fmt::format("ZeROPartitionOptState: the slice of {} is {} over {}, but the gradient shard {} it updates is {}: each rank would update "
                              "its optimizer state with another rank's gradient",
                              iname(0), ps(got), axn(a), iname(1), ps(want)),
                  iname(0), std::move(notes));
  }
  for (int k = 0; k < o.rank; ++k)
    if (!same_dim(o.shape[static_cast<std::size_t>(k)], g.shape[static_cast<std::size_t>(k)],
                  fmt::format("ZeROPartitionOptState: dim {} of the state {} (left) and of the gradient {} it updates (right)", k, iname(0), iname(1)),
                  iname(0)))
      return;
}

}  // namespace spmd::detail
