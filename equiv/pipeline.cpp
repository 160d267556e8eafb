// equiv/pipeline.cpp - a schedule whose stages run real ops: the one-microbatch step, its lowering per rank, and the
// value check's pair (see pipeline.h).
#include "equiv/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "autograd/autograd.h"
#include "spatial/spatial.h"

namespace spmd {

namespace {

bool has_error(const std::vector<Diagnostic>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const Diagnostic& d) { return d.severity == Severity::Error; });
}

// The one-microbatch step is typed and differentiated without the pipeline axis: its values live on their stage's
// ranks only, so over that axis nothing is replicated or pending (a loss R over it would be differentiated once per
// pipeline rank). These move a program's per-axis data between the two meshes.
std::uint32_t drop_bit(std::uint32_t m, int a) { return (m & ((1u << a) - 1)) | ((m >> (a + 1)) << a); }
std::uint32_t add_bit(std::uint32_t m, int a) { return (m & ((1u << a) - 1)) | ((m >> a) << (a + 1)); }
Placements drop_axis(Placements pl, int a, int n) {
  for (int i = a; i + 1 < n; ++i) pl[static_cast<std::size_t>(i)] = pl[static_cast<std::size_t>(i + 1)];
  pl[static_cast<std::size_t>(n - 1)] = Placement::r();
  return pl;
}
Placements add_axis(Placements pl, int a, int n) {  // n: the axes after
  for (int i = n - 1; i > a; --i) pl[static_cast<std::size_t>(i)] = pl[static_cast<std::size_t>(i - 1)];
  pl[static_cast<std::size_t>(a)] = Placement::r();
  return pl;
}

// Removes the pipeline axis `a` from `q`; returns which `optimizer:` ops sum over it (GradNormSq with the axis in
// `axis:`, Megatron's all-reduce of the norm over the pipeline group: put back by the lowering, where it sums the
// stages' partial norms).
std::vector<char> remove_axis(Program& q, int a) {
  int n = q.axis_count();
  for (auto& t : q.tensors) {
    if (!t.placement[static_cast<std::size_t>(a)].is_r())
      throw LoadError(t.placement_loc.line ? t.placement_loc : t.loc,
                      fmt::format("{} is {} over the pipeline axis {}: in a pipelined schedule every tensor is R over it (each stage reads it whole)", q.name(t.name),
                                  to_string(t.placement[static_cast<std::size_t>(a)]), q.mesh[static_cast<std::size_t>(a)].name));
    t.placement = drop_axis(t.placement, a, n);
  }
  for (auto& o : q.outputs) o.placement = drop_axis(o.placement, a, n);
  std::vector<char> pp_norm(q.optimizer.size(), 0);
  for (std::size_t i = 0; i < q.optimizer.size(); ++i)
    if (Op& op = q.optimizer[i]; op.kind == OpKind::GradNormSq && (op.attrs.axes & (1u << a))) {
      pp_norm[i] = 1;
      op.attrs.axes = drop_bit(op.attrs.axes, a);
    }
  for (auto* list : {&q.ops, &q.grad_sync, &q.optimizer})
    for (auto& op : *list) {
      if ((op.attrs.axes & (1u << a)) && list == &q.optimizer)
        throw LoadError(op.loc, fmt::format("{} communicates over the pipeline axis {}: the optimizer runs on each stage's ranks, and its only sum across "
                                            "stages is a GradNormSq's `axis: {}` (Megatron's all-reduce of the squared norm over the pipeline group)",
                                            op_name(op.kind), q.mesh[static_cast<std::size_t>(a)].name, q.mesh[static_cast<std::size_t>(a)].name));
      if (op.attrs.axes & (1u << a))
        throw LoadError(op.loc, fmt::format("{} communicates over the pipeline axis {}: a stage's ops and grad_sync run within its stage (the schedule moves "
                                            "values between stages)",
                                            op_name(op.kind), q.mesh[static_cast<std::size_t>(a)].name));
      op.attrs.axes = drop_bit(op.attrs.axes, a);
    }
  for (auto& pm : q.placement_maps) pm = drop_axis(pm, a, n);
  q.mesh.erase(q.mesh.begin() + a);
  return pp_norm;
}

void restore_axis(Program& t, int a, const MeshAxis& ax) {
  t.mesh.insert(t.mesh.begin() + a, ax);
  int n = t.axis_count();
  for (auto& d : t.tensors) d.placement = add_axis(d.placement, a, n);
  for (auto& o : t.outputs) o.placement = add_axis(o.placement, a, n);
  for (auto& op : t.ops) op.attrs.axes = add_bit(op.attrs.axes, a);
  for (auto& pm : t.placement_maps) pm = add_axis(pm, a, n);
  for (auto& c : t.coords)
    for (auto& [axis, v] : c)
      if (axis >= a) ++axis;
}

// The one-microbatch step: every stage's forward in order, the batch inputs at the microbatch's size.
Program microbatch_forward(const Program& p, std::int64_t parts, std::vector<int>& stage_of) {
  const ScheduleSpec& sp = p.schedule;
  Program q = p;
  q.schedule = ScheduleSpec{};
  q.per_rank = false;
  q.programs.clear();
  q.ops.clear();
  for (std::size_t st = 0; st < sp.stages.size(); ++st)
    for (const Op& op : sp.stages[st].ops) q.ops.push_back(op), stage_of.push_back(static_cast<int>(st));
  for (const BatchSplit& b : sp.batch)
    for (auto& t : q.tensors) {
      if (t.name != b.name) continue;
      ExprId e = t.shape[static_cast<std::size_t>(b.dim)];
      const std::string what = fmt::format("batch input '{}' (dim {})", p.name(b.name), b.dim);
      // (a size loaded as a variable for shape reduction has one value: the microbatch's dim is its expression / parts)
      auto declared = p.exprs.single_value(e, p.vars);
      if (!declared) throw LoadError(b.loc, what + " needs a concrete size to be cut into microbatches");
      std::int64_t n = *declared, shards = 1;
      for (std::size_t a = 0; a < p.mesh.size(); ++a)
        if (t.placement[a].is_s(b.dim)) {
          if (!p.exprs.is_const(p.mesh[a].size)) throw LoadError(b.loc, what + " is sharded over mesh axis " + p.mesh[a].name + ", which needs a concrete size");
          shards *= p.exprs.value(p.mesh[a].size);
        }
      if (n % (shards * parts) != 0)
        throw LoadError(b.loc, fmt::format("{} has size {}: each of its {} rank blocks must cut into {} microbatches of equal size", what, n, shards, parts));
      t.shape[static_cast<std::size_t>(b.dim)] = p.exprs.is_const(e) ? q.exprs.constant(n / parts) : q.exprs.div(e, q.exprs.constant(parts));
    }
  for (auto& o : q.outputs) o.ranks.clear();
  q.has_spec = false, q.spec_ops.clear(), q.spec_outputs.clear(), q.lineage.clear();
  q.has_spec_optimizer = false, q.spec_optimizer.clear();
  q.has_expect = false, q.expect.clear();
  q.train = true;
  return q;
}

}  // namespace

Program pipeline_step_forward(const Program& p) {
  const Schedule s = program_schedule(p, p.file);
  std::vector<int> stage_of;
  Program q = microbatch_forward(p, s.microbatches * p.schedule.steps, stage_of);
  remove_axis(q, p.schedule.axis);
  return q;
}

PipelineLowering lower_pipeline(const Program& p, const Schedule& s) {
  PipelineLowering out;
  const ScheduleSpec& sp = p.schedule;
  const int S = static_cast<int>(sp.stages.size());
  if (s.stages != S)
    throw LoadError(sp.stages_loc, fmt::format("the schedule's grid runs {} stages, but `stages` lists {}", s.stages, S));
  const std::int64_t M = s.microbatches, K = sp.steps, N = M * K;
  for (const BatchSplit& b : sp.batch)  // a part read twice (and one never) is a data loader's bug, for the checks to find
    if (!b.order.empty() && (static_cast<std::int64_t>(b.order.size()) != N || *std::max_element(b.order.begin(), b.order.end()) >= N))
      throw LoadError(b.loc, fmt::format("`order` of batch input '{}' must give the part each of the {} microbatches (steps x microbatches) reads, "
                                         "each below {}",
                                         p.name(b.name), N, N));
  for (const auto& d : validate_schedule(s))
    if (d.id == CheckId::ScheduleInvalid) return out.why = "the schedule is invalid (" + d.message + ")", out;

  // ---- the one-microbatch training step: types, findings, the derived backward ------------------------------
  std::vector<int> stage_of;
  Program q = microbatch_forward(p, N, stage_of);
  const int axis = sp.axis;
  std::vector<char> pp_norm = remove_axis(q, axis);
  SpatialTypes ft, st;
  SpatialOptions so;
  so.types = &ft;
  out.diags = check_spatial(q, so);
  if (has_error(out.diags)) return out;
  TrainingOptions to;
  to.forward_types = &ft;
  to.step_types = &st;
  TrainingCheck tc = check_training(q, to);
  for (auto& d : tc.diags) out.diags.push_back(std::move(d));
  if (!tc.built || has_error(out.diags)) return out;
  Program T = std::move(tc.program);
  restore_axis(T, axis, p.mesh[static_cast<std::size_t>(axis)]);
  const std::size_t nf = tc.first_backward, fr = tc.first_relabel, fs = tc.first_sync, fo = tc.first_optim;
  for (std::size_t i = 0; i < pp_norm.size() && fo + i < T.ops.size(); ++i)
    if (pp_norm[i]) T.ops[fo + i].attrs.axes |= 1u << axis;
  equiv_detail::rename_optimizer_grads(T, T.ops, fo);  // `<param>.grad` keeps what grad_sync left: the gradient compared

  // Which stage each op of the step belongs to: a forward op its stage's, a backward op its forward op's, a grad_sync
  // op the stage of the parameter whose gradient it reads.
  std::vector<int> op_stage(T.ops.size(), -1);
  for (std::size_t i = 0; i < nf; ++i) op_stage[i] = stage_of[i];
  for (std::size_t j = nf; j < fr; ++j) op_stage[j] = stage_of[static_cast<std::size_t>(tc.forward_op[j - nf])];
  std::vector<int> param_stage(T.names.size(), -1);
  std::vector<char> is_param(T.names.size(), 0), declared(T.names.size(), 0);
  for (const auto& t : p.tensors) declared[static_cast<std::size_t>(t.name)] = 1, is_param[static_cast<std::size_t>(t.name)] = t.param;
  for (std::size_t i = 0; i < nf; ++i)
    for (NameId n : T.ins(T.ops[i])) {
      if (!is_param[static_cast<std::size_t>(n)]) continue;
      int& ps = param_stage[static_cast<std::size_t>(n)];
      if (ps >= 0 && ps != stage_of[i])
        throw LoadError(sp.stages[static_cast<std::size_t>(stage_of[i])].loc,
                        fmt::format("parameter {} is read by stage {} and stage {}: a parameter shared by two stages (tied weights) is not supported yet", p.name(n), ps,
                                    stage_of[i]));
      ps = stage_of[i];
    }
  std::vector<NameId> grad_param(T.names.size(), -1);  // `<param>.grad` -> param
  std::vector<NameId> grad_of(T.names.size(), -1);     // x -> `<x>.grad`
  for (std::size_t n = 0; n < p.names.size(); ++n) {
    auto it = T.name_ids.find(p.name(static_cast<NameId>(n)) + ".grad");
    if (it == T.name_ids.end()) continue;
    grad_of[n] = it->second;
    if (is_param[n]) grad_param[static_cast<std::size_t>(it->second)] = static_cast<NameId>(n);
  }
  for (std::size_t j = fs; j < fo; ++j) {
    const Op& op = T.ops[j];
    for (std::uint32_t o = op.first; o < op.first + op.n_in + op.n_out && op_stage[j] < 0; ++o)
      if (NameId w = grad_param[static_cast<std::size_t>(T.operands[o])]; w >= 0) op_stage[j] = param_stage[static_cast<std::size_t>(w)];
    if (op_stage[j] < 0)
      throw LoadError(op.loc, "a `grad_sync:` op of a pipelined schedule must read or write a parameter's gradient (it runs on the ranks of that parameter's stage)");
  }
  const NameId seed = T.tensors.back().name;
  std::vector<std::vector<int>> fwd(static_cast<std::size_t>(S)), bwd(fwd), sync(fwd), iops(fwd), wops(fwd);
  for (std::size_t i = 0; i < nf; ++i) fwd[static_cast<std::size_t>(op_stage[i])].push_back(static_cast<int>(i));
  for (std::size_t j = nf; j < fr; ++j) bwd[static_cast<std::size_t>(op_stage[j])].push_back(static_cast<int>(j));
  for (std::size_t j = fs; j < fo; ++j) sync[static_cast<std::size_t>(op_stage[j])].push_back(static_cast<int>(j));
  // The optimizer step (docs/schedules.md, "The optimizer"): an op runs on the ranks of the stage whose parameters,
  // gradients or states it reads or writes (a state takes the stage of the first op that updates it with them); an op
  // that touches none (a clip coefficient) runs on every rank; a GradNormSq runs on every rank over the gradients its
  // stages hold, summed over the pipeline axis when its `axis:` names it (else each rank's norm is its stages' only).
  constexpr int kEvery = -2;
  std::vector<int> name_stage(T.names.size(), -1), optim_stage(T.ops.size() - fo, kEvery);
  for (std::size_t n = 0; n < T.names.size(); ++n) {
    if (is_param[n]) name_stage[n] = param_stage[n];
    if (grad_param[n] >= 0) name_stage[n] = param_stage[static_cast<std::size_t>(grad_param[n])];
  }
  for (std::size_t j = fo; j < T.ops.size(); ++j) {
    const Op& op = T.ops[j];
    int st = kEvery;
    for (std::uint32_t o = op.first; o < op.first + op.n_in + op.n_out; ++o) {
      auto n = static_cast<std::size_t>(T.operands[o]);
      NameId w = is_param[n] ? static_cast<NameId>(n) : grad_param[n];
      if (w >= 0 && param_stage[static_cast<std::size_t>(w)] < 0)
        throw LoadError(op.loc, fmt::format("optimizer op {} reads or writes {}, but no stage reads parameter {}: it has no stage's ranks to run on", op_name(op.kind),
                                            T.name(static_cast<NameId>(n)), T.name(w)));
      int x = name_stage[n];
      if (x < 0 || op.kind == OpKind::GradNormSq) continue;
      if (st >= 0 && st != x)
        throw LoadError(op.loc, fmt::format("optimizer op {} reads or writes {} of stage {} and values of stage {}: an optimizer op runs on one stage's ranks "
                                            "(a norm across stages is one GradNormSq with `axis: {}`)",
                                            op_name(op.kind), T.name(static_cast<NameId>(n)), x, st, T.mesh[static_cast<std::size_t>(axis)].name));
      st = x;
    }
    optim_stage[j - fo] = st;
    for (NameId n : T.outs(op))
      if (name_stage[static_cast<std::size_t>(n)] == -1) name_stage[static_cast<std::size_t>(n)] = st;
  }
  // Each stage's activation inputs (the previous stage's outputs) and the gradients it sends back.
  std::vector<std::vector<NameId>> act_in(static_cast<std::size_t>(S)), grad_out(act_in), params(act_in);
  for (int k = 1; k < S; ++k)
    for (NameId a : sp.stages[static_cast<std::size_t>(k)].ins)
      if (std::find(sp.stages[static_cast<std::size_t>(k - 1)].outs.begin(), sp.stages[static_cast<std::size_t>(k - 1)].outs.end(), a) !=
          sp.stages[static_cast<std::size_t>(k - 1)].outs.end())
        act_in[static_cast<std::size_t>(k)].push_back(a);
  for (int k = 0; k < S; ++k) {
    auto ku = static_cast<std::size_t>(k);
    std::vector<char> writes(T.names.size(), 0);
    for (int j : bwd[ku])
      for (NameId n : T.outs(T.ops[static_cast<std::size_t>(j)])) writes[static_cast<std::size_t>(n)] = 1;
    for (NameId a : act_in[ku])
      if (NameId g = grad_of[static_cast<std::size_t>(a)]; g >= 0 && writes[static_cast<std::size_t>(g)]) grad_out[ku].push_back(g);
    for (std::size_t n = 0; n < T.names.size(); ++n)
      if (grad_param[n] >= 0 && writes[n] && param_stage[static_cast<std::size_t>(grad_param[n])] == k) params[ku].push_back(grad_param[n]);
    // I (zero bubble): the backward ops the input gradients need; W: the rest (the parameter gradients).
    std::vector<char> needed(T.names.size(), 0), in_i(T.ops.size(), 0);
    for (NameId g : grad_out[ku]) needed[static_cast<std::size_t>(g)] = 1;
    for (auto it = bwd[ku].rbegin(); it != bwd[ku].rend(); ++it) {
      const Op& op = T.ops[static_cast<std::size_t>(*it)];
      bool need = false;
      for (NameId n : T.outs(op)) need |= needed[static_cast<std::size_t>(n)] != 0;
      if (!need) continue;
      in_i[static_cast<std::size_t>(*it)] = 1;
      for (NameId n : T.ins(op)) needed[static_cast<std::size_t>(n)] = 1;
    }
    for (int j : bwd[ku]) (in_i[static_cast<std::size_t>(j)] ? iops[ku] : wops[ku]).push_back(j);
  }
  // The last writer in the step of each name (what a received value is an instance of).
  std::vector<int> last_writer(T.names.size(), -1);
  for (std::size_t j = 0; j < fr; ++j)
    for (NameId n : T.outs(T.ops[j])) last_writer[static_cast<std::size_t>(n)] = static_cast<int>(j);

  // ---- the lowered program ------------------------------------------------------------------------------------
  // Every microbatch runs every stage's forward and backward once (and each rank its program once per step): the size
  // is known before anything is built.
  {
    double n_ops = static_cast<double>(fr - 0) * static_cast<double>(N) + static_cast<double>(T.ops.size() - fs) + 8.0 * static_cast<double>(N) * S;
    if (n_ops > static_cast<double>(kMaxOps))
      throw LoadError(sp.loc, fmt::format("the schedule's per-rank programs would have about {:.0f} ops ({} microbatches x the {} ops of one microbatch's step); "
                                          "the limit is {}",
                                          n_ops, N, fr, kMaxOps));
  }
  Program L = T;
  L.ops.clear();
  L.programs.clear();
  L.per_rank = true;
  L.schedule = ScheduleSpec{};
  L.train = L.has_backward = L.has_grad_sync = L.has_spec = L.has_expect = false;
  L.backward.clear(), L.grad_sync.clear(), L.spec_ops.clear(), L.spec_outputs.clear(), L.lineage.clear(), L.expect.clear(), L.outputs.clear();
  L.loss = -1;
  L.tensors.assign(p.tensors.begin(), p.tensors.end());
  TensorDecl seed_decl = T.tensors.back();
  for (auto& x : seed_decl.placement)
    if (x.is_p()) x = Placement::r();  // every rank seeds its own backward with the same value (loss.backward())
  L.tensors.push_back(seed_decl);
  auto& meta = out.meta;
  // Microbatch inputs: part j of each rank's block of a batch input (the spec sees the whole batch).
  std::vector<std::vector<NameId>> part_name(T.names.size());
  for (const BatchSplit& b : sp.batch) {
    const TensorDecl *mbd = nullptr, *full = nullptr;  // the microbatch's shape (the step's), the input's placement
    for (const auto& t : q.tensors)
      if (t.name == b.name) mbd = &t;
    for (const auto& t : p.tensors)
      if (t.name == b.name) full = &t;
    for (std::int64_t j = 0; j < N; ++j) {
      TensorDecl d = *mbd;
      d.placement = full->placement;
      d.name = L.intern(fmt::format("{}@mb{}", p.name(b.name), j));
      d.param = false;
      L.tensors.push_back(d);
      part_name[static_cast<std::size_t>(b.name)].push_back(d.name);
      meta.microbatches.push_back({d.name, b.name, b.dim, j, N, {}, {}});
    }
    // an `order:` other than each microbatch its own part: said where the value check names an op that reads it
    std::vector<std::int64_t> reads(static_cast<std::size_t>(N), 0);
    bool identity = true;
    for (std::size_t k = 0; k < b.order.size(); ++k) {
      identity &= b.order[k] == static_cast<std::int64_t>(k);
      if (b.order[k] >= 0 && b.order[k] < N) ++reads[static_cast<std::size_t>(b.order[k])];
    }
    if (!b.order.empty() && !identity) {
      std::string twice, never;
      for (std::int64_t j = 0; j < N; ++j) {
        auto r = reads[static_cast<std::size_t>(j)];
        if (r > 1) twice += fmt::format("{}{}", twice.empty() ? "" : ", ", j);
        if (r == 0) never += fmt::format("{}{}", never.empty() ? "" : ", ", j);
      }
      std::string text = twice.empty() ? "reads the parts in another order than the microbatches' (shuffled microbatches)"
                                       : fmt::format("reads part {} more than once and part {} never (a dropped microbatch)", twice, never);
      for (std::int64_t j = 0; j < N; ++j) {
        auto& m = meta.microbatches[meta.microbatches.size() - static_cast<std::size_t>(N) + static_cast<std::size_t>(j)];
        m.order_loc = b.loc, m.order_text = text;
      }
    }
  }
  std::vector<const BatchSplit*> batch_of(T.names.size(), nullptr);
  for (const BatchSplit& b : sp.batch) batch_of[static_cast<std::size_t>(b.name)] = &b;
  std::unordered_map<std::int64_t, NameId> renamed;
  auto mb_name = [&](NameId n, std::int64_t k) -> NameId {
    auto nu = static_cast<std::size_t>(n);
    if (n == seed) return n;
    if (nu < batch_of.size() && batch_of[nu]) {
      const BatchSplit& b = *batch_of[nu];
      return part_name[nu][static_cast<std::size_t>(b.order.empty() ? k : b.order[static_cast<std::size_t>(k)])];
    }
    if (nu < declared.size() && declared[nu]) return n;
    std::int64_t key = static_cast<std::int64_t>(n) * (N + 1) + k;
    auto it = renamed.find(key);
    if (it != renamed.end()) return it->second;
    NameId r = L.intern(fmt::format("{}@mb{}", T.name(n), k));
    renamed.emplace(key, r);
    return r;
  };
  auto note = [&](int family, std::int64_t k, bool derived, bool generated) {
    meta.family.push_back(family);
    meta.mb.push_back(static_cast<int>(k));
    meta.derived.push_back(derived);
    meta.generated.push_back(generated);
  };
  std::vector<NameId> ins, outs;
  auto emit_copy = [&](int j, std::int64_t k, bool per_mb) {
    const Op& op = T.ops[static_cast<std::size_t>(j)];
    ins.clear(), outs.clear();
    for (NameId n : T.ins(op)) ins.push_back(per_mb ? mb_name(n, k) : n);
    for (NameId n : T.outs(op)) outs.push_back(per_mb ? mb_name(n, k) : n);
    L.add_op(op, ins, outs);
    note(j, per_mb ? k : -1, static_cast<std::size_t>(j) >= nf && static_cast<std::size_t>(j) < fr, false);
  };
  auto emit = [&](OpKind kind, Loc l, std::vector<NameId> in, std::vector<NameId> o, int family, std::int64_t k, bool generated) -> Op& {
    Op op;
    op.kind = kind;
    op.loc = l;
    Op& r = L.add_op(op, in, o);
    note(family, k, false, generated);
    return r;
  };
  auto scalar = [](Op& op, double v) -> Op& { return op.attrs.number = v, op.attrs.has_number = true, op; };
  std::vector<int> owner = stage_owners(s);
  std::vector<LoweredStep> steps;
  Program O = lower_schedule(s, P2PModel::Eager, &steps);
  auto peer = [&](const Op& op) {
    std::int64_t r = O.coords[op.attrs.coords][0].second;
    L.coords.push_back({{axis, r}});
    return static_cast<std::uint32_t>(L.coords.size() - 1);
  };
  // What a Send, Recv or Wait carries: the outputs of a stage (F) or the gradients of its activation inputs (B).
  auto carried = [&](const LoweredStep& x) -> const std::vector<NameId>& {
    bool f = x.type == ActionType::SendF || x.type == ActionType::RecvF;
    return f ? sp.stages[static_cast<std::size_t>(x.stage)].outs : grad_out[static_cast<std::size_t>(x.stage)];
  };
  for (std::size_t r = 0; r < O.programs.size(); ++r) {
    RankProgram rp;
    rp.loc = sp.stages_loc;
    rp.selector = {{axis, static_cast<std::int64_t>(r)}};
    rp.first_op = static_cast<std::uint32_t>(L.ops.size());
    const RankProgram& orp = O.programs[r];
    std::vector<char> started(T.names.size(), 0), synced(static_cast<std::size_t>(S), 0), owns(static_cast<std::size_t>(S), 0);
    for (int k = 0; k < S; ++k) owns[static_cast<std::size_t>(k)] = owner[static_cast<std::size_t>(k)] == static_cast<int>(r);
    auto optimize = [&] {
      for (std::size_t j = fo; j < T.ops.size(); ++j) {
        const Op& op = T.ops[j];
        int st = optim_stage[j - fo];
        if (op.kind == OpKind::GradNormSq) {  // the gradients of the rank's stages (and any of no stage)
          ins.clear(), outs.clear();
          for (NameId n : T.ins(op))
            if (int x = name_stage[static_cast<std::size_t>(n)]; x < 0 || owns[static_cast<std::size_t>(x)]) ins.push_back(n);
          for (NameId n : T.outs(op)) outs.push_back(n);
          L.add_op(op, ins, outs).attrs.matches = outs[0];  // the ranks' gradients differ; the norm is one logical tensor
          note(static_cast<int>(j), -1, false, false);
        } else if (st < 0 || owns[static_cast<std::size_t>(st)]) {
          emit_copy(static_cast<int>(j), -1, false);
        }
      }
    };
    auto accumulate = [&](int stage, std::int64_t k) {
      for (NameId w : params[static_cast<std::size_t>(stage)]) {
        NameId g = grad_of[static_cast<std::size_t>(w)], gk = mb_name(g, k);
        Loc l = sp.stages[static_cast<std::size_t>(stage)].loc;
        if (!std::exchange(started[static_cast<std::size_t>(g)], 1)) scalar(emit(OpKind::Add, l, {gk}, {g}, -1, k, true), 0.0);
        else emit(OpKind::Add, l, {g, gk}, {g}, -1, k, true);
      }
    };
    for (std::int64_t step = 0; step < K; ++step) {
      for (std::uint32_t oi = orp.first_op; oi < orp.first_op + orp.n_ops; ++oi) {
        const Op& oop = O.ops[oi];
        const LoweredStep& x = steps[oi];
        std::int64_t k = step * M + x.mb;
        auto ku = static_cast<std::size_t>(x.stage >= 0 ? x.stage : 0);
        if (oop.kind == OpKind::Send) {
          for (NameId n : carried(x)) emit(OpKind::Send, sp.stages[ku].loc, {mb_name(n, k)}, {}, -1, k, false).attrs.coords = peer(oop);
          continue;
        }
        if (oop.kind == OpKind::Recv) {
          for (NameId n : carried(x)) {
            NameId v = mb_name(n, k);
            Op& op = emit(OpKind::Recv, sp.stages[ku].loc, {}, {v}, last_writer[static_cast<std::size_t>(n)], k, false);
            op.attrs.coords = peer(oop);
            op.attrs.matches = v;
            if (oop.attrs.handle >= 0) op.attrs.handle = v;
          }
          continue;
        }
        if (oop.kind == OpKind::Wait) {
          for (NameId n : carried(x)) emit(OpKind::Wait, sp.stages[ku].loc, {}, {}, -1, k, false).attrs.handle = mb_name(n, k);
          continue;
        }
        // A Step: the stage's part of the one-microbatch step.
        switch (x.type) {
          case ActionType::F:
            for (int j : fwd[ku]) emit_copy(j, k, true);
            break;
          case ActionType::B:
            for (int j : bwd[ku]) emit_copy(j, k, true);
            accumulate(x.stage, k);
            break;
          case ActionType::I:
            for (int j : iops[ku]) emit_copy(j, k, true);
            break;
          case ActionType::W:
            for (int j : wops[ku]) emit_copy(j, k, true);
            accumulate(x.stage, k);
            break;
          case ActionType::ReduceGrad:
            if (step + 1 == K && !synced[ku]) {
              for (int j : sync[ku]) emit_copy(j, -1, false);
              synced[ku] = 1;
            }
            break;
          case ActionType::Unshard:
          case ActionType::Reshard:
          case ActionType::SendF:
          case ActionType::RecvF:
          case ActionType::SendB:
          case ActionType::RecvB:
          case ActionType::OverlapFB: break;
        }
      }
      // PyTorch's scale_grads: after its last backward of the step, a stage divides its gradients by the microbatches.
      if (sp.scale_grads)
        for (int k = 0; k < S; ++k)
          if (owner[static_cast<std::size_t>(k)] == static_cast<int>(r))
            for (NameId w : params[static_cast<std::size_t>(k)]) {
              NameId g = grad_of[static_cast<std::size_t>(w)];
              scalar(emit(OpKind::Multiply, sp.scale_grads_loc, {g}, {g}, -1, -1, false), 1.0 / static_cast<double>(M));
            }
    }
    // grad_sync: after the stage's last backward (the end of the rank's program), unless a REDUCE_GRAD placed it.
    for (int k = 0; k < S; ++k)
      if (owns[static_cast<std::size_t>(k)] && !synced[static_cast<std::size_t>(k)]) {
        for (int j : sync[static_cast<std::size_t>(k)]) emit_copy(j, -1, false);
        synced[static_cast<std::size_t>(k)] = 1;
      }
    optimize();  // optimizer.step() after the schedule's last run: every stage of the rank has run its grad_sync
    // The last stage's outputs gathered over the microbatches (`merge:`).
    if (owner[static_cast<std::size_t>(S - 1)] == static_cast<int>(r))
      for (const MergeSpec& m : sp.merge) {
        for (std::int64_t k = 0; k < N; ++k) {
          NameId v = mb_name(m.name, k);
          if (k == 0) scalar(emit(OpKind::Add, m.loc, {v}, {m.name}, -1, -1, true), 0.0);
          else if (m.kind == MergeSpec::Concat) emit(OpKind::Concat, m.loc, {m.name, v}, {m.name}, -1, -1, true).attrs.dim = static_cast<std::int16_t>(m.dim);
          else emit(OpKind::Add, m.loc, {m.name, v}, {m.name}, -1, -1, true);
        }
        if (m.kind == MergeSpec::Mean) scalar(emit(OpKind::Multiply, m.loc, {m.name}, {m.name}, -1, -1, true), 1.0 / static_cast<double>(N));
      }
    rp.n_ops = static_cast<std::uint32_t>(L.ops.size()) - rp.first_op;
    L.programs.push_back(std::move(rp));
  }
  // What is compared: the merged outputs (on the last stage's ranks) and every parameter's gradient (on its stage's),
  // read by the placement it has when it reaches the optimizer.
  std::vector<const ValueType*> last_type(T.names.size(), nullptr);
  for (std::size_t i = 0; i < T.ops.size(); ++i) {
    auto o = T.outs(T.ops[i]);
    for (std::size_t k = 0; k < o.size(); ++k) last_type[static_cast<std::size_t>(o[k])] = &st.out(i, static_cast<int>(k));
  }
  for (const auto& od : p.outputs) {
    OutputDecl d = od;
    if (d.ranks.empty()) d.ranks = {{axis, owner[static_cast<std::size_t>(S - 1)]}};
    L.outputs.push_back(d);
  }
  for (const auto& d : p.tensors) {
    NameId g = grad_of[static_cast<std::size_t>(d.name)];
    if (!d.param || g < 0 || !last_type[static_cast<std::size_t>(g)] || param_stage[static_cast<std::size_t>(d.name)] < 0) continue;
    out.grads.push_back({g, add_axis(last_type[static_cast<std::size_t>(g)]->pl, axis, T.axis_count()), d.loc,
                         {{axis, owner[static_cast<std::size_t>(param_stage[static_cast<std::size_t>(d.name)])]}}});
  }
  // The copies of the loss the ranks differentiate: the axes (but the pipeline's) on which the loss is R or P(avg).
  if (const ValueType* lt = last_type[static_cast<std::size_t>(p.loss)])
    for (int a = 0; a < T.axis_count(); ++a) {
      if (a == axis) continue;
      Placement x = lt->pl[static_cast<std::size_t>(a < axis ? a : a - 1)];  // the step's types have no pipeline axis
      if (!(x.is_r() || (x.is_p() && x.op == ReduceOp::Avg))) continue;
      ExprId e = T.mesh[static_cast<std::size_t>(a)].size;
      if (!T.exprs.is_const(e)) return out.why = fmt::format("mesh axis {} has a symbolic size", T.mesh[static_cast<std::size_t>(a)].name), out;
      out.n_copies *= static_cast<double>(T.exprs.value(e));
    }
  // The optimizer's results: read on the ranks of their stage (every rank: a value of no stage), by the placement of
  // the step's last write.
  out.optim_writes = equiv_detail::optimizer_writes(T, fo);
  out.optim_pl.resize(T.names.size());
  out.optim_ranks.resize(T.names.size());
  for (std::size_t n = 0; n < T.names.size(); ++n) {
    if (out.optim_writes[n] && last_type[n]) out.optim_pl[n] = add_axis(last_type[n]->pl, axis, T.axis_count());
    if (name_stage[n] >= 0) out.optim_ranks[n] = {{axis, owner[static_cast<std::size_t>(name_stage[n])]}};
  }
  out.seed = seed;
  out.step_ops = T.ops;
  out.step_types = std::move(st);
  out.program = std::move(L);
  out.built = true;
  return out;
}

namespace equiv_detail {

TrainingPair pipeline_pair(const Program& p) {
  TrainingPair r;
  PipelineLowering pl;
  try {
    pl = lower_pipeline(p, program_schedule(p, p.file));
  } catch (const LoadError& e) {
    return r.why = fmt::format("the schedule cannot be lowered (line {}: {})", e.loc.line, e.what()), r;
  }
  if (!pl.built) {
    if (pl.why.empty())
      for (const auto& d : pl.diags)
        if (d.severity == Severity::Error) {
          pl.why = fmt::format("the stages' training step has errors (line {}: {})", d.loc.line, d.message);
          break;
        }
    return r.why = pl.why, r;
  }
  if (!p.has_spec) return r.why = "a pipelined schedule is compared with a `spec:` (the whole-batch step on one device)", r;
  if (pl.grads.empty()) return r.why = "no parameter gets a gradient (mark parameters with `param: true`)", r;
  Program& L = pl.program;
  Program c;
  if (std::string why = spec_pair(p, L, L.ops, pl.seed, pl.grads, pl.n_copies, r, c); !why.empty()) return r.why = why, r;
  c.programs = L.programs;
  c.per_rank = true;
  c.tensors = L.tensors;
  c.outputs = L.outputs;
  add_grad_outputs(c, pl.grads);
  optimizer_outputs(
      p, pl.optim_writes, [&](NameId n) { return pl.optim_writes[static_cast<std::size_t>(n)] ? &pl.optim_pl[static_cast<std::size_t>(n)] : nullptr; },
      [&](NameId n) { return pl.optim_ranks[static_cast<std::size_t>(n)]; }, c);
  r.microbatches = std::move(pl.meta.microbatches);
  r.family = std::move(pl.meta.family);
  r.plan_typed = std::move(pl.step_ops);  // (the step's ops: what each lowered op is an instance of, equiv/reduce.h)
  r.plan_types = std::move(pl.step_types);
  r.mb = std::move(pl.meta.mb);
  r.generated = std::move(pl.meta.generated);
  r.derived = std::move(pl.meta.derived);
  finish_pair(c, r);
  return r;
}

}  // namespace equiv_detail

}  // namespace spmd
