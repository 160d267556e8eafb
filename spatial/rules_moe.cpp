// spatial/rules_moe.cpp - placement and shape rules of mixture-of-experts ops
//
// Ops: MoEDispatch, MoECombine, ExpertCompute, MoEGateGrad. Dispatched from Checker::apply() in rules.cpp.
//
// The model (docs/semantics.md, "Mixture of experts"): tokens [..., T, H] are split over the expert-parallel
// axis (S(T)); MoEDispatch sends each token to the capacity slots of its k experts in the expert-major buffer
// [..., E, C, H], split S(E) over that axis. The real split sizes of the all-to-all depend on the routing; the
// checker proves the layout of the buffer padded to its bound C (C/n slots per expert for each of the n source
// ranks; tokens over that capacity are dropped, and `dropless` needs C = T, the bound no routing exceeds).
// MoECombine is the inverse of the MoEDispatch of the same indices over the same axis.
#include <cmath>

#include "spatial/checker.h"

namespace spmd::detail {

namespace {

std::string axis_attr_text(const Program& p, std::uint32_t m) {
  std::string s;
  int n = 0;
  for (int a = 0; a < p.axis_count(); ++a)
    if (m & (1u << a)) s += (s.empty() ? "" : ", ") + p.mesh[static_cast<std::size_t>(a)].name, ++n;
  return n > 1 ? "[" + s + "]" : s;
}

}  // namespace

// The one expert-parallel axis of a MoE op, or -1 after a report.
int Checker::moe_axis() {
  if (std::popcount(at().axes) != 1) {
    illegal(fmt::format("{} over {}: the token exchange of a MoE layer runs over one expert-parallel axis", opname(), axis_attr_text(p_, at().axes)),
            -1, "name one axis (fold several axes into one mesh axis for expert parallelism)");
    return -1;
  }
  return std::countr_zero(at().axes);
}

// Leading dims of operand i (rank nl + tail) and of operand j agree in size.
bool Checker::moe_leading(int i, int j, int nl) {
  for (int d = 0; d < nl; ++d)
    if (!same_dim(in(i).shape[static_cast<std::size_t>(d)], in(j).shape[static_cast<std::size_t>(d)],
                  fmt::format("{} batch dim {} of {} against {}", opname(), d, iname(i), iname(j)), iname(j)))
      return false;
  return true;
}

// The routing operands (indices, weights: inputs from `first`) on a non-expert axis a: R, or the same leading
// shard as the data operand `data` (placement pd). False after a report.
bool Checker::moe_routing_ok(int a, int first, int data, int nl) {
  Placement pd = pin(data, a);
  for (int i = first; i < n_in(); ++i) {
    Placement q = pin(i, a);
    if (q.is_p()) {
      partial_misuse(i, a, "routing indices and weights must be whole values on every rank");
      return false;
    }
    bool lead_ok = q.is_s() && q.dim < nl && pd.is_s(q.dim);
    bool whole = q.is_r() || q.is_i();
    bool data_lead = pd.is_s() && pd.dim < nl;
    if ((whole && !data_lead) || lead_ok) continue;
    std::string want = data_lead ? ps(pd) : "R";
    layout_conflict(fmt::format("{} reads {} as {} over {} and its routing {} as {}: the routing must be split like the tokens' batch dims ({})",
                                opname(), iname(data), ps(pd), axn(a), iname(i), ps(q), want),
                    iname(i), i, a, fmt::format("make {} {} over {}", iname(i), want, axn(a)));
    return false;
  }
  return true;
}

void Checker::moe_dispatch() {
  const Value& x = in(0);
  const Value& idx = in(1);
  int a0 = moe_axis();
  if (a0 < 0) return;
  if (x.rank < 2)
    return report(CheckId::ShapeMismatch, fmt::format("MoEDispatch tokens {} must be [..., T, H], got rank {}", iname(0), x.rank), iname(0));
  int nl = x.rank - 2;
  for (int i = 1; i < n_in(); ++i)
    if (in(i).rank != x.rank)
      return report(CheckId::ShapeMismatch,
                    fmt::format("MoEDispatch routing {} must be [..., T, k] (rank {}), got rank {}", iname(i), x.rank, in(i).rank), iname(i));
  for (int i = 1; i < n_in(); ++i) {
    if (!moe_leading(0, i, nl)) return;
    if (!same_dim(x.shape[static_cast<std::size_t>(nl)], in(i).shape[static_cast<std::size_t>(nl)],
                  fmt::format("MoEDispatch routes the tokens (dim {}) of {} by {}", nl, iname(0), iname(i)), iname(i)))
      return;
  }
  if (n_in() == 3 && !same_dim(idx.shape[static_cast<std::size_t>(nl + 1)], in(2).shape[static_cast<std::size_t>(nl + 1)],
                               fmt::format("MoEDispatch weights {} give one weight per routing choice of {}", iname(2), iname(1)), iname(2)))
    return;
  const auto& buf = p_.shapes[at().shape];
  ExprId E = buf[0], C = buf[1], T = x.shape[static_cast<std::size_t>(nl)], n = axis_size(a0);
  auto divisible = [&](ExprId v, const std::string& what) {
    Decision dec = obl_.decide(OblKind::Divisible, v, n);
    if (dec == Decision::Fails) {
      report(CheckId::ShapeMismatch,
             fmt::format("{} ({}) must be divisible by the {} ranks of {}, but it is not", what, dstr(v), axsize(a0), axn(a0)), oname(0),
             {fix(fmt::format("make {} a multiple of {}", what, axsize(a0)))});
      return false;
    }
    if (dec == Decision::Deferred && obl_.first_time(OblKind::Divisible, v, n))
      obl_.push({OblKind::Divisible,
                 v,
                 n,
                 CheckId::ShapeMismatch,
                 here(),
                 op_idx_,
                 oname(0),
                 fmt::format("{} must be divisible by the {} ranks of {}", what, axsize(a0), axn(a0)),
                 {}});
    return true;
  };
  if (auto tk = topk_experts_.find(p_.ins(*op_)[1]);
      tk != topk_experts_.end() &&
      !same_dim(E, tk->second, fmt::format("MoEDispatch buffer holds E experts, and its routing {} picks among the experts of a TopKGate", iname(1)),
                oname(0)))
    return;
  if (!divisible(E, "the expert count E of `buffer`") || !divisible(C, "the capacity C of `buffer` (C/n slots per expert for each source rank)"))
    return;
  // Uneven tokens (`uneven: true`): each rank routes its own chunk as one capacity group, and the groups are the
  // equal blocks of the tokens only when they divide evenly (13 tokens over 4 ranks are chunks of 4, 4, 4 and 1).
  if (x.uneven && std::any_of(x.pl.begin(), x.pl.end(), [&](Placement q) { return q.is_s(nl); }) &&
      !divisible(T, fmt::format("the token count T of {} (uneven: every rank routes one capacity group of T/n tokens)", iname(0))))
    return;
  if (at().dropless &&
      !same_dim(
          C, T,
          fmt::format("MoEDispatch is dropless, so its capacity must be the bound T of {} (every token of a rank may pick one expert)", iname(0)),
          oname(0)))
    return;
  if (at().has_number) {  // capacity_factor: C = n * ceil(cf * (T/n) * k / E), as DeepSpeed and Megatron size the per-rank capacity
    auto cT = obl_.concrete(T), cE = obl_.concrete(E), cC = obl_.concrete(C), cn = obl_.concrete(n),
         ck = obl_.concrete(idx.shape[static_cast<std::size_t>(nl + 1)]);
    if (cT && cE && cC && cn && ck && *cn > 0 && *cE > 0) {
      double per = at().number * static_cast<double>(*cT / *cn) * static_cast<double>(*ck) / static_cast<double>(*cE);
      auto want = *cn * static_cast<std::int64_t>(std::ceil(per - 1e-9));
      if (want != *cC)
        return report(
            CheckId::ShapeMismatch,
            fmt::format("MoEDispatch capacity {} does not match capacity_factor {}: each of the {} ranks of {} keeps ceil({} * {} tokens * k {} / {} "
                        "experts) = {} slots per expert, so C = {}",
                        *cC, at().number, *cn, axn(a0), at().number, *cT / *cn, *ck, *cE, want / *cn, want),
            oname(0), {fix(fmt::format("use `buffer: [{}, {}]`", dstr(E), want))});
    }
  }
  if (!invariant_ok({0, 1, 2})) return;
  Value& o = out() = x;
  o.rank = static_cast<std::uint8_t>(x.rank + 1);
  for (int d = 0; d < nl; ++d) o.shape[static_cast<std::size_t>(d)] = x.shape[static_cast<std::size_t>(d)];
  o.shape[static_cast<std::size_t>(nl)] = E;
  o.shape[static_cast<std::size_t>(nl + 1)] = C;
  o.shape[static_cast<std::size_t>(nl + 2)] = x.shape[static_cast<std::size_t>(nl + 1)];
  for (int a = 0; a < axes(); ++a) {
    Placement px = pin(0, a);
    if (a == a0) {
      for (int i = 0; i < n_in(); ++i) {
        Placement q = pin(i, a);
        if (q.is_s(nl)) continue;
        return layout_conflict(
            fmt::format("MoEDispatch over {} needs {} split over {} along its tokens (S({})), but it is {}: {}", axn(a), iname(i), axn(a), nl, ps(q),
                        q.is_p() ? "a pending sum cannot be routed by rank"
                                 : "every rank would route every token, and each expert would get every token once per rank"),
            iname(i), i, a,
            fmt::format("dispatch tokens split over {}: make {} S({}) over {} (e.g. {{op: Convert, in: [{}], axis: {}, to: S({})}})", axn(a),
                        iname(i), nl, axn(a), iname(i), axn(a), nl));
      }
      if (shard_mask(x, nl) != (1u << a0))
        return layout_conflict(
            fmt::format("MoEDispatch over {}: the tokens of {} are also split over another axis; the capacity groups are the ranks of {}", axn(a),
                        iname(0), axn(a)),
            iname(0), 0, a, "put the other axis's shard on a leading batch dim of the tokens");
      set_new(o, a, Placement::s(nl),
              fmt::format("MoEDispatch over {} sends each token to the rank that holds its expert (E/{} experts per rank)", axn(a), axsize(a)));
      continue;
    }
    if (!moe_routing_ok(a, 1, 0, nl)) return;
    if (px.is_s(nl))
      return layout_conflict(
          fmt::format("MoEDispatch over {} reads {} with its tokens split over {} as well ({}): the capacity groups are the ranks of {}", axn(a0),
                      iname(0), axn(a), ps(px), axn(a0)),
          iname(0), 0, a, fmt::format("put the {} shard on a leading batch dim of the tokens, or gather it first", axn(a)));
    if (px.is_p() && !px.linear_partial())
      return partial_misuse(0, a, "a pending max or min does not commute with zero-filled capacity slots and routing weights");
    if (px.is_s(nl + 1))
      set_from(o, a, Placement::s(nl + 2), 0);
    else
      set_from(o, a, px, 0);
  }
  moe_dispatches_[p_.ins(*op_)[1]] = {op_idx_, at().axes, E, C, n_in() == 3};
}

void Checker::moe_combine() {
  const Value& y = in(0);
  const Value& idx = in(1);
  int a0 = moe_axis();
  if (a0 < 0) return;
  if (y.rank < 3)
    return report(CheckId::ShapeMismatch, fmt::format("MoECombine expert outputs {} must be [..., E, C, H], got rank {}", iname(0), y.rank),
                  iname(0));
  int nl = y.rank - 3;
  for (int i = 1; i < n_in(); ++i)
    if (in(i).rank != nl + 2)
      return report(CheckId::ShapeMismatch,
                    fmt::format("MoECombine routing {} must be [..., T, k] (rank {}), got rank {}", iname(i), nl + 2, in(i).rank), iname(i));
  for (int i = 1; i < n_in(); ++i)
    if (!moe_leading(0, i, nl)) return;
  if (n_in() == 3) {
    for (int d = nl; d < nl + 2; ++d)
      if (!same_dim(idx.shape[static_cast<std::size_t>(d)], in(2).shape[static_cast<std::size_t>(d)],
                    fmt::format("MoECombine weights {} give one weight per routing choice of {}", iname(2), iname(1)), iname(2)))
        return;
  }
  auto it = moe_dispatches_.find(p_.ins(*op_)[1]);
  if (it == moe_dispatches_.end())
    return report(
        CheckId::IllegalCollective,
        fmt::format("MoECombine of {} routes by {}, which no earlier MoEDispatch dispatched: a combine is the inverse of the dispatch of the same "
                    "indices over the same axis",
                    iname(0), iname(1)),
        iname(1), {fix(fmt::format("combine with the indices the MoEDispatch used (or dispatch by {} first)", iname(1)))});
  const MoEDispatchRecord& rec = it->second;
  Loc dl = p_.ops[static_cast<std::size_t>(rec.op)].loc;
  if (rec.axes != at().axes)
    return report(
        CheckId::IllegalCollective,
        fmt::format("MoECombine over {} undoes the MoEDispatch of {} over {} (line {}): tokens go back over the axis and group they came by, or "
                    "they land on the wrong ranks",
                    axis_attr_text(p_, at().axes), iname(1), axis_attr_text(p_, rec.axes), dl.line),
        iname(0),
        {{dl, fmt::format("the tokens were dispatched over {} here", axis_attr_text(p_, rec.axes))},
         fix(fmt::format("use `axis: {}`", axis_attr_text(p_, rec.axes)))});
  if (!same_dim(y.shape[static_cast<std::size_t>(nl)], rec.E,
                fmt::format("MoECombine reads {} as E experts of the dispatch buffer (line {})", iname(0), dl.line), iname(0)) ||
      !same_dim(y.shape[static_cast<std::size_t>(nl + 1)], rec.C,
                fmt::format("MoECombine reads {} as the C capacity slots of the dispatch buffer (line {})", iname(0), dl.line), iname(0)))
    return;
  if (!invariant_ok({0, 1, 2})) return;
  Value& o = out() = y;
  o.rank = static_cast<std::uint8_t>(nl + 2);
  o.shape[static_cast<std::size_t>(nl)] = idx.shape[static_cast<std::size_t>(nl)];
  o.shape[static_cast<std::size_t>(nl + 1)] = y.shape[static_cast<std::size_t>(nl + 2)];
  for (int a = 0; a < axes(); ++a) {
    Placement py = pin(0, a);
    if (a == a0) {
      if (!py.is_s(nl) || shard_mask(y, nl) != (1u << a0))
        return layout_conflict(
            fmt::format("MoECombine over {} needs the expert outputs {} split over {} along the experts (S({})), as the dispatch left them, but "
                        "they are {}",
                        axn(a), iname(0), axn(a), nl, ps(py)),
            iname(0), 0, a, fmt::format("keep the expert dim of {} S({}) over {} between dispatch and combine", iname(0), nl, axn(a)));
      for (int i = 1; i < n_in(); ++i)
        if (!pin(i, a).is_s(nl))
          return layout_conflict(fmt::format("MoECombine over {} needs the routing {} split over {} along the tokens (S({})), but it is {}", axn(a),
                                             iname(i), axn(a), nl, ps(pin(i, a))),
                                 iname(i), i, a, fmt::format("use the routing the dispatch used, S({}) over {}", nl, axn(a)));
      set_new(o, a, Placement::s(nl), fmt::format("MoECombine over {} sends each expert output back to the rank of its token", axn(a)));
      continue;
    }
    if (!moe_routing_ok(a, 1, 0, nl)) return;
    if (py.is_s(nl) || py.is_s(nl + 1))
      return layout_conflict(
          fmt::format("MoECombine reads the expert outputs {} {} over {}: the {} dim must be whole on the ranks of a dispatch group", iname(0),
                      ps(py), axn(a), py.dim == nl ? "expert" : "capacity"),
          iname(0), 0, a, fmt::format("gather {} over {} first", iname(0), axn(a)));
    if (py.is_p() && !py.linear_partial())
      return partial_misuse(0, a, "a pending max or min does not commute with summing each token's expert outputs times its weights");
    if (py.is_s(nl + 2))
      set_from(o, a, Placement::s(nl + 1), 0);
    else
      set_from(o, a, py, 0);
  }
}

void Checker::expert_compute() {
  const Value& x = in(0);
  const Value& w = in(1);
  if (x.rank < 3 || w.rank != 3)
    return report(CheckId::ShapeMismatch,
                  fmt::format("ExpertCompute needs tokens per expert [..., E, C, K] and expert weights [E, K, N]; {} has rank {} and {} has rank {}",
                              iname(0), x.rank, iname(1), w.rank),
                  iname(x.rank < 3 ? 0 : 1));
  int ex = x.rank - 3;
  if (!same_dim(x.shape[static_cast<std::size_t>(ex)], w.shape[0],
                fmt::format("ExpertCompute pairs the experts (dim {}) of {} with dim 0 of {}", ex, iname(0), iname(1)), iname(1)))
    return;
  matmul();
}

void Checker::moe_gate_grad() {
  const Value& t = in(0);
  const Value& b = in(1);
  int a0 = moe_axis();
  if (a0 < 0) return;
  if (t.rank < 2 || b.rank != t.rank + 1 || in(2).rank != t.rank)
    return report(CheckId::ShapeMismatch, fmt::format("MoEGateGrad takes tokens [..., T, H], the buffer [..., E, C, H] and indices [..., T, k]"),
                  iname(0));
  int nl = t.rank - 2;
  if (!same_dim(t.shape[static_cast<std::size_t>(nl + 1)], b.shape[static_cast<std::size_t>(nl + 2)],
                fmt::format("MoEGateGrad dots the tokens of {} with the slots of {}", iname(0), iname(1)), iname(1)))
    return;
  Value& o = out() = in(2);
  o.dtype = t.dtype;
  for (int a = 0; a < axes(); ++a) {
    Placement pt = pin(0, a), pb = pin(1, a), pi = pin(2, a);
    if (a == a0) {
      if (!(pt.is_s(nl) && pb.is_s(nl) && pi.is_s(nl)))
        return layout_conflict(
            fmt::format("MoEGateGrad over {} needs the tokens and indices S({}) and the buffer S({}) over {}", axn(a), nl, nl, axn(a)), iname(0), 0,
            a, "");
      set_new(o, a, Placement::s(nl), "MoEGateGrad over the expert-parallel axis");
      continue;
    }
    if (pi.is_p()) return partial_misuse(2, a, "routing indices must be whole values");
    if (pt.is_s(nl + 1) && pb.is_s(nl + 2)) {
      set_new(o, a, Placement::p(), fmt::format("MoEGateGrad contracts the hidden dim sharded over {}", axn(a)));
    } else if ((pt.is_p() && pt.op == ReduceOp::Sum && pb.is_r()) || (pb.is_p() && pb.op == ReduceOp::Sum && pt.is_r())) {
      set_new(o, a, Placement::p(), "MoEGateGrad of a pending sum");
    } else if (pt.is_r() && pb.is_r() && (pi.is_r() || pi.is_i())) {
      o.pl[static_cast<std::size_t>(a)] = Placement::r();
    } else if (pt.is_s() && pt.dim < nl && pb.is_s(pt.dim) && pi.is_s(pt.dim)) {
      set_from(o, a, pt, 0);
    } else if ((pt.is_v() || pb.is_v()) && !pt.is_p() && !pb.is_p()) {
      set_new(o, a, Placement::v(), "MoEGateGrad of per-rank values");
    } else {
      return layout_conflict(fmt::format("MoEGateGrad reads {} as {} and {} as {} over {}", iname(0), ps(pt), iname(1), ps(pb), axn(a)), iname(0), 0,
                             a, "");
    }
  }
}

}  // namespace spmd::detail
