// equiv/training.cpp - the plan's and the spec's training steps as one plan/spec pair (see training.h).
#include "equiv/training.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "autograd/autograd.h"
#include "equiv/reduce.h"
#include "spatial/spatial.h"

namespace spmd::equiv_detail {
namespace {

// `ops` without the relabels in [from, to) (Reinterpret P -> P(avg) of a mean loss's gradients: no data moves).
std::vector<Op> without_relabels(const std::vector<Op>& ops, std::size_t from, std::size_t to) {
  std::vector<Op> out;
  out.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (i < from || i >= to || ops[i].kind != OpKind::Reinterpret) out.push_back(ops[i]);
  return out;
}

std::string first_error(const std::vector<Diagnostic>& diags) {
  for (const auto& d : diags)
    if (d.severity == Severity::Error)  // (an imported op's error is at its model's source line, in that file)
      return d.file.empty() ? fmt::format("line {}: {}", d.loc.line, d.message) : fmt::format("{}:{}: {}", d.file, d.loc.line, d.message);
  return "";
}


}  // namespace

void add_grad_outputs(Program& c, const std::vector<PairGrad>& grads) {
  for (const auto& g : grads) {
    OutputDecl od;
    od.name = g.name;
    od.loc = g.loc;
    od.has_placement = true;
    od.placement = g.pl;
    od.ranks = g.ranks;
    c.outputs.push_back(od);
    if (c.has_spec) c.spec_outputs.push_back({g.name, g.name, g.loc});
  }
}

void finish_pair(Program& c, TrainingPair& r) {
  c.train = c.has_backward = c.has_grad_sync = c.has_optimizer = c.has_spec_optimizer = c.has_expect = false;
  c.backward.clear(), c.grad_sync.clear(), c.optimizer.clear(), c.spec_optimizer.clear(), c.expect.clear();
  c.loss = -1;
  r.pending.resize(c.names.size(), 0);
  r.program = std::move(c);
  r.ok = true;
}

std::vector<char> optimizer_writes(const Program& t, std::size_t first_optim) {
  std::vector<char> w(t.names.size(), 0);
  for (std::size_t i = first_optim; i < t.ops.size(); ++i)
    for (NameId n : t.outs(t.ops[i])) w[static_cast<std::size_t>(n)] = 1;
  return w;
}

void optimizer_outputs(const Program& p, const std::vector<char>& plan_w, const std::function<const Placements*(NameId)>& last,
                       const std::function<std::vector<std::pair<int, std::int64_t>>(NameId)>& ranks, Program& c) {
  if (!p.has_optimizer) return;
  std::vector<char> spec_w(plan_w.size(), 0);
  // the spec's optimizer: the last ops of the pair's spec ops (as many as the list has; gradients renamed as the plan's)
  std::size_t k = (p.has_spec ? p.spec_optimizer : p.optimizer).size();
  for (std::size_t i = c.spec_ops.size() - std::min(k, c.spec_ops.size()); i < c.spec_ops.size(); ++i)
    for (NameId n : c.outs(c.spec_ops[i]))
      if (static_cast<std::size_t>(n) < spec_w.size()) spec_w[static_cast<std::size_t>(n)] = 1;
  std::vector<const TensorDecl*> decl(plan_w.size(), nullptr);
  for (const auto& d : p.tensors) decl[static_cast<std::size_t>(d.name)] = &d;
  auto compared = [&](NameId n) {
    return std::any_of(c.outputs.begin(), c.outputs.end(), [&](const OutputDecl& od) { return od.name == n; }) ||
           std::any_of(c.spec_outputs.begin(), c.spec_outputs.end(), [&](const Program::SpecLink& l) { return l.plan == n; });
  };
  for (std::size_t n = 0; n < plan_w.size(); ++n) {
    bool d = decl[n] != nullptr;
    if (!(d ? plan_w[n] || spec_w[n] : plan_w[n] && spec_w[n])) continue;
    NameId id = static_cast<NameId>(n);
    if (compared(id)) continue;
    OutputDecl od;
    od.name = id;
    od.loc = d ? decl[n]->loc : p.optimizer_loc;
    od.has_placement = true;
    const Placements* pl = plan_w[n] ? last(id) : nullptr;
    od.placement = pl ? *pl : decl[n]->placement;
    od.ranks = ranks(id);
    c.outputs.push_back(od);
    c.spec_outputs.push_back({id, id, od.loc});
  }
}

std::vector<NameId> rename_optimizer_grads(Program& t, std::vector<Op>& ops, std::size_t first) {
  std::vector<NameId> out;
  std::unordered_map<NameId, NameId> renamed;
  for (std::size_t i = first; i < ops.size(); ++i) {
    const Op& op = ops[i];
    for (std::uint32_t j = op.first; j < op.first + op.n_in; ++j)
      if (auto it = renamed.find(t.operands[j]); it != renamed.end()) t.operands[j] = it->second;
    for (std::uint32_t j = op.first + op.n_in; j < op.first + op.n_in + op.n_out; ++j) {
      NameId n = t.operands[j];
      if (!t.name(n).ends_with(".grad")) continue;
      NameId r = t.intern(t.name(n) + "@optimizer");
      t.operands[j] = renamed[n] = r;
      out.push_back(r);
    }
  }
  return out;
}

void loss_scales_on_one_device(Program& m, const Program& typed, const SpatialTypes& st) {
  const auto tin = input_types({&typed, &typed.ops, &st, nullptr});
  for (std::size_t oi = 0; oi < typed.ops.size() && oi < m.ops.size(); ++oi) {
    const Op& op = typed.ops[oi];
    if (op.kind != OpKind::LossScale || !op.attrs.axes || m.ops[oi].kind != OpKind::LossScale || tin[oi].empty()) continue;
    const ValueType* in = tin[oi][0];
    double n = 1;
    bool known = in && in->ok;
    for (std::size_t a = 0; a < typed.mesh.size() && known; ++a) {
      if (!(op.attrs.axes & (1u << a)) || !in->pl[a].is_p() || in->pl[a].op != ReduceOp::Avg) continue;
      if (!typed.exprs.is_const(typed.mesh[a].size)) known = false;
      else n *= static_cast<double>(typed.exprs.value(typed.mesh[a].size));
    }
    if (known) m.ops[oi].attrs.number = op.attrs.number * n;
  }
}

std::string spec_pair(const Program& p, const Program& t, std::vector<Op> plan_ops, NameId plan_seed, const std::vector<PairGrad>& grads, double n_copies,
                      TrainingPair& r, Program& c) {
  // The spec's step: its forward on the same declarations, whole (R everywhere), its backward derived. Built on a
  // copy of the plan's step so that every side table the plan's ops use stays valid in the pair. Without a spec,
  // the model is the plan's own forward on one device: its step derived on a mesh of ones (collectives and
  // conversions the identity, a Mean's count the whole dim), the real mesh put back afterwards.
  NameId spec_loss = p.loss;
  for (const auto& l : p.spec_outputs)
    if (l.plan == p.loss) spec_loss = l.spec;
  bool writes = false;
  for (const auto& op : p.has_spec ? p.spec_ops : p.ops)
    for (NameId n : p.outs(op)) writes |= n == spec_loss;
  if (!writes) return fmt::format("the spec does not compute the loss {} (name it alike, or list it under the spec's outputs)", p.name(p.loss));
  Program s = t;
  s.ops = p.has_spec ? p.spec_ops : p.ops;
  if (!p.has_spec) loss_scales_on_one_device(s, t, r.plan_types);  // the plan's forward ops come first in its step
  s.per_rank = false, s.programs.clear(), s.schedule = ScheduleSpec{};  // the spec is one program on one device
  s.tensors.assign(p.tensors.begin(), p.tensors.end());
  if (p.has_spec)
    for (auto& d : s.tensors) d.placement = Placements{}, d.uneven = false;
  else
    for (auto& m : s.mesh) m.size = s.exprs.constant(1);
  s.loss = spec_loss;
  s.train = true;
  s.has_backward = s.has_grad_sync = s.has_spec = s.has_expect = s.local_view = false;
  s.backward.clear(), s.grad_sync.clear(), s.spec_ops.clear(), s.outputs.clear(), s.expect.clear(), s.spec_outputs.clear(), s.lineage.clear();
  // The spec's optimizer (`spec.optimizer`; without a spec, the plan's own on the mesh of ones) runs after its backward.
  s.has_optimizer = p.has_spec ? p.has_spec_optimizer : p.has_optimizer;
  s.optimizer = p.has_spec ? p.spec_optimizer : p.optimizer;
  s.has_spec_optimizer = false, s.spec_optimizer.clear();
  ForwardUndo undo;
  TrainingCheck sc;
  TrainingOptions so;
  so.step_types = &r.spec_types;
  try {
    sc = check_training_in_place(s, undo, so);
  } catch (const LoadError& e) {
    return fmt::format("{} backward cannot be derived (line {}: {})", p.has_spec ? "the spec's" : "the single-device step's", e.loc.line, e.what());
  }
  if (!sc.built) {
    std::string e = first_error(sc.diags);
    return fmt::format("{} forward does not check as a single-device program{}", p.has_spec ? "the spec's" : "the plan's", e.empty() ? "" : " (" + e + ")");
  }
  s.mesh = t.mesh;
  r.spec_typed = s.ops;
  // The spec's seed is the plan's input, times N: the plan's backward computes the gradients of N copies of the
  // loss (every intermediate gradient is N times the spec's), and the P(avg) relabel with grad_sync's average
  // divides by N at the end; the spec mirrors both, so intermediate gradients are comparable stage by stage.
  NameId spec_seed = s.tensors.back().name;
  rename_optimizer_grads(s, s.ops, sc.first_optim);
  std::vector<Op> spec_optim(s.ops.begin() + static_cast<std::ptrdiff_t>(sc.first_optim), s.ops.end());
  s.ops.resize(sc.first_optim);
  std::vector<Op> spec_ops = without_relabels(s.ops, sc.first_relabel, sc.first_sync);
  NameId seed_in = plan_seed;
  std::vector<Op> prologue;
  if (n_copies != 1) {
    seed_in = s.intern(s.name(plan_seed) + ".copies");
    Op m;
    m.kind = OpKind::Multiply;
    m.loc = p.loss_loc;
    m.attrs.number = n_copies;
    m.attrs.has_number = true;
    s.add_op(prologue, m, std::span<const NameId>(&plan_seed, 1), std::span<const NameId>(&seed_in, 1));
  }
  if (spec_seed != seed_in)
    for (const auto& op : spec_ops)
      for (std::uint32_t j = op.first; j < op.first + op.n_in + op.n_out; ++j)
        if (s.operands[j] == spec_seed) s.operands[j] = seed_in;
  spec_ops.insert(spec_ops.begin(), prologue.begin(), prologue.end());
  if (n_copies != 1)
    for (const auto& g : grads) {
      Op m;
      m.kind = OpKind::Multiply;
      m.loc = p.loss_loc;
      m.attrs.number = 1.0 / n_copies;
      m.attrs.has_number = true;
      s.add_op(spec_ops, m, std::span<const NameId>(&g.name, 1), std::span<const NameId>(&g.name, 1));
    }
  spec_ops.insert(spec_ops.end(), spec_optim.begin(), spec_optim.end());  // after the gradients' 1/N
  // A parameter the spec's loss depends on but no plan gradient reaches: the plan would never update it.
  for (const auto& d : p.tensors) {
    if (!d.param) continue;
    auto it = s.name_ids.find(s.name(d.name) + ".grad");
    if (it == s.name_ids.end() || std::any_of(grads.begin(), grads.end(), [&](const PairGrad& g) { return g.name == it->second; })) continue;
    bool spec_writes = false;
    for (const auto& op : spec_ops)
      for (NameId n : s.outs(op)) spec_writes |= n == it->second;
    if (spec_writes) r.missing.push_back({d.name, d.loc});
  }
  std::size_t shift = prologue.size();
  r.spec_bwd = {sc.first_backward + shift, sc.first_relabel + shift};
  c = std::move(s);
  c.ops = std::move(plan_ops);
  c.spec_ops = std::move(spec_ops);
  c.has_spec = true;
  c.spec_loc = p.has_spec ? p.spec_loc : p.loss_loc;
  c.spec_outputs = p.spec_outputs;
  if (!p.has_spec)  // each plan output against the same name in its own single-device step
    for (const auto& od : p.outputs) c.spec_outputs.push_back({od.name, od.name, od.loc});
  c.lineage = p.lineage;
  return "";
}

TrainingPair training_pair(const Program& p) {
  TrainingPair r;
  if (p.loss < 0) return r.why = "a training program needs `loss:`", r;
  // The plan's step, with the types of every value in it.
  SpatialTypes st;
  TrainingOptions to;
  to.step_types = &st;
  Program base = p;
  base.train = true;
  TrainingCheck tc;
  try {
    tc = check_training(base, to);
  } catch (const LoadError& e) {
    return r.why = fmt::format("the plan's backward cannot be derived (line {}: {})", e.loc.line, e.what()), r;
  }
  if (!tc.built) {
    std::string e = first_error(tc.diags);
    return r.why = "the plan's forward has errors" + (e.empty() ? "" : " (" + e + ")"), r;
  }
  r.plan_types = st;
  if (std::string e = first_error(tc.diags); !e.empty()) return r.why = "the plan's training step has errors (" + e + ")", r;
  Program& t = tc.program;
  rename_optimizer_grads(t, t.ops, tc.first_optim);
  // The seed: each rank seeds its own backward with the same value (a P(sum) seed of a replicated loss is relabeled
  // P(avg) by the step, so the value is not split into summands).
  TensorDecl seed = t.tensors.back();
  for (int a = 0; a < t.axis_count(); ++a)
    if (seed.placement[static_cast<std::size_t>(a)].is_p()) seed.placement[static_cast<std::size_t>(a)] = Placement::r();
  // The type of each name's last write in the step (after grad_sync), or null for a name no op writes.
  std::vector<const ValueType*> last(t.names.size(), nullptr);
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    auto outs = t.outs(t.ops[i]);
    for (std::size_t k = 0; k < outs.size(); ++k) last[static_cast<std::size_t>(outs[k])] = &st.out(i, static_cast<int>(k));
  }
  // The compared gradients: each parameter's, by the placement it has at its last write.
  std::vector<PairGrad> grads;
  for (const auto& d : p.tensors) {
    if (!d.param) continue;
    auto it = t.name_ids.find(t.name(d.name) + ".grad");
    if (it == t.name_ids.end() || !last[static_cast<std::size_t>(it->second)]) continue;  // no gradient reaches it in the plan
    grads.push_back({it->second, last[static_cast<std::size_t>(it->second)]->pl, d.loc});
  }
  // (with a spec, parameters whose gradient the spec's loss gives but the plan's does not are reported below: a loss
  // that only reaches them through a Detach, say)
  if (grads.empty() && !p.has_spec) return r.why = "no parameter gets a gradient (mark parameters with `param: true`)", r;
  // Names whose last write in the plan is a pending sum on some axis: a cut there would cut the summands.
  r.pending.assign(t.names.size(), 0);
  for (std::size_t n = 0; n < t.names.size(); ++n)
    for (int a = 0; a < t.axis_count() && last[n]; ++a) r.pending[n] |= last[n]->pl[static_cast<std::size_t>(a)].is_p() || last[n]->pl[static_cast<std::size_t>(a)].is_v();
  // N: how many copies of the loss the plan's backward differentiates (each rank seeds its own; the step relabels the
  // gradients P(avg) over those axes): the sizes of the axes on which the loss is R or P(avg).
  double n_copies = 1;
  {
    Placements lpl = last[static_cast<std::size_t>(p.loss)] ? last[static_cast<std::size_t>(p.loss)]->pl : Placements{};
    for (int a = 0; a < t.axis_count(); ++a) {
      Placement q = lpl[static_cast<std::size_t>(a)];
      if (!(q.is_r() || (q.is_p() && q.op == ReduceOp::Avg))) continue;
      ExprId e = t.mesh[static_cast<std::size_t>(a)].size;
      if (!t.exprs.is_const(e)) return r.why = fmt::format("mesh axis {} has a symbolic size", t.mesh[static_cast<std::size_t>(a)].name), r;
      n_copies *= static_cast<double>(t.exprs.value(e));
    }
  }
  r.plan_typed = t.ops;
  std::vector<Op> plan_ops = without_relabels(t.ops, tc.first_relabel, tc.first_sync);
  if (!p.has_backward) r.plan_bwd = {tc.first_backward, tc.first_relabel};
  NameId plan_seed = seed.name;
  Program c;
  if (std::string why = spec_pair(p, t, std::move(plan_ops), plan_seed, grads, n_copies, r, c); !why.empty()) return r.why = why, r;
  c.tensors.assign(p.tensors.begin(), p.tensors.end());
  c.tensors.push_back(seed);
  c.outputs = p.outputs;
  // The loss is compared too (by the placement of its last write), unless an output already names it.
  bool loss_out = std::any_of(c.outputs.begin(), c.outputs.end(), [&](const OutputDecl& od) { return od.name == p.loss; }) ||
                  std::any_of(p.spec_outputs.begin(), p.spec_outputs.end(), [&](const Program::SpecLink& l) { return l.plan == p.loss; });
  if (!loss_out && last[static_cast<std::size_t>(p.loss)]) {
    OutputDecl od;
    od.name = p.loss;
    od.loc = p.loss_loc;
    od.has_placement = true;
    od.placement = last[static_cast<std::size_t>(p.loss)]->pl;
    bool per_rank = false;
    for (int a = 0; a < c.axis_count(); ++a) per_rank |= od.placement[static_cast<std::size_t>(a)].is_v();
    if (!per_rank) {
      c.outputs.push_back(od);
      if (c.has_spec) c.spec_outputs.push_back({p.loss, p.loss, p.loss_loc});
    }
  }
  add_grad_outputs(c, grads);
  optimizer_outputs(
      p, optimizer_writes(t, tc.first_optim), [&](NameId n) { return last[static_cast<std::size_t>(n)] ? &last[static_cast<std::size_t>(n)]->pl : nullptr; },
      [](NameId) { return std::vector<std::pair<int, std::int64_t>>{}; }, c);
  finish_pair(c, r);
  return r;
}

TrainingPair local_training_pair(const Program& p) {
  TrainingPair r;
  if (p.loss < 0) return r.why = "a training program needs `loss:`", r;
  if (!p.has_spec) return r.why = "a local-view training step needs a `spec:`", r;
  Program t = p;
  std::vector<Op> plan_ops = p.ops;
  plan_ops.insert(plan_ops.end(), p.backward.begin(), p.backward.end());
  plan_ops.insert(plan_ops.end(), p.grad_sync.begin(), p.grad_sync.end());
  NameId seed = t.intern(t.name(p.loss) + ".grad");
  std::vector<char> written(t.names.size(), 0);
  for (const auto& op : plan_ops)
    for (NameId n : t.outs(op)) written[static_cast<std::size_t>(n)] = 1;
  std::vector<PairGrad> grads;
  for (const auto& d : p.tensors) {
    if (!d.param) continue;
    auto it = t.name_ids.find(t.name(d.name) + ".grad");
    if (it != t.name_ids.end() && written[static_cast<std::size_t>(it->second)]) grads.push_back({it->second, d.placement, d.loc});
  }
  // A loss declared P(avg) over an axis is each rank's mean over its part: its gradients are N times the spec's
  // until grad_sync averages them, so the spec's intermediate gradients are taken of N copies too (stage by stage
  // comparable; the compared gradients are divided back by N, so the verdict does not depend on it).
  double n_copies = 1;
  for (const auto& od : p.outputs)
    if (od.name == p.loss && od.has_placement)
      for (std::size_t a = 0; a < p.mesh.size(); ++a)
        if (od.placement[a].is_p() && od.placement[a].op == ReduceOp::Avg && p.exprs.is_const(p.mesh[a].size))
          n_copies *= static_cast<double>(p.exprs.value(p.mesh[a].size));
  Program c;
  if (std::string why = spec_pair(p, t, std::move(plan_ops), seed, grads, n_copies, r, c); !why.empty()) return r.why = why, r;
  // The seed: the spec's `<loss>.grad` (its shape), the same value on every rank.
  TensorDecl sd = c.tensors.back();
  if (sd.name != seed) return r.why = "the spec's loss has another name than the plan's: name it alike (or map it under the spec's outputs)", r;
  sd.placement = Placements{};
  sd.uneven = false;
  c.tensors.assign(p.tensors.begin(), p.tensors.end());
  c.tensors.push_back(sd);
  c.local_view = true;
  c.outputs = p.outputs;
  add_grad_outputs(c, grads);
  finish_pair(c, r);
  return r;
}

}  // namespace spmd::equiv_detail
