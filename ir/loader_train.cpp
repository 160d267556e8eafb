// ir/loader_train.cpp - training keys (loss, train, backward, grad_sync, optimizer), outputs and expect.
#include "ir/loader_impl.h"

#include <cmath>

namespace spmd::load_detail {

// ---- training: loss, train, backward, grad_sync, optimizer ----------------------------------
void Loader::load_training(N root) {
  if (!root["loss"].IsDefined() && !root["train"].IsDefined() && !root["backward"].IsDefined() && !root["grad_sync"].IsDefined() &&
      !root["optimizer"].IsDefined())
    return;
  // A backward appended after per-rank programs would belong to no rank's op range and never be checked:
  // refuse it rather than pass it unchecked.
  if (p_.per_rank)
    for (const char* k : {"train", "backward", "grad_sync", "optimizer", "loss"})
      if (root[k].IsDefined())
        fail(find_key(root, k), std::string("`") + k + "` with per-rank `programs:` is not supported yet: the backward is derived and checked for " +
                                    "one program run by every rank (`ops:`); write each rank's backward ops into its own program");
  std::unordered_set<NameId> defined;
  for (const auto& t : p_.tensors) defined.insert(t.name);
  for (const auto& op : p_.ops)
    for (NameId o : p_.outs(op)) defined.insert(o);
  for (const auto& st : p_.schedule.stages)  // a pipelined schedule: what its stages compute
    for (const auto& op : st.ops)
      for (NameId o : p_.outs(op)) defined.insert(o);
  auto sorted_names = [&](const std::unordered_set<NameId>& s) {
    std::vector<std::string> v;
    for (NameId id : s) v.push_back(p_.name(id));
    std::sort(v.begin(), v.end());
    return v;
  };
  auto loss = root["loss"];
  if (loss.IsDefined()) {
    if (!loss.IsScalar() || loss.Scalar().empty()) fail(loss, "`loss` must name the tensor the backward starts from, e.g. loss: loss");
    auto it = p_.name_ids.find(loss.Scalar());
    if (it == p_.name_ids.end() || !defined.count(it->second))
      fail(loss, "loss '" + loss.Scalar() + "' is neither a declared tensor nor written by any op" + suggestion(loss.Scalar(), sorted_names(defined)));
    p_.loss = it->second;
    p_.loss_loc = loss.loc();
  }
  auto need_loss = [&](N k, const std::string& what) {
    if (p_.loss < 0) fail(k, what + " needs a `loss:` (the tensor the backward starts from, e.g. loss: loss)");
  };
  if (auto t = root["train"]; t.IsDefined()) {
    p_.train = load_bool(t, "`train`");
    p_.train_loc = t.loc();
    if (p_.train) need_loss(t, "`train: true`");
  }
  // Gradient names: `<tensor>.grad`, as PyTorch's x.grad. The backward starts from `<loss>.grad`.
  auto is_grad = [&](NameId id) {
    const std::string& n = p_.name(id);
    if (n.size() <= 5 || n.compare(n.size() - 5, 5, ".grad") != 0) return false;
    auto it = p_.name_ids.find(n.substr(0, n.size() - 5));
    return it != p_.name_ids.end() && defined.count(it->second) > 0;
  };
  auto load_list = [&](N n, std::vector<Op>& list, const std::string& key, bool any_grad) {
    if (n.IsNull()) return;
    if (!n.IsSequence()) fail(n, "`" + key + "` must be a list of ops like {op: MatMul, in: [y.grad, w], out: x.grad}");
    if (n.size() > kMaxOps) fail(n, "`" + key + "` has too many ops");
    target_ = &list;
    for (const auto& item : n) {
      load_op(item);
      const Op& op = list.back();
      for (NameId in : p_.ins(op))
        if (!defined.count(in) && !(any_grad && is_grad(in))) {
          std::vector<std::string> cands = sorted_names(defined);
          fail(item["in"].IsDefined() ? item["in"] : item,
               "`" + key + "` op " + std::string(op_name(op.kind)) + " reads '" + p_.name(in) +
                   "', which no declaration, forward op or earlier " + key + " op defines" + suggestion(p_.name(in), cands) +
                   " (gradients are named <tensor>.grad; the backward starts from " + p_.name(p_.loss) + ".grad)");
        }
      for (NameId o : p_.outs(op)) defined.insert(o);
    }
    target_ = &p_.ops;
  };
  if (auto b = root["backward"]; b.IsDefined()) {
    auto key = find_key(root, "backward");
    need_loss(key, "`backward:`");
    p_.has_backward = true;
    p_.backward_loc = key.loc();
    defined.insert(p_.intern(p_.name(p_.loss) + ".grad"));
    load_list(b, p_.backward, "backward", false);
  }
  if (auto g = root["grad_sync"]; g.IsDefined()) {
    auto key = find_key(root, "grad_sync");
    need_loss(key, "`grad_sync:`");
    p_.has_grad_sync = true;
    p_.grad_sync_loc = key.loc();
    load_list(g, p_.grad_sync, "grad_sync", !p_.has_backward);
  }
  // The optimizer step: after grad_sync, on the gradients, parameters and optimizer states (docs/format.md, "Optimizer").
  if (auto o = root["optimizer"]; o.IsDefined()) {
    auto key = find_key(root, "optimizer");
    need_loss(key, "`optimizer:`");
    if (p_.schedule.present && p_.schedule.stages.empty())  // a schedule of bare actions has no ops to update
      fail(key, "`optimizer:` with a `schedule:` needs `stages:` (the stages' ops and parameters the update runs on)");
    p_.has_optimizer = true;
    p_.optimizer_loc = key.loc();
    load_list(o, p_.optimizer, "optimizer", !p_.has_backward);
  }
}

N Loader::find_key(N map, const std::string& key) {
  N k = map.key_node(key);
  return k.IsDefined() ? k : map;
}

// ---- outputs and expectations -------------------------------------------------------------
void Loader::load_outputs(N n) {
  if (!n.IsMap()) fail(n, "`outputs` must be a mapping of name -> {placement: ...}");
  std::vector<char> defined(p_.names.size());  // by NameId: a flat table, not a hash set of a million names
  for (const auto& t : p_.tensors) defined[static_cast<std::size_t>(t.name)] = 1;
  for (const auto& op : p_.ops)
    for (NameId o : p_.outs(op)) defined[static_cast<std::size_t>(o)] = 1;
  for (const auto& m : p_.schedule.merge) defined[static_cast<std::size_t>(m.name)] = 1;  // a pipelined schedule's gathered outputs
  for_each_key(n, {}, "`outputs`", [&](N k, N v) {
    OutputDecl o;
    const std::string& name = k.Scalar();
    auto it = p_.name_ids.find(name);
    if (it == p_.name_ids.end() || !defined[static_cast<std::size_t>(it->second)]) {
      std::vector<std::string> cands;
      for (std::size_t id = 0; id < defined.size(); ++id)
        if (defined[id]) cands.push_back(p_.name(static_cast<NameId>(id)));
      std::sort(cands.begin(), cands.end());
      fail(k, "output '" + name + "' is neither a declared tensor nor written by any op" + suggestion(name, cands));
    }
    o.name = it->second;
    o.loc = k.loc();
    if (!v.IsNull()) {
      if (!v.IsMap()) fail(v, "output '" + name + "' must be a mapping like {placement: {dp: S(0)}}");
      for_each_key(v, {"placement", "shape", "ranks"}, "output '" + name + "'", [&](N key, N x) {
        if (key.Scalar() == "placement") {
          o.has_placement = true;
          o.placement = load_placements(x, -1, "output '" + name + "'");
        } else if (key.Scalar() == "ranks") {
          o.ranks = load_coords(x, "`ranks` of output '" + name + "'");
          for (auto [a, c] : o.ranks)
            if (!p_.exprs.is_const(p_.mesh[static_cast<std::size_t>(a)].size))
              fail(x, "`ranks` of output '" + name + "' names mesh axis " + p_.mesh[static_cast<std::size_t>(a)].name +
                          ", which needs a concrete size in `mesh`");
        } else {
          o.has_shape = true;
          o.shape = load_shape(x, "output '" + name + "'", nullptr);
        }
      });
    }
    p_.outputs.push_back(std::move(o));
  });
}

void Loader::load_expect(N n) {
  p_.has_expect = true;
  p_.expect_loc = n.loc();
  if (n.IsNull()) return;
  if (!n.IsSequence()) fail(n, "`expect` must be a list of check IDs, e.g. [partial-misuse] or []");
  std::vector<std::string> ids;
  for (auto id : all_check_names()) ids.emplace_back(id);
  for (const auto& x : n) {
    if (!x.IsScalar() || !check_by_name(x.Scalar()))
      fail(x, "unknown check ID " + kind_of(x) + (x.IsScalar() ? suggestion(x.Scalar(), ids) : "") + " in `expect`");
    p_.expect.push_back(x.Scalar());
  }
}

}  // namespace spmd::load_detail
