// ir/loader.cpp - YAML or JSON -> Program with source positions, streamed from parse events.
//
// One pass, no tree of the whole file: top-level keys are read one at a time (small), and once `mesh` and the
// keys before `ops` are known, each op is loaded as soon as it is parsed and its nodes are dropped. A file
// that does not fit that order (`ops` before `mesh`, `tensors` after `ops`) or that has an error is read
// again as one tree and loaded in the fixed order, so messages never depend on the order of the keys.
#include "ir/loader.h"

#include <optional>

#include "ir/loader_impl.h"
#include "ir/ranks.h"
#include "ir/source_file.h"

#include <cmath>
#include <filesystem>

namespace spmd {

namespace load_detail {

std::string suggestion(const std::string& word, const std::vector<std::string>& cands) {
  // Synonyms a reader from another tool would write, which an edit distance does not find.
  static const std::vector<std::pair<const char*, const char*>> synonyms = {
      {"inputs", "in"},        {"input", "in"},         {"ins", "in"},          {"args", "in"},
      {"operands", "in"},      {"src", "in"},           {"outputs", "out"},     {"output", "out"},
      {"outs", "out"},         {"result", "out"},       {"results", "out"},     {"dst", "out"},
      {"operation", "op"},     {"type", "op"},          {"kind", "op"},         {"name", "op"},
      {"sharding", "placement"}, {"placements", "placement"}, {"layout", "placement"}, {"spec", "placement"},
      {"dims", "shape"},       {"size", "shape"},       {"type", "dtype"},      {"inputs", "tensors"},
      {"params", "tensors"},   {"weights", "tensors"},  {"layers", "ops"},      {"graph", "ops"},
      {"devices", "mesh"},     {"device_mesh", "mesh"}, {"axes", "mesh"},       {"module", "modules"},
      {"includes", "include"}, {"import", "include"},   {"imports", "include"}, {"times", "repeat"},
      {"count", "repeat"},     {"call", "use"},         {"module", "use"},      {"expected", "expect"},
      {"expects", "expect"},   {"formal_in", "in"},     {"args", "with"},       {"arguments", "with"},
  };
  for (const auto& [from, to] : synonyms)
    if (word == from && std::find(cands.begin(), cands.end(), to) != cands.end()) return "; did you mean '" + std::string(to) + "'?";
  auto best = did_you_mean(word, cands);
  return best ? "; did you mean '" + *best + "'?" : "";
}

Loader::Loader(Program& p, std::string file) : p_(p), file_(std::move(file)) {}

void Loader::prelude_head(N root) {
  head_done_ = true;
  if (auto n = root["name"]; n.IsDefined()) {
    if (!n.IsScalar()) fail(n, "`name` must be a string");
    p_.title = n.Scalar();
  }
  auto mesh = root["mesh"];
  if (generalize_ && mesh.IsDefined() && mesh.IsMap())  // the sizes the mesh names stay concrete
    for (auto it = mesh.begin(); it != mesh.end(); ++it) {
      ++it;
      if (!(*it).IsScalar()) continue;
      std::string_view t = (*it).sv();
      for (std::size_t i = 0; i < t.size();) {
        if (std::isalpha(static_cast<unsigned char>(t[i])) || t[i] == '_') {
          std::size_t j = i;
          while (j < t.size() && (std::isalnum(static_cast<unsigned char>(t[j])) || t[j] == '_')) ++j;
          mesh_words_.insert(std::string(t.substr(i, j - i)));
          i = j;
        } else {
          ++i;
        }
      }
    }
  if (auto n = root["sizes"]; n.IsDefined() && !n.IsNull()) load_sizes(n);
  if (auto n = root["view"]; n.IsDefined()) load_view(n);
  if (!mesh.IsDefined()) fail(root, "missing key `mesh` (e.g. mesh: {dp: 2, tp: 4})");
  load_mesh(mesh);
}

void Loader::prelude(N root) {
  prelude_done_ = true;
  if (!head_done_) {
    prelude_head(root);
  } else if (auto n = root["name"]; n.IsDefined()) {  // read after the head ran (errors take the fixed-order pass)
    if (!n.IsScalar()) fail(n, "`name` must be a string");
    p_.title = n.Scalar();
  }
  if (auto n = root["tensors"]; n.IsDefined() && !n.IsNull() && !n.streamed()) load_tensors(n);
  if (auto n = root["include"]; n.IsDefined()) load_includes(n);
  if (auto n = root["modules"]; n.IsDefined() && !n.IsNull()) load_modules(n, "");
  if (!modules_.empty()) check_module_graph();
}

void Loader::load(N root) {
  if (!root.IsDefined() || root.IsNull()) fail_at({1, 1}, "empty program: expected a mapping with at least `mesh` and `ops`");
  if (!root.IsMap()) fail(root, "a program must be a mapping (name, mesh, sizes, tensors, ops, outputs), got " + kind_of(root));
  for_each_key(root, kTopKeys, "the program", [](N, N) {});
  if (!prelude_done_) prelude(root);
  auto ops = root["ops"];
  auto programs = root["programs"];
  if (auto sched = root["schedule"]; sched.IsDefined()) {
    if (ops.IsDefined() || programs.IsDefined())
      fail(sched, "a `schedule` expands to per-stage programs: give it instead of `ops` or `programs`, not with them");
    load_schedule(sched);
  } else if (ops.IsDefined() && programs.IsDefined()) fail(programs, "give either `ops` (one program for every rank) or `programs` (per-rank programs), not both");
  if (!p_.schedule.present && !ops.IsDefined() && !programs.IsDefined()) fail(root, "missing key `ops`: the list of ops every rank runs (or `programs:` for per-rank programs)");
  if (p_.schedule.present) {
    // The programs come from the schedule (expanded by schedules/, which the loader does not see).
  } else if (ops.IsDefined()) {
    if (!ops.streamed()) load_ops(ops);
  } else if (!programs.streamed()) {
    load_programs(programs);
  }
  make_rank_space(p_);  // every rank runs exactly one program; peers and selectors need concrete axes
  if (auto m = root["p2p_model"]; m.IsDefined()) {
    if (!m.IsScalar() || (m.Scalar() != "eager" && m.Scalar() != "rendezvous"))
      fail(m, "`p2p_model` must be eager or rendezvous, got " + kind_of(m) + (m.IsScalar() ? suggestion(m.Scalar(), {"eager", "rendezvous"}) : ""));
    p_.has_p2p_model = true;
    p_.p2p_model = m.Scalar() == "eager" ? P2PModel::Eager : P2PModel::Rendezvous;
    p_.p2p_model_loc = m.loc();
  }
  if (auto n = root["outputs"]; n.IsDefined() && !n.IsNull()) load_outputs(n);
  load_training(root);
  load_spec(root);
  check_pipeline(root);
  if (p_.local_view) {
    if (p_.schedule.present)
      fail_at(p_.view_loc, "`view: local` does not support `schedule` yet: write the local-view plan as `ops:` or `programs:`, or drop `view: local`");
    // Training in the local view: the backward is written by hand, rank by rank (Megatron's custom autograd
    // functions), and compared with the spec's derived one; nothing derives a local-view backward.
    if (p_.train)
      fail_at(p_.view_loc, "`view: local` does not derive a backward (`train: true`): write each rank's backward by hand under `backward:` (as "
                           "Megatron's custom autograd functions do), or drop `view: local`");
    if (p_.per_rank && (p_.has_backward || p_.has_grad_sync))
      fail_at(p_.view_loc, "`view: local` with per-rank `programs:` does not support `backward:` or `grad_sync:` yet: write one local-view `ops:` list");
    if ((p_.has_backward || p_.has_grad_sync) && !p_.has_spec)
      fail_at(p_.view_loc, "a local-view training step needs a `spec:`: its gradients are compared with the spec's derived backward");
    if (p_.has_optimizer)
      fail_at(p_.view_loc, "`view: local` does not support `optimizer:` yet: write the optimizer step in a global-view program, or drop `view: local`");
    // Ops whose meaning is a global-view layout (a placement change, a kernel that reads the shard layout) have
    // no local-view meaning yet (docs/format.md, "Local view").
    for (const auto* list : {&p_.ops, &p_.backward, &p_.grad_sync})
      for (const Op& op : *list) {
        static constexpr OpKind kLayoutOps[] = {OpKind::Convert,     OpKind::RingAttention, OpKind::RingAttentionStep,    OpKind::LoadBalance,
                                                OpKind::MoEDispatch, OpKind::MoECombine,    OpKind::ZeROPartitionOptState};
        bool layout = std::find(std::begin(kLayoutOps), std::end(kLayoutOps), op.kind) != std::end(kLayoutOps) ||
                      (op.kind == OpKind::CrossEntropyLoss && op.attrs.vocab_parallel);
        if (layout)
          fail_at(op.loc, std::string(op_name(op.kind)) + (op.kind == OpKind::CrossEntropyLoss ? " with `vocab_parallel: true`" : "") +
                              " works on global-view layouts and is not available in a local-view program (`view: local`, line " +
                              std::to_string(p_.view_loc.line) + "): write it from local ops and collectives (Slice with axis_index, AllReduce, AllGather, ...)");
      }
  }
  if (auto n = root["expect"]; n.IsDefined()) load_expect(n);
}

NameId Loader::name_id(std::string_view written, N at) {
  if (scopes_.empty()) return p_.intern(written);
  const Scope& s = scopes_.back();
  if (auto it = s.formals.find(std::string(written)); it != s.formals.end()) return it->second;
  NameId id = p_.intern(s.prefix + "." + std::string(written));
  claim(id, at, written);
  return id;
}

// ---- sizes and expressions ----------------------------------------------------------------
ExprId Loader::constant(std::int64_t v) {
  auto& c = const_cache_[static_cast<std::uint64_t>(v) % 64];
  if (c.second == 0 || c.first != v) c = {v, p_.exprs.constant(v)};  // id 0 is never a cached constant's (see below)
  return c.second;
}

// `view: local | global` (docs/format.md, "Local view").
void Loader::load_view(N n) {
  if (!n.IsScalar() || (n.Scalar() != "local" && n.Scalar() != "global"))
    fail(n, "`view` must be local or global, got " + kind_of(n) + (n.IsScalar() ? suggestion(n.Scalar(), {"local", "global"}) : "") +
                " (local: ops compute on each rank's local pieces, shard_map / Megatron style; global: the default)");
  p_.local_view = n.Scalar() == "local";
  p_.view_loc = n.loc();
}

ExprId Loader::parse_expr(N n, const What& what, bool op_attr) {
  if (!n.IsScalar()) fail(n, what.str() + " must be an int or a size expression, got " + kind_of(n));
  std::string_view sv = n.sv();
  if (!sv.empty() && sv.size() <= 12 && std::all_of(sv.begin(), sv.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    std::int64_t v = 0;  // a plain literal, what generators write: no parse
    for (char c : sv) v = v * 10 + (c - '0');
    return constant(v);
  }
  const std::string text(sv);
  std::vector<std::string> known;
  bool local = op_attr && p_.local_view;
  auto mesh_axis = [&](std::string_view name) {
    for (std::size_t i = 0; i < p_.mesh.size(); ++i)
      if (p_.mesh[i].name == name) return static_cast<int>(i);
    return -1;
  };
  ExprPool::CallFn call = [&](std::string_view fn, std::string_view arg, std::size_t) -> ExprId {
    const std::string f(fn), a(arg);
    if (fn != "axis_index") fail(n, "unknown function '" + f + "' in " + what.str() + suggestion(f, {"axis_index"}) + " (a size expression has + - * / and axis_index(AXIS))");
    if (!op_attr)
      fail(n, "axis_index(" + a + ") in " + what.str() + ": a rank's coordinate may only appear in the size attributes of ops (start, end, before, after, ...) of a local-view program, never in a tensor shape or a size");
    if (!p_.local_view)
      fail(n, "axis_index(" + a + ") in " + what.str() + " needs a local-view program: add `view: local` at the top level (in the global view every size is a global size, the same on every rank)");
    int ax = mesh_axis(arg);
    if (ax < 0)
      fail(n, "axis_index(" + a + ") in " + what.str() + " names axis '" + a + "', which the mesh lacks" + suggestion(a, p_.axis_names()) +
                  " (mesh axes: " + join(p_.axis_names()) + ")");
    return p_.exprs.axis_index(ax, a);
  };
  try {
    return p_.exprs.parse(text, [&](std::string_view name) -> std::optional<ExprId> {
      auto it = p_.sizes.find(std::string(name));
      if (it != p_.sizes.end()) return it->second;
      if (op_attr) {  // in an op's size attribute a mesh axis name is its size (local view: per rank, 1 in the single-device run)
        int ax = mesh_axis(name);
        if (ax >= 0) return local ? p_.exprs.axis_size(ax, std::string(name)) : p_.mesh[static_cast<std::size_t>(ax)].size;
      }
      for (const auto& [k, v] : p_.sizes) known.push_back(k);
      if (op_attr) for (const auto& ax : p_.mesh) known.push_back(ax.name);
      std::sort(known.begin(), known.end());
      fail(n, "unknown size '" + std::string(name) + "' in " + what.str() + suggestion(std::string(name), known) +
                  (known.empty() ? " (declare it under `sizes`)" : " (known sizes: " + join(known) + ")"));
    }, &call);
  } catch (const ExprError& e) {
    fail(n, "bad size expression in " + what.str() + " ('" + (text.size() > 60 ? text.substr(0, 60) + "..." : text) + "'): " + e.what());
  }
}

std::int64_t Loader::size_int(N n, const std::string& what) {
  std::int64_t v = 0;
  if (!n.IsScalar() || !parse_int(n.Scalar(), v)) fail(n, what + " must be an integer, got " + kind_of(n));
  if (v < 1) fail(n, what + " must be positive, got " + std::to_string(v));
  if (v > kMaxSize) fail(n, what + " " + n.Scalar() + " is too large (the limit is 2^40)");
  return v;
}

void Loader::load_sizes(N n) {
  if (!n.IsMap()) fail(n, "`sizes` must be a mapping of name -> size");
  for_each_key(n, {}, "`sizes`", [&](N k, N v) {
    const std::string& name = k.Scalar();
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_'))
      fail(k, "size name '" + name + "' must start with a letter");
    ExprId e;
    if (v.IsMap()) {
      e = load_symbolic(name, v);
    } else {
      e = parse_expr(v, "size '" + name + "'");
      if (p_.exprs.is_const(e) && p_.exprs.value(e) < 1)
        fail(v, "size '" + name + "' must be positive, got " + std::to_string(p_.exprs.value(e)));
      if (p_.exprs.is_const(e) && p_.exprs.value(e) > kMaxSize)
        fail(v, "size '" + name + "' is " + std::to_string(p_.exprs.value(e)) + ", too large (the limit is 2^40)");
      if (generalize_ && p_.exprs.is_const(e) && !mesh_words_.count(name)) {  // a variable with its one value
        SizeVar var;
        var.name = name;
        var.in = {p_.exprs.value(e)};
        var.general = true;
        p_.vars.push_back(std::move(var));
        e = p_.exprs.var(static_cast<int>(p_.vars.size() - 1));
      }
    }
    p_.sizes[name] = e;
    p_.size_locs[name] = k.loc();
  });
}

ExprId Loader::load_symbolic(const std::string& name, N v) {
  SizeVar var;
  var.name = name;
  for_each_key(v, {"min", "max", "multiple_of", "in"}, "size '" + name + "'", [&](N k, N x) {
    const std::string& key = k.Scalar();
    if (key == "min") var.min = size_int(x, "`min` of " + name);
    if (key == "max") var.max = size_int(x, "`max` of " + name);
    if (key == "multiple_of") var.multiple_of = size_int(x, "`multiple_of` of " + name);
    if (key == "in") {
      if (!x.IsSequence() || x.size() == 0) fail(x, "`in` of " + name + " must be a non-empty list of sizes");
      for (const auto& item : x) var.in.push_back(size_int(item, "a value in `in` of " + name));
      std::sort(var.in.begin(), var.in.end());
      var.in.erase(std::unique(var.in.begin(), var.in.end()), var.in.end());
    }
  });
  if (var.min > var.max) fail(v, "size " + name + " has min " + std::to_string(var.min) + " above max " + std::to_string(var.max));
  // The allowed set must not be empty.
  bool any = false;
  if (!var.in.empty()) {
    for (auto x : var.in) any |= x >= var.min && x <= var.max && x % var.multiple_of == 0;
  } else {
    std::int64_t first = (var.min + var.multiple_of - 1) / var.multiple_of * var.multiple_of;
    any = first <= var.max;
  }
  if (!any) fail(v, "no value of size " + name + " satisfies its constraints");
  p_.vars.push_back(std::move(var));
  return p_.exprs.var(static_cast<int>(p_.vars.size() - 1));
}

void Loader::load_mesh(N n) {
  if (!n.IsMap() || n.size() == 0) fail(n, "`mesh` must be a non-empty mapping of axis name -> size, e.g. {dp: 2, tp: 4}");
  std::int64_t ranks = 1;
  for_each_key(n, {}, "`mesh`", [&](N k, N v) {
    if (p_.mesh.size() == static_cast<std::size_t>(kMaxAxes)) fail(k, "a mesh has at most 8 axes");
    if (k.Scalar().empty()) fail(k, "a mesh axis needs a name");
    ExprId e = parse_expr(v, "the size of mesh axis '" + k.Scalar() + "'");
    if (p_.exprs.is_const(e)) {
      std::int64_t s = p_.exprs.value(e);
      if (s < 1) fail(v, "mesh axis '" + k.Scalar() + "' must have a positive size, got " + std::to_string(s));
      if (s > (1 << 20)) fail(v, "mesh axis '" + k.Scalar() + "' has " + std::to_string(s) + " ranks; the limit is 2^20");
      ranks *= s;
      if (ranks > (std::int64_t{1} << 31)) fail(v, "the mesh has more than 2^31 ranks");
    }
    p_.mesh.push_back({k.Scalar(), e, k.loc()});
  });
}

// ---- placements ---------------------------------------------------------------------------
int Loader::axis_index(N k, const std::string& what) {
  const std::string& name = k.Scalar();
  for (std::size_t i = 0; i < p_.mesh.size(); ++i)
    if (p_.mesh[i].name == name) return static_cast<int>(i);
  fail(k, what + " names axis '" + excerpt(name) + "', which the mesh lacks" + suggestion(name, p_.axis_names()) +
              " (mesh axes: " + join(p_.axis_names()) + ")");
}

Placement Loader::one_placement(N v) {
  if (!v.IsScalar()) fail(v, "a placement must be R, I, V, P, P(sum|avg|max|min) or S(d), got " + kind_of(v));
  std::string err;
  auto pl = parse_placement(v.Scalar(), &err);
  if (!pl) fail(v, err);
  return *pl;
}

// A placement map {axis: P} or a list in mesh order. `rank` < 0: S(d) range checked later.
Placements Loader::load_placements(N n, int rank, const What& what) {
  Placements out{};
  auto normalize = [&](Placement& pl, N at) {
    if (!pl.is_s() || rank < 0) return;
    if (pl.dim < -rank || pl.dim >= rank)
      fail(at, "S(" + std::to_string(pl.dim) + ") is out of range for " + what.str() + " of rank " + std::to_string(rank) +
                   " (dims are 0.." + std::to_string(rank - 1) + " or -" + std::to_string(rank) + "..-1)");
    if (pl.dim < 0) pl.dim = static_cast<std::int16_t>(pl.dim + rank);
  };
  if (n.IsMap()) {
    bool order_key = std::none_of(p_.mesh.begin(), p_.mesh.end(), [](const MeshAxis& m) { return m.name == "order"; });
    std::optional<N> order;
    for_each_key(n, {}, What("the placement of ", what), [&](N k, N v) {
      if (order_key && k.Scalar() == "order") return void(order = v);
      int a = axis_index(k);
      out[static_cast<std::size_t>(a)] = one_placement(v);
      normalize(out[static_cast<std::size_t>(a)], v);
    });
    if (order) load_shard_order(*order, out, what.str());
  } else if (n.IsSequence()) {
    if (n.size() != p_.mesh.size())
      fail(n, "the placement list of " + what.str() + " has " + std::to_string(n.size()) + (n.size() == 1 ? " entry" : " entries") + " but the mesh has " +
                  std::to_string(p_.mesh.size()) + " axes (" + join(p_.axis_names()) + ")");
    for (std::size_t i = 0; i < n.size(); ++i) {
      out[i] = one_placement(n[i]);
      normalize(out[i], n[i]);
    }
  } else if (n.IsScalar() && p_.mesh.size() == 1) {
    out[0] = one_placement(n);
    normalize(out[0], n);
  } else {
    fail(n, "the placement of " + what.str() + " must be a mapping {axis: placement} or a list in mesh order");
  }
  return out;
}

// `order: [tp, dp]` in a placement map: the shard order (major first) of the dims cut by several axes
// (docs/format.md, "Shard order"). Every listed axis is S(d) here, and a dim's axes are listed all or none.
void Loader::load_shard_order(N n, Placements& pl, const std::string& what) {
  if (!n.IsSequence() || n.size() < 2)
    fail(n, "`order` in the placement of " + what + " must list at least two mesh axes that shard one dim, major first, e.g. [tp, dp]");
  std::vector<int> listed;
  for (const auto& x : n) {
    if (!x.IsScalar()) fail(x, "`order` must list mesh axis names");
    int a = axis_index(x, "`order`");
    if (std::find(listed.begin(), listed.end(), a) != listed.end()) fail(x, "`order` lists axis '" + x.Scalar() + "' twice");
    Placement q = pl[static_cast<std::size_t>(a)];
    if (!q.is_s())
      fail(x, "`order` lists axis '" + x.Scalar() + "', which is " + to_string(q) + " in the placement of " + what + ", not S(d): only axes that shard a dim have a shard order");
    listed.push_back(a);
  }
  for (int d = -kMaxRank; d < kMaxRank; ++d) {
    int axes[kMaxAxes], k = 0;
    for (int a : listed)
      if (pl[static_cast<std::size_t>(a)].is_s(d)) axes[k++] = a;
    if (!k) continue;
    for (std::size_t a = 0; a < p_.mesh.size(); ++a)
      if (pl[a].is_s(d) && std::find(listed.begin(), listed.end(), static_cast<int>(a)) == listed.end())
        fail(n, "`order` lists " + p_.mesh[static_cast<std::size_t>(axes[0])].name + " but not " + p_.mesh[a].name + ", which also shards dim " +
                    std::to_string(d) + " of " + what + ": list every axis of the dim, major first");
    if (k < 2)
      fail(n, "`order` lists " + p_.mesh[static_cast<std::size_t>(axes[0])].name + ", the only axis that shards dim " + std::to_string(d) + " of " + what +
                  ": an order needs two or more axes on one dim");
    set_shard_order(pl.data(), static_cast<int>(p_.mesh.size()), d, axes, k);
  }
}

std::vector<ExprId> Loader::load_shape(N n, const What& what, std::vector<Loc>* locs, bool op_attr) {
  if (!n.IsSequence()) fail(n, "the shape of " + what.str() + " must be a list of sizes, e.g. [B, 128, H]");
  if (n.size() > static_cast<std::size_t>(kMaxRank)) fail(n, what.str() + " has rank " + std::to_string(n.size()) + "; the limit is 8");
  std::vector<ExprId> shape;
  std::int64_t elems = 1;
  for (const auto& d : n) {
    ExprId e = parse_expr(d, What("a dim of ", what), op_attr);
    if (p_.exprs.is_const(e)) {
      std::int64_t v = p_.exprs.value(e);
      if (v < 1) fail(d, "dims of " + what.str() + " must be positive, got " + std::to_string(v));
      if (__builtin_mul_overflow(elems, v, &elems) || elems > kMaxValue)
        fail(d, what.str() + " has too many elements (more than 2^62)");
    }
    shape.push_back(e);
    if (locs) locs->push_back(d.loc());
  }
  return shape;
}

// ---- tensors ------------------------------------------------------------------------------
void Loader::load_tensors(N n) {
  if (!n.IsMap()) fail(n, "`tensors` must be a mapping of name -> {shape, placement, ...}");
  if (p_.tensors.empty()) p_.tensors.reserve(n.size());  // not per instance: exact growth would copy them all each time
  for_each_key(n, {}, "`tensors`", [&](N k, N v) { load_tensor(k, v); });
}

void Loader::load_tensor(N k, N v) {
  TensorDecl t;
  std::string_view name = k.sv();
  t.name = name_id(name, k);
  if (scopes_.empty() && !instance_at_.empty()) claim_program_name(t.name);
  t.loc = k.loc();
  const What what("tensor '", name, "'");
  if (!v.IsMap()) fail(v.IsNull() ? k : v, what.str() + " must be a mapping like {shape: [B, H], placement: {tp: S(1)}}");
  static const std::vector<std::string> keys = {"shape", "placement", "dtype", "param", "uneven"};
  for_each_key(v, keys, what, [](N, N) {});
  auto shape = v["shape"];
  if (!shape.IsDefined()) fail(v, what.str() + " needs a `shape`");
  t.shape_loc = shape.loc();
  t.shape = load_shape(shape, what, &t.dim_locs);
  if (auto pl = v["placement"]; pl.IsDefined() && !pl.IsNull()) {
    t.placement_loc = pl.loc();
    t.placement = load_placements(pl, static_cast<int>(t.shape.size()), what);
  } else {
    t.placement_loc = t.loc;
  }
  if (auto d = v["dtype"]; d.IsDefined()) t.dtype = load_dtype(d);
  if (auto b = v["param"]; b.IsDefined()) t.param = load_bool(b, "`param`");
  if (auto b = v["uneven"]; b.IsDefined()) t.uneven = load_bool(b, "`uneven`");
  p_.tensors.push_back(std::move(t));
}

DType Loader::load_dtype(N d) {
  DType out;
  if (!d.IsScalar() || !parse_dtype(d.Scalar(), out))
    fail(d, "unknown dtype " + kind_of(d) + (d.IsScalar() ? suggestion(d.Scalar(), dtype_names()) : "") +
                " (known: " + join(dtype_names()) + ")");
  return out;
}

bool Loader::load_bool(N b, const std::string& what) {
  bool v = false;
  if (!b.IsScalar() || !parse_bool(b.Scalar(), v)) fail(b, what + " must be true or false, got " + kind_of(b));
  return v;
}

// ---- ops ----------------------------------------------------------------------------------
}  // namespace load_detail

namespace {

using load_detail::Loader;

struct Restart {};  // the streaming pass gives up; the fixed-order pass decides

bool json_direct = true;  // set_json_direct

// Keys the ops depend on: seen after the ops were streamed, the ops must be loaded again.
bool before_ops(std::string_view key) {
  return key == "sizes" || key == "mesh" || key == "tensors" || key == "schedule" || key == "ops" || key == "programs" ||
         key == "modules" || key == "include" || key == "view";
}

// Closes `root` (a mapping still being read) at node `end`, so the prelude sees the keys read so far.
void close_at(Doc& doc, std::uint32_t root, std::uint32_t end) {
  doc.nodes[root].end = end;
  std::uint32_t c = 0;
  for (std::uint32_t j = root + 1; j < end; j = doc.nodes[j].end) ++c;
  doc.nodes[root].count = c;
}

// One pass over the events: the keys before `ops` into a small tree, each op loaded as it is parsed.
Program load_streaming(EventSource& src, const std::string& filename, std::size_t text_size, const LoadOptions& opt) {
  Program p;
  p.file = filename;
  Loader loader(p, filename);
  if (opt.generalize_sizes) loader.generalize_sizes();
  Doc doc, item;
  Event e;
  src.next(e);
  if (e.type != EvType::DocStart) throw Restart{};
  src.next(e);
  if (e.type != EvType::MapStart) throw Restart{};
  std::uint32_t root = doc.open(NodeKind::Map, e.loc);
  bool mesh = false, streamed = false, has_list = false, tensors_streamed = false;
  for (;;) {
    src.next(e);
    if (e.type == EvType::MapEnd) break;
    if (e.type != EvType::Scalar) throw Restart{};
    std::string key(e.text);
    std::uint32_t k = read_node(src, e, doc, 1);
    if (streamed && before_ops(key)) throw Restart{};
    if (tensors_streamed && (key == "sizes" || key == "mesh" || key == "tensors" || key == "view")) throw Restart{};
    src.next(e);
    if (key == "tensors" && mesh && !has_list && e.type == EvType::MapStart) {
      // Each entry is loaded as it is parsed (a generated program declares a weight per layer: half a million
      // entries at 10^6 ops); a duplicate or a key that is not a name leaves it to the fixed-order pass.
      close_at(doc, root, k);
      loader.prelude_head(doc.at(root));
      std::uint32_t v = doc.open(NodeKind::Map, e.loc);
      for (RawJson raw;;) {
        if (json_direct && src.raw_item(raw) && loader.load_tensor_json(raw)) {
          src.raw_commit(raw);
          continue;
        }
        src.next(e);
        if (e.type == EvType::MapEnd) break;
        item.clear();
        std::uint32_t ki = read_node(src, e, item, 2);
        src.next(e);
        std::uint32_t vi = read_node(src, e, item, 2);
        if (!item.at(ki).IsScalar()) throw Restart{};
        std::size_t names = p.names.size();
        loader.load_tensor(item.at(ki), item.at(vi));
        if (p.names.size() == names) throw Restart{};  // the name was declared before
      }
      doc.close(v);
      doc.nodes[v].streamed = true;
      tensors_streamed = true;
      continue;
    }
    if ((key == "ops" || key == "programs") && mesh && !has_list && e.type == EvType::SeqStart) {
      close_at(doc, root, k);
      loader.prelude(doc.at(root));
      // About 60 bytes of text per op in the forms generators write: reserve once instead of doubling.
      std::size_t guess = std::min<std::size_t>(text_size / 64, kMaxOps);
      p.ops.reserve(guess);
      p.operands.reserve(guess * 3);
      p.names.reserve(p.names.size() + guess);
      p.name_ids.reserve(p.names.size() + guess);
      std::uint32_t v = doc.open(NodeKind::Seq, e.loc);
      std::uint32_t n = 0;
      const bool ops = key == "ops";
      for (RawJson raw;; ++n) {
        if (ops && json_direct && src.raw_item(raw) && loader.load_op_json(raw)) {
          src.raw_commit(raw);
          continue;
        }
        src.next(e);
        if (e.type == EvType::SeqEnd) break;
        item.clear();
        std::uint32_t i = read_node(src, e, item, 2);
        if (key == "ops") loader.load_item(item.at(i));
        else loader.load_program_item(item.at(i));
      }
      if (n == 0 && key == "programs") throw Restart{};
      doc.close(v);
      doc.nodes[v].streamed = true;
      doc.nodes[v].count = n;
      streamed = true;
      has_list = true;
      continue;
    }
    read_node(src, e, doc, 1);
    if (key == "mesh") mesh = true;
    if (key == "ops" || key == "programs" || key == "schedule") has_list = true;
  }
  doc.close(root);
  src.next(e);
  if (e.type != EvType::DocEnd) throw Restart{};
  src.next(e);
  if (e.type != EvType::StreamEnd) throw Restart{};
  loader.load(doc.at(root));
  return p;
}

// The fixed-order pass: the whole file as one tree (used for files out of order and for errors).
Program load_tree(const std::string& text, const std::string& filename, const LoadOptions& opt) {
  Program p;
  p.file = filename;
  Doc doc;
  read_document(text, doc);
  Loader loader(p, filename);
  if (opt.generalize_sizes) loader.generalize_sizes();
  loader.load(doc.root());
  return p;
}

Program load_any(const std::string& text, const std::string& filename, const LoadOptions& opt) {
  require_utf8(text);  // the JSON reader would pass bytes through that libyaml rejects
  if (looks_like_json(text)) {
    try {
      return load_streaming(*json_events(text), filename, text.size(), opt);
    } catch (const NotJson&) {
    } catch (const Restart&) {
    } catch (const LoadError&) {
    }
  }
  try {
    return load_streaming(*yaml_events(text), filename, text.size(), opt);
  } catch (const Restart&) {
  } catch (const LoadError&) {
  }
  return load_tree(text, filename, opt);
}

Program load(std::shared_ptr<const std::string> text, const std::string& filename, const LoadOptions& opt) {
  Program p = load_any(*text, filename, opt);
  p.source = std::move(text);
  p.generalized = opt.generalize_sizes;
  return p;
}

}  // namespace

Program load_program_string(const std::string& text, const std::string& filename, const LoadOptions& opt) {
  return load(std::make_shared<const std::string>(text), filename, opt);
}

Program load_program_file(const std::string& path, const LoadOptions& opt) {
  return load(std::make_shared<const std::string>(read_input_file(path)), path, opt);
}

void set_json_direct(bool on) { json_direct = on; }

}  // namespace spmd
