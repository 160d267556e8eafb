// ir/loader_spec.cpp - `spec:`, the single-device model a plan must equal (docs/format.md, "Equivalence").
//
// spec: {ops: [...], outputs: [names] | {plan_output: spec_tensor}, lineage: {plan_tensor: spec_tensor}, optimizer: [...]}
// Spec ops are loaded like `ops:` items (the same op table, attributes, modules and located errors) into
// Program::spec_ops, always in the global view; they read the declared (global) tensors and earlier spec ops only. Every plan output is
// compared with a spec tensor: a plan output left out would be a value nobody checks, so it is an error.
#include "ir/loader_impl.h"

namespace spmd::load_detail {

namespace {

std::vector<std::string> sorted_names(const Program& p, const std::vector<char>& set) {
  std::vector<std::string> v;
  for (std::size_t id = 0; id < set.size(); ++id)
    if (set[id]) v.push_back(p.name(static_cast<NameId>(id)));
  std::sort(v.begin(), v.end());
  return v;
}

// "; did you mean 'y_full'?": a name the word begins (a spec tensor named after the plan's: y -> y_full, y.spec),
// else the nearest by edit distance.
std::string near(const std::string& word, const std::vector<std::string>& cands) {
  for (const auto& c : cands)
    if (c.size() > word.size() + 1 && c.compare(0, word.size(), word) == 0 && (c[word.size()] == '_' || c[word.size()] == '.'))
      return "; did you mean '" + c + "'?";
  return suggestion(word, cands);
}

}  // namespace

void Loader::load_spec(N root) {
  N n = root["spec"];
  if (!n.IsDefined()) return;
  N key = find_key(root, "spec");
  if (n.IsNull() || !n.IsMap())
    fail(n.IsNull() ? key : n, "`spec` must be a mapping {ops: [...], outputs: [names]}: the single-device model the plan must equal");
  if (p_.schedule.present && p_.schedule.stages.empty())
    fail(key,
         "`spec` with a `schedule` needs `stages:` in the schedule (the module each stage runs): with opaque steps the plan computes no "
         "values; write the stages under `stages:` or as `programs:`");
  for_each_key(n, {"ops", "outputs", "lineage", "optimizer"}, "`spec`", [](N, N) {});
  N ops = n["ops"], outs = n["outputs"], lineage = n["lineage"];
  bool no_ops = !ops.IsDefined() || ops.IsNull() || (ops.IsSequence() && ops.size() == 0);
  bool no_outs = !outs.IsDefined() || outs.IsNull() || (outs.size() == 0 && (outs.IsSequence() || outs.IsMap()));
  if (no_ops && no_outs)
    fail(n,
         "`spec` has no ops and no outputs: give the single-device model as `ops:` and name the tensors compared with the plan's "
         "outputs under `outputs:`");
  p_.has_spec = true;
  p_.spec_loc = key.loc();

  // Spec ops: over the declared tensors and earlier spec ops only (the plan's intermediates are per rank).
  auto mark = [&](std::vector<char>& set, NameId id) {
    if (static_cast<std::size_t>(id) >= set.size()) set.resize(p_.names.size() + 1);
    set[static_cast<std::size_t>(id)] = 1;
  };
  auto has = [](const std::vector<char>& set, NameId id) { return static_cast<std::size_t>(id) < set.size() && set[static_cast<std::size_t>(id)]; };
  std::vector<char> spec_def(p_.names.size());
  for (const auto& t : p_.tensors) mark(spec_def, t.name);
  if (!ops.IsDefined() || ops.IsNull()) {
  } else if (!ops.IsSequence()) {
    fail(ops, "`ops` of `spec` must be a list of ops like {op: MatMul, in: [x, w], out: y} (the single-device model)");
  } else {
    if (ops.size() > kMaxOps) fail(ops, "`ops` of `spec` has too many ops (the limit is 10,000,000)");
    // The spec is global in both views: its size attributes are read as in the global view (no axis_index,
    // no mesh axis names as sizes), whatever `view:` says for the plan.
    struct GlobalView {
      bool& flag;
      bool saved;
      explicit GlobalView(bool& f) : flag(f), saved(f) { flag = false; }
      ~GlobalView() { flag = saved; }
    } global_view(p_.local_view);
    target_ = &p_.spec_ops;
    for (const auto& item : ops) {
      std::size_t first = p_.spec_ops.size();
      load_item(item);
      for (std::size_t i = first; i < p_.spec_ops.size(); ++i) {
        const Op& op = p_.spec_ops[i];
        for (NameId in : p_.ins(op))
          if (!has(spec_def, in)) {
            target_ = &p_.ops;
            fail(item.IsMap() && item["in"].IsDefined() ? item["in"] : item,
                 "`spec` op " + std::string(op_name(op.kind)) + " reads '" + p_.name(in) + "', which no declared tensor or earlier spec op defines" +
                     near(p_.name(in), sorted_names(p_, spec_def)) + " (the spec runs on one device over the global tensors of `tensors:`)");
          }
        for (NameId o : p_.outs(op)) mark(spec_def, o);
      }
    }
    target_ = &p_.ops;
  }
  spec_def.resize(p_.names.size());
  load_spec_optimizer(n, key, spec_def);

  // The plan's names: declared tensors and everything its ops (forward, backward, grad_sync) write.
  std::vector<char> plan_def(p_.names.size());
  for (const auto& t : p_.tensors) mark(plan_def, t.name);
  for (const auto* list : {&p_.ops, &p_.backward, &p_.grad_sync, &p_.optimizer})
    for (const auto& op : *list)
      for (NameId o : p_.outs(op)) mark(plan_def, o);
  for (const auto& st : p_.schedule.stages)
    for (const auto& op : st.ops)
      for (NameId o : p_.outs(op)) mark(plan_def, o);
  std::vector<char> plan_out(p_.names.size());
  for (const auto& o : p_.outputs) mark(plan_out, o.name);

  auto spec_tensor = [&](N v, const std::string& what) {
    if (!v.IsScalar() || v.Scalar().empty()) fail(v, what + " must name a spec tensor, got " + kind_of(v));
    auto it = p_.name_ids.find(v.Scalar());
    if (it == p_.name_ids.end() || !has(spec_def, it->second))
      fail(v, what + " is neither a declared tensor nor written by any spec op" + near(v.Scalar(), sorted_names(p_, spec_def)));
    return it->second;
  };
  auto plan_output = [&](N k) {
    if (!k.IsScalar() || k.Scalar().empty()) fail(k, "a compared output must name a plan output, got " + kind_of(k));
    auto it = p_.name_ids.find(k.Scalar());
    if (it == p_.name_ids.end() || !has(plan_out, it->second)) {
      std::string hint = p_.outputs.empty() ? " (the program declares no `outputs:`: list the plan's outputs there, with their placements)"
                                            : " (the plan's outputs: " + join(sorted_names(p_, plan_out)) + ")";
      fail(k, "'" + k.Scalar() + "' in `outputs` of `spec` is not an output of the plan" + suggestion(k.Scalar(), sorted_names(p_, plan_out)) + hint);
    }
    for (const auto& l : p_.spec_outputs)
      if (l.plan == it->second) fail(k, "plan output '" + k.Scalar() + "' is compared twice in `outputs` of `spec`");
    return it->second;
  };

  // outputs: a list (each plan output with the spec tensor of its name), a map, or absent (every plan output by name).
  if (!outs.IsDefined() || outs.IsNull()) {
    for (const auto& o : p_.outputs) {
      if (!has(spec_def, o.name))
        fail_at(o.loc, "plan output '" + p_.name(o.name) +
                           "' has no spec tensor of its name to be compared with (the spec names none under "
                           "`outputs`, so each plan output is compared by name): write '" +
                           p_.name(o.name) + "' in the spec's ops, or map it under `outputs` of `spec`, e.g. {" + p_.name(o.name) + ": spec_tensor}" +
                           near(p_.name(o.name), sorted_names(p_, spec_def)));
      p_.spec_outputs.push_back({o.name, o.name, o.loc});
    }
  } else if (outs.IsSequence()) {
    for (const auto& x : outs) {
      NameId id = plan_output(x);
      spec_tensor(x, "spec output '" + x.Scalar() + "'");
      p_.spec_outputs.push_back({id, id, x.loc()});
    }
  } else if (outs.IsMap()) {
    for_each_key(outs, {}, "`outputs` of `spec`", [&](N k, N v) {
      NameId id = plan_output(k);
      NameId s = spec_tensor(v, "spec tensor '" + v.Scalar() + "' (compared with plan output '" + k.Scalar() + "')");
      p_.spec_outputs.push_back({id, s, k.loc()});
    });
  } else {
    fail(outs, "`outputs` of `spec` must be a list of names (plan output = spec tensor of the same name) or a mapping {plan_output: spec_tensor}");
  }
  // Every plan output is compared: one left out is a value the equivalence never checks.
  for (const auto& o : p_.outputs)
    if (std::none_of(p_.spec_outputs.begin(), p_.spec_outputs.end(), [&](const Program::SpecLink& l) { return l.plan == o.name; }))
      fail(outs, "plan output '" + p_.name(o.name) + "' (line " + std::to_string(o.loc.line) +
                     ") is not compared with the spec: name it in `outputs` of `spec` (or map it to a spec tensor), or remove it from `outputs:`");
  bool pipelined = p_.schedule.present && !p_.schedule.stages.empty();  // compares every parameter's gradient anyway
  if (p_.spec_outputs.empty() && !pipelined && !(p_.loss >= 0 && (p_.train || p_.has_backward)))  // a training step compares its loss and gradients
    fail(outs.IsDefined() ? outs : key,
         "`spec` compares nothing: declare the plan's results under `outputs:` (with their placements) and name "
         "them in `outputs` of `spec`");

  // lineage: {plan_tensor: spec_tensor}, intermediate points (equal names are implicit).
  if (lineage.IsDefined() && !lineage.IsNull()) {
    if (!lineage.IsMap()) fail(lineage, "`lineage` of `spec` must be a mapping {plan_tensor: spec_tensor}");
    for_each_key(lineage, {}, "`lineage` of `spec`", [&](N k, N v) {
      auto it = p_.name_ids.find(k.Scalar());
      if (it == p_.name_ids.end() || !has(plan_def, it->second))
        fail(k, "'" + k.Scalar() + "' in `lineage` of `spec` is neither a declared tensor nor written by any plan op" +
                    suggestion(k.Scalar(), sorted_names(p_, plan_def)));
      NameId s = spec_tensor(v, "spec tensor '" + v.Scalar() + "' (the lineage of plan tensor '" + k.Scalar() + "')");
      p_.lineage.push_back({it->second, s, k.loc()});
    });
  }
}

// `spec.optimizer`: the single-device update the plan's `optimizer:` must equal. Its ops read declared tensors,
// spec ops' values and the gradients of the spec's derived backward (`<tensor>.grad`); it needs a training program.
void Loader::load_spec_optimizer(N spec, N key, std::vector<char>& spec_def) {
  N o = spec["optimizer"];
  if (!o.IsDefined()) {
    if (p_.has_optimizer)
      fail(key, "the plan has `optimizer:` (line " + std::to_string(p_.optimizer_loc.line) +
                    ") but the spec has none: write the single-device update the plan's must equal under `optimizer:` of `spec` (the same optimizer on "
                    "whole tensors)");
    return;
  }
  N okey = spec.key_node("optimizer");
  if (!p_.has_optimizer)
    fail(okey.IsDefined() ? okey : o,
         "the spec has `optimizer:` but the plan has none: write the plan's update under a top-level `optimizer:` (after `grad_sync:`), or drop the "
         "spec's");
  if (p_.loss < 0) fail(okey.IsDefined() ? okey : o, "`optimizer` of `spec` needs a training program (`loss:`, with `train: true` or `backward:`)");
  p_.has_spec_optimizer = true;
  p_.spec_optimizer_loc = okey.IsDefined() ? okey.loc() : o.loc();
  if (o.IsNull()) return;
  if (!o.IsSequence()) fail(o, "`optimizer` of `spec` must be a list of ops like {op: AdamWUpdate, in: [w, w.grad, m, v], out: [w, m, v], lr: 1e-3}");
  if (o.size() > kMaxOps) fail(o, "`optimizer` of `spec` has too many ops");
  spec_def.resize(p_.names.size());
  auto defined = [&](NameId id) { return static_cast<std::size_t>(id) < spec_def.size() && spec_def[static_cast<std::size_t>(id)]; };
  auto is_grad = [&](NameId id) {
    const std::string& nm = p_.name(id);
    if (nm.size() <= 5 || nm.compare(nm.size() - 5, 5, ".grad") != 0) return false;
    auto it = p_.name_ids.find(nm.substr(0, nm.size() - 5));
    return it != p_.name_ids.end() && defined(it->second);
  };
  target_ = &p_.spec_optimizer;
  for (const auto& item : o) {
    load_op(item);
    const Op& op = p_.spec_optimizer.back();
    for (NameId in : p_.ins(op))
      if (!defined(in) && !is_grad(in)) {
        target_ = &p_.ops;
        fail(item.IsMap() && item["in"].IsDefined() ? item["in"] : item,
             "`optimizer` of `spec` op " + std::string(op_name(op.kind)) + " reads '" + p_.name(in) +
                 "', which no declared tensor, spec op or earlier spec optimizer op defines" + near(p_.name(in), sorted_names(p_, spec_def)) +
                 " (the spec's gradients are named <tensor>.grad)");
      }
    for (NameId out : p_.outs(op)) {
      if (static_cast<std::size_t>(out) >= spec_def.size()) spec_def.resize(p_.names.size(), 0);
      spec_def[static_cast<std::size_t>(out)] = 1;
    }
  }
  target_ = &p_.ops;
}

}  // namespace spmd::load_detail
