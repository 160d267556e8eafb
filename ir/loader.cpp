// ir/loader.cpp - YAML -> Program with source positions (yaml-cpp).
#include "ir/loader.h"

#include "ir/ranks.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace spmd {

namespace {

Loc loc_of(const YAML::Node& n) {
  YAML::Mark m = n.Mark();
  if (m.line < 0 || m.column < 0) return {};
  return {static_cast<std::uint32_t>(m.line + 1), static_cast<std::uint32_t>(m.column + 1)};
}

[[noreturn]] void fail(const YAML::Node& n, const std::string& msg) { throw LoadError(loc_of(n), msg); }
[[noreturn]] void fail_at(Loc l, const std::string& msg) { throw LoadError(l, msg); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string suggestion(const std::string& word, const std::vector<std::string>& cands) {
  auto best = did_you_mean(word, cands);
  return best ? "; did you mean '" + *best + "'?" : "";
}

std::string kind_of(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing";
  return "'" + n.Scalar() + "'";
}

// Iterates a mapping, rejecting duplicate and unknown keys. `fn(key, value)`.
template <class Fn>
void for_each_key(const YAML::Node& map, const std::vector<std::string>& allowed, const std::string& where, Fn fn) {
  std::unordered_set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary proxy, so references into it would dangle.
    const YAML::Node k = it->first;
    const YAML::Node v = it->second;
    if (!k.IsScalar()) fail(k, "a key in " + where + " must be a plain name");
    const std::string& key = k.Scalar();
    if (!seen.insert(key).second) fail(k, "duplicate key '" + key + "' in " + where);
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      fail(k, "unknown key '" + key + "' in " + where + suggestion(key, allowed) + " (allowed: " + join(allowed) + ")");
    fn(k, v);
  }
}

bool parse_int(const std::string& s, std::int64_t& v) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') ++b;
  auto r = std::from_chars(b, e, v);
  return r.ec == std::errc() && r.ptr == e;
}

bool parse_bool(const std::string& s, bool& v) {
  if (s == "true" || s == "True" || s == "yes") return v = true, true;
  if (s == "false" || s == "False" || s == "no") return v = false, true;
  return false;
}

class Loader {
 public:
  Loader(Program& p, const std::string& text) : p_(p), text_(text) {}

  void load(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull()) fail_at({1, 1}, "empty program: expected a mapping with at least `mesh` and `ops`");
    if (!root.IsMap()) fail(root, "a program must be a mapping (name, mesh, sizes, tensors, ops, outputs), got " + kind_of(root));
    static const std::vector<std::string> top = {"name", "description", "mesh", "sizes", "tensors", "ops", "outputs",
                                                 "expect", "programs", "schedule", "train", "backward", "p2p_model",
                                                 "loss", "grad_sync"};
    for_each_key(root, top, "the program", [&](const YAML::Node& k, const YAML::Node& v) {
      const std::string& key = k.Scalar();
      // yaml-cpp lets an unclosed quote swallow the rest of the file; say so where it opens.
      if (v.IsScalar() && opens_quote(v) && !closes_quote(v))
        fail(v, "invalid YAML: the quoted string that starts here is never closed (it swallows the rest of the file)");
    });
    if (auto n = root["name"]; n.IsDefined()) {
      if (!n.IsScalar()) fail(n, "`name` must be a string");
      p_.title = n.Scalar();
    }
    if (auto n = root["sizes"]; n.IsDefined() && !n.IsNull()) load_sizes(n);
    auto mesh = root["mesh"];
    if (!mesh.IsDefined()) fail(root, "missing key `mesh` (e.g. mesh: {dp: 2, tp: 4})");
    load_mesh(mesh);
    if (auto n = root["tensors"]; n.IsDefined() && !n.IsNull()) load_tensors(n);
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
      load_ops(ops);
    } else {
      load_programs(programs);
    }
    make_rank_space(p_);  // every rank runs exactly one program; peers and selectors need concrete axes
    if (auto m = root["p2p_model"]; m.IsDefined()) {
      if (!m.IsScalar() || (m.Scalar() != "eager" && m.Scalar() != "rendezvous"))
        fail(m, "`p2p_model` must be eager or rendezvous, got " + kind_of(m) + (m.IsScalar() ? suggestion(m.Scalar(), {"eager", "rendezvous"}) : ""));
      p_.has_p2p_model = true;
      p_.p2p_model = m.Scalar() == "eager" ? P2PModel::Eager : P2PModel::Rendezvous;
      p_.p2p_model_loc = loc_of(m);
    }
    if (auto n = root["outputs"]; n.IsDefined() && !n.IsNull()) load_outputs(n);
    load_training(root);
    if (auto n = root["expect"]; n.IsDefined()) load_expect(n);
  }

 private:
  // ---- sizes and expressions ----------------------------------------------------------------
  ExprId parse_expr(const YAML::Node& n, const std::string& what) {
    if (!n.IsScalar()) fail(n, what + " must be an int or a size expression, got " + kind_of(n));
    const std::string& text = n.Scalar();
    std::vector<std::string> known;
    try {
      return p_.exprs.parse(text, [&](std::string_view name) -> std::optional<ExprId> {
        auto it = p_.sizes.find(std::string(name));
        if (it != p_.sizes.end()) return it->second;
        for (const auto& [k, v] : p_.sizes) known.push_back(k);
        std::sort(known.begin(), known.end());
        fail(n, "unknown size '" + std::string(name) + "' in " + what + suggestion(std::string(name), known) +
                    (known.empty() ? " (declare it under `sizes`)" : " (known sizes: " + join(known) + ")"));
      });
    } catch (const ExprError& e) {
      fail(n, "bad size expression in " + what + " ('" + (text.size() > 60 ? text.substr(0, 60) + "..." : text) + "'): " + e.what());
    }
  }

  std::int64_t size_int(const YAML::Node& n, const std::string& what) {
    std::int64_t v = 0;
    if (!n.IsScalar() || !parse_int(n.Scalar(), v)) fail(n, what + " must be an integer, got " + kind_of(n));
    if (v < 1) fail(n, what + " must be positive, got " + std::to_string(v));
    if (v > kMaxSize) fail(n, what + " " + n.Scalar() + " is too large (the limit is 2^40)");
    return v;
  }

  void load_sizes(const YAML::Node& n) {
    if (!n.IsMap()) fail(n, "`sizes` must be a mapping of name -> size");
    for_each_key(n, {}, "`sizes`", [&](const YAML::Node& k, const YAML::Node& v) {
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
      }
      p_.sizes[name] = e;
      p_.size_locs[name] = loc_of(k);
    });
  }

  ExprId load_symbolic(const std::string& name, const YAML::Node& v) {
    SizeVar var;
    var.name = name;
    for_each_key(v, {"min", "max", "multiple_of", "in"}, "size '" + name + "'", [&](const YAML::Node& k, const YAML::Node& x) {
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

  void load_mesh(const YAML::Node& n) {
    if (!n.IsMap() || n.size() == 0) fail(n, "`mesh` must be a non-empty mapping of axis name -> size, e.g. {dp: 2, tp: 4}");
    std::int64_t ranks = 1;
    for_each_key(n, {}, "`mesh`", [&](const YAML::Node& k, const YAML::Node& v) {
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
      p_.mesh.push_back({k.Scalar(), e, loc_of(k)});
    });
  }

  // ---- placements ---------------------------------------------------------------------------
  int axis_index(const YAML::Node& k, const std::string& what = "placement") {
    const std::string& name = k.Scalar();
    for (std::size_t i = 0; i < p_.mesh.size(); ++i)
      if (p_.mesh[i].name == name) return static_cast<int>(i);
    fail(k, what + " names axis '" + name + "', which the mesh lacks" + suggestion(name, p_.axis_names()) +
                " (mesh axes: " + join(p_.axis_names()) + ")");
  }

  Placement one_placement(const YAML::Node& v) {
    if (!v.IsScalar()) fail(v, "a placement must be R, I, V, P, P(sum|avg|max|min) or S(d), got " + kind_of(v));
    std::string err;
    auto pl = parse_placement(v.Scalar(), &err);
    if (!pl) fail(v, err);
    return *pl;
  }

  // A placement map {axis: P} or a list in mesh order. `rank` < 0: S(d) range checked later.
  Placements load_placements(const YAML::Node& n, int rank, const std::string& what) {
    Placements out{};
    std::vector<Loc> locs(p_.mesh.size());
    auto normalize = [&](Placement& pl, const YAML::Node& at) {
      if (!pl.is_s() || rank < 0) return;
      if (pl.dim < -rank || pl.dim >= rank)
        fail(at, "S(" + std::to_string(pl.dim) + ") is out of range for " + what + " of rank " + std::to_string(rank) +
                     " (dims are 0.." + std::to_string(rank - 1) + " or -" + std::to_string(rank) + "..-1)");
      if (pl.dim < 0) pl.dim = static_cast<std::int16_t>(pl.dim + rank);
    };
    if (n.IsMap()) {
      for_each_key(n, {}, "the placement of " + what, [&](const YAML::Node& k, const YAML::Node& v) {
        int a = axis_index(k);
        out[static_cast<std::size_t>(a)] = one_placement(v);
        normalize(out[static_cast<std::size_t>(a)], v);
      });
    } else if (n.IsSequence()) {
      if (n.size() != p_.mesh.size())
        fail(n, "the placement list of " + what + " has " + std::to_string(n.size()) + (n.size() == 1 ? " entry" : " entries") + " but the mesh has " +
                    std::to_string(p_.mesh.size()) + " axes (" + join(p_.axis_names()) + ")");
      for (std::size_t i = 0; i < n.size(); ++i) {
        out[i] = one_placement(n[i]);
        normalize(out[i], n[i]);
      }
    } else if (n.IsScalar() && p_.mesh.size() == 1) {
      out[0] = one_placement(n);
      normalize(out[0], n);
    } else {
      fail(n, "the placement of " + what + " must be a mapping {axis: placement} or a list in mesh order");
    }
    return out;
  }

  std::vector<ExprId> load_shape(const YAML::Node& n, const std::string& what, std::vector<Loc>* locs) {
    if (!n.IsSequence()) fail(n, "the shape of " + what + " must be a list of sizes, e.g. [B, 128, H]");
    if (n.size() > static_cast<std::size_t>(kMaxRank)) fail(n, what + " has rank " + std::to_string(n.size()) + "; the limit is 8");
    std::vector<ExprId> shape;
    std::int64_t elems = 1;
    for (const auto& d : n) {
      ExprId e = parse_expr(d, "a dim of " + what);
      if (p_.exprs.is_const(e)) {
        std::int64_t v = p_.exprs.value(e);
        if (v < 1) fail(d, "dims of " + what + " must be positive, got " + std::to_string(v));
        if (__builtin_mul_overflow(elems, v, &elems) || elems > kMaxValue)
          fail(d, what + " has too many elements (more than 2^62)");
      }
      shape.push_back(e);
      if (locs) locs->push_back(loc_of(d));
    }
    return shape;
  }

  // ---- tensors ------------------------------------------------------------------------------
  void load_tensors(const YAML::Node& n) {
    if (!n.IsMap()) fail(n, "`tensors` must be a mapping of name -> {shape, placement, ...}");
    for_each_key(n, {}, "`tensors`", [&](const YAML::Node& k, const YAML::Node& v) {
      TensorDecl t;
      const std::string& name = k.Scalar();
      t.name = p_.intern(name);
      t.loc = loc_of(k);
      if (!v.IsMap()) fail(v.IsNull() ? k : v, "tensor '" + name + "' must be a mapping like {shape: [B, H], placement: {tp: S(1)}}");
      static const std::vector<std::string> keys = {"shape", "placement", "dtype", "param", "uneven"};
      for_each_key(v, keys, "tensor '" + name + "'", [](const YAML::Node&, const YAML::Node&) {});
      auto shape = v["shape"];
      if (!shape.IsDefined()) fail(v, "tensor '" + name + "' needs a `shape`");
      t.shape_loc = loc_of(shape);
      t.shape = load_shape(shape, "tensor '" + name + "'", &t.dim_locs);
      if (auto pl = v["placement"]; pl.IsDefined() && !pl.IsNull()) {
        t.placement_loc = loc_of(pl);
        t.placement = load_placements(pl, static_cast<int>(t.shape.size()), "tensor '" + name + "'");
      } else {
        t.placement_loc = t.loc;
      }
      if (auto d = v["dtype"]; d.IsDefined()) t.dtype = load_dtype(d);
      if (auto b = v["param"]; b.IsDefined()) t.param = load_bool(b, "`param`");
      if (auto b = v["uneven"]; b.IsDefined()) t.uneven = load_bool(b, "`uneven`");
      p_.tensors.push_back(std::move(t));
    });
  }

  DType load_dtype(const YAML::Node& d) {
    DType out;
    if (!d.IsScalar() || !parse_dtype(d.Scalar(), out))
      fail(d, "unknown dtype " + kind_of(d) + (d.IsScalar() ? suggestion(d.Scalar(), dtype_names()) : "") +
                  " (known: " + join(dtype_names()) + ")");
    return out;
  }

  bool load_bool(const YAML::Node& b, const std::string& what) {
    bool v = false;
    if (!b.IsScalar() || !parse_bool(b.Scalar(), v)) fail(b, what + " must be true or false, got " + kind_of(b));
    return v;
  }

  // ---- ops ----------------------------------------------------------------------------------
  std::vector<NameId> load_names(const YAML::Node& n, const std::string& what, bool allow_scalar) {
    std::vector<NameId> out;
    if (!n.IsDefined() || n.IsNull()) return out;
    if (n.IsScalar() && allow_scalar) {
      if (n.Scalar().empty()) fail(n, what + " must name a tensor");
      out.push_back(p_.intern(n.Scalar()));
      return out;
    }
    if (!n.IsSequence()) fail(n, what + " must be a list of tensor names");
    for (const auto& x : n) {
      if (!x.IsScalar() || x.Scalar().empty()) fail(x, what + " must hold tensor names, got " + kind_of(x));
      out.push_back(p_.intern(x.Scalar()));
    }
    return out;
  }

  void load_ops(const YAML::Node& n) {
    if (n.IsNull()) return;
    if (!n.IsSequence()) fail(n, "`ops` must be a list of ops like {op: MatMul, in: [x, w], out: y}");
    if (n.size() > kMaxOps) fail(n, "the program has " + std::to_string(n.size()) + " ops; the limit is 10,000,000");
    p_.ops.reserve(n.size());
    for (const auto& item : n) load_op(item);
  }

  // schedule: {kind: 1F1B, axis: pp, microbatches: 8, virtual_stages: 2} or {csv: file.csv, axis: pp}
  void load_schedule(const YAML::Node& n) {
    if (!n.IsMap()) fail(n, "`schedule` must be a mapping, e.g. {kind: 1F1B, axis: pp, microbatches: 8} or {csv: schedule.csv}");
    ScheduleSpec& sp = p_.schedule;
    sp.present = true;
    sp.loc = loc_of(n);
    for_each_key(n, {"kind", "axis", "microbatches", "virtual_stages", "csv"}, "`schedule`", [](const YAML::Node&, const YAML::Node&) {});
    auto kind = n["kind"], csv = n["csv"];
    if (kind.IsDefined() == csv.IsDefined()) fail(n, "`schedule` needs exactly one of `kind` (a generator) and `csv` (a PyTorch pipelining CSV file)");
    std::string axis = "pp";
    if (auto a = n["axis"]; a.IsDefined()) {
      if (!a.IsScalar()) fail(a, "`axis` of `schedule` must be a mesh axis name");
      axis = a.Scalar();
    }
    int ax = -1;
    for (std::size_t i = 0; i < p_.mesh.size(); ++i)
      if (p_.mesh[i].name == axis) ax = static_cast<int>(i);
    if (ax < 0) fail(n["axis"].IsDefined() ? n["axis"] : n, "the schedule's axis '" + axis + "' is not a mesh axis" + suggestion(axis, p_.axis_names()));
    if (!p_.exprs.is_const(p_.mesh[static_cast<std::size_t>(ax)].size))
      fail_at(p_.mesh[static_cast<std::size_t>(ax)].loc, "the pipeline axis " + axis + " needs a concrete size");
    sp.axis = ax;
    sp.ranks = p_.exprs.value(p_.mesh[static_cast<std::size_t>(ax)].size);
    if (kind.IsDefined()) {
      if (!kind.IsScalar()) fail(kind, "`kind` must be GPipe, 1F1B, Interleaved1F1B or ZBH1");
      static const std::vector<std::string> kinds = {"GPipe", "1F1B", "Interleaved1F1B", "ZBH1", "ZeroBubble", "ZB-H1"};
      if (std::find(kinds.begin(), kinds.end(), kind.Scalar()) == kinds.end())
        fail(kind, "unknown schedule kind '" + kind.Scalar() + "'" + suggestion(kind.Scalar(), kinds) + " (kinds: GPipe, 1F1B, Interleaved1F1B, ZBH1)");
      sp.kind = kind.Scalar();
      auto m = n["microbatches"];
      if (!m.IsDefined()) fail(n, "a generated schedule needs `microbatches`");
      sp.microbatches = attr_int(m, "`microbatches`", 1, 1 << 20);
      if (auto v = n["virtual_stages"]; v.IsDefined()) sp.virtual_stages = attr_int(v, "`virtual_stages`", 1, 64);
      sp.kind_loc = loc_of(kind);
    } else {
      if (!csv.IsScalar() || csv.Scalar().empty()) fail(csv, "`csv` must be a file name (relative to this file)");
      sp.csv = csv.Scalar();
      sp.csv_loc = loc_of(csv);
      for (const char* k : {"microbatches", "virtual_stages"})
        if (n[k].IsDefined()) fail(n[k], std::string("`") + k + "` comes from the CSV file; remove it");
    }
  }

  void load_programs(const YAML::Node& n) {
    if (!n.IsSequence() || n.size() == 0) fail(n, "`programs` must be a non-empty list of {ranks: {axis: coordinate}, ops: [...]}");
    p_.per_rank = true;
    for (const auto& item : n) {
      if (!item.IsMap()) fail(item, "a program must be a mapping {ranks: {pp: 0}, ops: [...]}");
      for_each_key(item, {"ranks", "ops"}, "a program", [](const YAML::Node&, const YAML::Node&) {});
      RankProgram rp;
      rp.loc = loc_of(item);
      auto ranks = item["ranks"];
      if (!ranks.IsDefined()) fail(item, "a program needs `ranks: {axis: coordinate}` (the ranks that run it)");
      rp.selector = load_coords(ranks, "`ranks`");
      auto ops = item["ops"];
      if (!ops.IsDefined()) fail(item, "a program needs `ops`");
      rp.first_op = static_cast<std::uint32_t>(p_.ops.size());
      load_ops(ops);
      rp.n_ops = static_cast<std::uint32_t>(p_.ops.size()) - rp.first_op;
      p_.programs.push_back(std::move(rp));
    }
  }

  // A coordinate map {axis: int}: axes must exist, coordinates must be in range.
  std::vector<std::pair<int, std::int64_t>> load_coords(const YAML::Node& v, const std::string& what) {
    if (!v.IsMap()) fail(v, what + " must be a mapping of mesh coordinates, e.g. {pp: 1}");
    std::vector<std::pair<int, std::int64_t>> c;
    for_each_key(v, {}, what, [&](const YAML::Node& k, const YAML::Node& x) {
      int axis = axis_index(k, what);
      std::int64_t hi = (1 << 20) - 1;
      ExprId size = p_.mesh[static_cast<std::size_t>(axis)].size;
      if (p_.exprs.is_const(size)) hi = p_.exprs.value(size) - 1;
      c.emplace_back(axis, attr_int(x, "coordinate of axis " + k.Scalar() + " in " + what, 0, hi));
    });
    return c;
  }

  void load_op(const YAML::Node& item) {
    if (!item.IsMap()) fail(item, "an op must be a mapping like {op: MatMul, in: [x, w], out: y}, got " + kind_of(item));
    auto opn = item["op"];
    if (!opn.IsDefined()) fail(item, "an op needs `op: <name>`");
    if (!opn.IsScalar()) fail(opn, "`op` must be an op name");
    auto kind = op_by_name(opn.Scalar());
    if (!kind) {
      std::vector<std::string> names;
      for (const auto& i : all_ops()) names.emplace_back(i.name);
      fail(opn, "unknown op '" + opn.Scalar() + "'" + suggestion(opn.Scalar(), names) + " (`spmdcheck ops` lists them)");
    }
    const OpInfo& info = op_info(*kind);
    if (info.category == OpCategory::later)
      fail(opn, std::string(info.name) + " is not supported yet (" + std::string(info.meaning) +
                    "); its placement rules arrive in a later version, and it is never passed unchecked");
    Op op;
    op.kind = *kind;
    op.loc = loc_of(item);
    std::vector<std::string> allowed = {"op", "in", "out"};
    for (const auto& a : info.attrs) allowed.push_back(a.name);
    std::string where = std::string(info.name);
    std::unordered_set<std::string> given;
    for_each_key(item, {}, where, [&](const YAML::Node& k, const YAML::Node& v) {
      const std::string& key = k.Scalar();
      if (key == "op" || key == "in" || key == "out") return;
      const AttrSpec* spec = info.find_attr(key);
      if (!spec) {
        std::vector<std::string> attrs;
        for (const auto& a : info.attrs) attrs.push_back(a.name);
        fail(k, "unknown attribute '" + key + "' for " + where + suggestion(key, allowed) + " (" + where + " takes: " +
                    join(attrs) + ")");
      }
      given.insert(key);
      if (v.IsNull()) fail(k, "attribute `" + key + "` of " + where + " has no value (" + attr_type_name(*spec) + ")");
      load_attr(op, *spec, v, where);
    });
    for (const auto& a : info.attrs)
      if (a.required && !given.count(a.name))
        fail(item, where + " needs attribute `" + a.name + "` (" + attr_type_name(a) + ")");
    auto ins = load_names(item["in"], "`in` of " + where, true);
    auto outs = load_names(item["out"], "`out` of " + where, true);
    auto count = [&](std::size_t got, int lo, int hi, const char* what, const char* key) {
      if (got < static_cast<std::size_t>(lo) || got > static_cast<std::size_t>(hi)) {
        std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
        auto at = item[key].IsDefined() ? item[key] : item;
        fail(at, where + " takes " + want + " " + what + (hi == 1 && lo == 1 ? "" : "s") + " (" + std::string(info.operands) +
                     "), got " + std::to_string(got));
      }
    };
    count(ins.size(), info.min_in, info.max_in, "input", "in");
    count(outs.size(), info.min_out, info.max_out, "output", "out");
    for (std::size_t i = 0; i < outs.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (outs[i] == outs[j]) fail(item["out"], where + " writes '" + p_.name(outs[i]) + "' twice");
    p_.add_op(*target_, op, ins, outs);
  }

  std::int64_t attr_int(const YAML::Node& v, const std::string& what, std::int64_t lo, std::int64_t hi) {
    std::int64_t x = 0;
    if (!v.IsScalar() || !parse_int(v.Scalar(), x)) fail(v, what + " must be an integer, got " + kind_of(v));
    if (x < lo || x > hi) fail(v, what + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + std::to_string(x));
    return x;
  }

  void load_attr(Op& op, const AttrSpec& spec, const YAML::Node& v, const std::string& where) {
    const std::string what = "attribute `" + spec.name + "` of " + where;
    OpAttrs& a = op.attrs;
    const std::string& n = spec.name;
    switch (spec.type) {
      case AttrType::Axes: {
        std::vector<YAML::Node> items;
        if (v.IsScalar()) items.push_back(v);
        else if (v.IsSequence() && v.size() > 0) for (const auto& x : v) items.push_back(x);
        else fail(v, what + " must be a mesh axis name or a list of them");
        for (const auto& x : items) {
          if (!x.IsScalar()) fail(x, what + " must name mesh axes");
          int idx = -1;
          for (std::size_t i = 0; i < p_.mesh.size(); ++i)
            if (p_.mesh[i].name == x.Scalar()) idx = static_cast<int>(i);
          if (idx < 0) {  // the contract makes this an illegal-collective finding, reported by the checks
            if (a.bad_axis == kNoIndex) {
              a.bad_axis = static_cast<std::uint32_t>(p_.bad_axes.size());
              p_.bad_axes.push_back({x.Scalar(), loc_of(x)});
            }
            continue;
          }
          if (a.axes & (1u << idx)) fail(x, what + " names axis '" + x.Scalar() + "' twice");
          a.axes |= 1u << idx;
        }
        return;
      }
      case AttrType::Int:
        if (n == "src" || n == "dst") a.rank = static_cast<std::int32_t>(attr_int(v, what, 0, 1 << 20));
        else if (n == "k") a.k = static_cast<std::int32_t>(attr_int(v, what, 1, 1 << 20));
        else if (n == "concat_dim") a.dim2 = static_cast<std::int16_t>(attr_int(v, what, -kMaxRank, kMaxRank - 1));
        else a.dim = static_cast<std::int16_t>(attr_int(v, what, -kMaxRank, kMaxRank - 1));
        return;
      case AttrType::Ints: {
        std::vector<int> list;
        if (v.IsScalar()) list.push_back(static_cast<int>(attr_int(v, what, -kMaxRank, kMaxRank - 1)));
        else if (v.IsSequence() && v.size() > 0 && v.size() <= static_cast<std::size_t>(kMaxRank))
          for (const auto& x : v) list.push_back(static_cast<int>(attr_int(x, what, -kMaxRank, kMaxRank - 1)));
        else fail(v, what + " must be a dim or a non-empty list of at most 8 dims");
        a.dims = static_cast<std::uint32_t>(p_.int_lists.size());
        p_.int_lists.push_back(std::move(list));
        return;
      }
      case AttrType::Number: {
        if (!v.IsScalar()) fail(v, what + " must be a number");
        const std::string& s = v.Scalar();
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(d)) fail(v, what + " must be a finite number, got " + kind_of(v));
        if (n == "p" && (d < 0 || d >= 1)) fail(v, what + " must be in [0, 1)");
        a.number = d;
        a.has_number = true;
        return;
      }
      case AttrType::Bool: {
        bool b = load_bool(v, what);
        if (n == "keepdim") a.keepdim = b;
        else if (n == "causal") a.causal = b;
        else if (n == "vocab_parallel") a.vocab_parallel = b;
        return;
      }
      case AttrType::Placement: {
        Placement pl = one_placement(v);
        if (n == "to") a.to = pl, a.has_to = true;
        else a.from = pl, a.has_from = true;
        return;
      }
      case AttrType::Placements:
        a.placements = static_cast<std::uint32_t>(p_.placement_maps.size());
        p_.placement_maps.push_back(load_placements(v, -1, where));
        return;
      case AttrType::Reduce: {
        auto r = v.IsScalar() ? parse_reduce(v.Scalar()) : std::nullopt;
        if (!r) fail(v, what + " must be sum, avg, max or min, got " + kind_of(v));
        a.rop = *r;
        return;
      }
      case AttrType::DType:
        a.dtype = load_dtype(v);
        a.has_dtype = true;
        return;
      case AttrType::Shape:
        a.shape = static_cast<std::uint32_t>(p_.shapes.size());
        p_.shapes.push_back(load_shape(v, "`" + n + "` of " + where, nullptr));
        return;
      case AttrType::Name:
        if (!v.IsScalar() || v.Scalar().empty()) fail(v, what + " must be a name");
        (n == "handle" ? a.handle : n == "group" ? a.group : n == "matches" ? a.matches : n == "label" ? a.label : n == "for" || n == "event" ? a.sync : a.stream) =
            p_.intern(v.Scalar());
        return;
      case AttrType::Names:
        a.handles = static_cast<std::uint32_t>(p_.name_lists.size());
        p_.name_lists.push_back(load_names(v, what, false));
        if (p_.name_lists.back().empty()) fail(v, what + " must list at least one name");
        return;
      case AttrType::Coords:
        a.coords = static_cast<std::uint32_t>(p_.coords.size());
        p_.coords.push_back(load_coords(v, what));
        return;
      case AttrType::Enum: {
        if (!v.IsScalar() || std::find(spec.choices.begin(), spec.choices.end(), v.Scalar()) == spec.choices.end())
          fail(v, what + " must be one of " + attr_type_name(spec) + ", got " + kind_of(v) +
                      (v.IsScalar() ? suggestion(v.Scalar(), spec.choices) : ""));
        const std::string& s = v.Scalar();
        if (n == "dst") a.dst_invariant = s == "I";
        else if (n == "rng") a.rng_per_rank = s == "per_rank";
        else if (n == "reduction") a.reduction = s == "sum" ? Reduction::Sum : s == "none" ? Reduction::None : Reduction::Mean;
        else if (n == "layout") a.layout = s == "bshd" ? AttnLayout::BSHD : s == "sbhd" ? AttnLayout::SBHD : AttnLayout::BHSD;
        else a.choice = static_cast<std::uint8_t>(std::find(spec.choices.begin(), spec.choices.end(), s) - spec.choices.begin());
        return;
      }
    }
  }

  // ---- training: loss, train, backward, grad_sync ---------------------------------------------
  void load_training(const YAML::Node& root) {
    if (!root["loss"].IsDefined() && !root["train"].IsDefined() && !root["backward"].IsDefined() && !root["grad_sync"].IsDefined()) return;
    std::unordered_set<NameId> defined;
    for (const auto& t : p_.tensors) defined.insert(t.name);
    for (const auto& op : p_.ops)
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
      p_.loss_loc = loc_of(loss);
    }
    auto need_loss = [&](const YAML::Node& k, const std::string& what) {
      if (p_.loss < 0) fail(k, what + " needs a `loss:` (the tensor the backward starts from, e.g. loss: loss)");
    };
    if (auto t = root["train"]; t.IsDefined()) {
      p_.train = load_bool(t, "`train`");
      p_.train_loc = loc_of(t);
      if (p_.train) need_loss(t, "`train: true`");
    }
    // Gradient names: `<tensor>.grad`, as PyTorch's x.grad. The backward starts from `<loss>.grad`.
    auto is_grad = [&](NameId id) {
      const std::string& n = p_.name(id);
      if (n.size() <= 5 || n.compare(n.size() - 5, 5, ".grad") != 0) return false;
      auto it = p_.name_ids.find(n.substr(0, n.size() - 5));
      return it != p_.name_ids.end() && defined.count(it->second) > 0;
    };
    auto load_list = [&](const YAML::Node& n, std::vector<Op>& list, const std::string& key, bool any_grad) {
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
      p_.backward_loc = loc_of(key);
      defined.insert(p_.intern(p_.name(p_.loss) + ".grad"));
      load_list(b, p_.backward, "backward", false);
    }
    if (auto g = root["grad_sync"]; g.IsDefined()) {
      auto key = find_key(root, "grad_sync");
      need_loss(key, "`grad_sync:`");
      p_.has_grad_sync = true;
      p_.grad_sync_loc = loc_of(key);
      load_list(g, p_.grad_sync, "grad_sync", !p_.has_backward);
    }
  }

  static YAML::Node find_key(const YAML::Node& map, const std::string& key) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node k = it->first;
      if (k.IsScalar() && k.Scalar() == key) return k;
    }
    return map;
  }

  // ---- outputs and expectations -------------------------------------------------------------
  void load_outputs(const YAML::Node& n) {
    if (!n.IsMap()) fail(n, "`outputs` must be a mapping of name -> {placement: ...}");
    std::unordered_set<NameId> defined;
    for (const auto& t : p_.tensors) defined.insert(t.name);
    for (const auto& op : p_.ops)
      for (NameId o : p_.outs(op)) defined.insert(o);
    for_each_key(n, {}, "`outputs`", [&](const YAML::Node& k, const YAML::Node& v) {
      OutputDecl o;
      const std::string& name = k.Scalar();
      auto it = p_.name_ids.find(name);
      if (it == p_.name_ids.end() || !defined.count(it->second)) {
        std::vector<std::string> cands;
        for (NameId id : defined) cands.push_back(p_.name(id));
        std::sort(cands.begin(), cands.end());
        fail(k, "output '" + name + "' is neither a declared tensor nor written by any op" + suggestion(name, cands));
      }
      o.name = it->second;
      o.loc = loc_of(k);
      if (!v.IsNull()) {
        if (!v.IsMap()) fail(v, "output '" + name + "' must be a mapping like {placement: {dp: S(0)}}");
        for_each_key(v, {"placement", "shape"}, "output '" + name + "'", [&](const YAML::Node& key, const YAML::Node& x) {
          if (key.Scalar() == "placement") {
            o.has_placement = true;
            o.placement = load_placements(x, -1, "output '" + name + "'");
          } else {
            o.has_shape = true;
            o.shape = load_shape(x, "output '" + name + "'", nullptr);
          }
        });
      }
      p_.outputs.push_back(std::move(o));
    });
  }

  void load_expect(const YAML::Node& n) {
    p_.has_expect = true;
    p_.expect_loc = loc_of(n);
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

  bool opens_quote(const YAML::Node& v) const {
    YAML::Mark m = v.Mark();
    if (m.pos < 0 || static_cast<std::size_t>(m.pos) >= text_.size()) return false;
    char c = text_[static_cast<std::size_t>(m.pos)];
    return c == '"' || c == '\'';
  }

  // Whether the quoted scalar at v's position has a closing quote anywhere after it.
  bool closes_quote(const YAML::Node& v) const {
    std::size_t pos = static_cast<std::size_t>(v.Mark().pos);
    char q = text_[pos];
    for (std::size_t i = pos + 1; i < text_.size(); ++i) {
      if (q == '"' && text_[i] == '\\') {
        ++i;
        continue;
      }
      if (text_[i] != q) continue;
      if (q == '\'' && i + 1 < text_.size() && text_[i + 1] == '\'') {
        ++i;
        continue;
      }
      return true;
    }
    return false;
  }

  Program& p_;
  const std::string& text_;
  std::vector<Op>* target_ = &p_.ops;  // where load_op appends
};

// YAML forbids tabs in indentation; yaml-cpp reports them only as a vague "illegal map value".
void reject_tab_indentation(const std::string& text) {
  std::uint32_t line = 1;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    for (std::size_t i = start; i < end && (text[i] == ' ' || text[i] == '\t'); ++i)
      if (text[i] == '\t')
        throw LoadError({line, static_cast<std::uint32_t>(i - start + 1)}, "invalid YAML: a tab in indentation (YAML indents with spaces)");
    start = end + 1;
    ++line;
  }
}

// Counts the documents of a YAML stream (stopping at two) and where they start. YAML::LoadAll loops forever
// on a stray top-level ',' (yaml-cpp 0.7 re-reads an empty document at the same place; found by fuzzing),
// so documents are counted with a bounded number of parser calls instead.
class DocCounter : public YAML::EventHandler {
 public:
  int docs = 0;
  YAML::Mark start[2], first_node[2];
  void OnDocumentStart(const YAML::Mark& m) override {
    if (docs < 2) start[docs] = first_node[docs] = m;
    ++docs;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { node(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override { node(m); }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override { node(m); }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& m) {
    if (docs >= 1 && docs <= 2 && !seen_[docs - 1]) first_node[docs - 1] = m, seen_[docs - 1] = true;
  }
  bool seen_[2] = {false, false};
};

Program load(const std::string& text, const std::string& filename) {
  Program p;
  p.file = filename;
  YAML::Node root;
  try {
    root = YAML::Load(text);
    DocCounter count;
    std::stringstream in(text);
    YAML::Parser parser(in);
    for (int calls = 0; calls < 2 && parser.HandleNextDocument(count); ++calls) {
    }
    if (count.docs > 1 && count.start[1].pos == count.start[0].pos) {
      // No progress: text the parser cannot place, such as a ',' outside [ ] or { }.
      std::uint32_t line = 1, col = 1;
      for (std::size_t i = 0; i < text.size(); ++i) {
        char ch = text[i];
        if (ch == '#') {
          while (i < text.size() && text[i] != '\n') ++i;
        }
        if (i < text.size() && text[i] == '\n') {
          ++line, col = 1;
          continue;
        }
        if (i < text.size() && ch != ' ' && ch != '\t' && ch != '\r' && ch != '#') break;
        ++col;
      }
      throw LoadError({line, col}, "invalid YAML: text that is not a YAML node here (such as a ',' outside [ ] or { })");
    }
    if (count.docs > 1) {
      // Point at the `---` that starts the second document: the last one at or before its first node.
      YAML::Mark m = count.first_node[1];
      std::uint32_t first_node = static_cast<std::uint32_t>(std::max(0, m.line) + 1), line = 1, sep = 0;
      for (std::size_t i = 0; i < text.size() && line <= first_node; ++i) {
        if ((i == 0 || text[i - 1] == '\n') && text.compare(i, 3, "---") == 0) sep = line;
        if (text[i] == '\n') ++line;
      }
      throw LoadError({sep ? sep : first_node, 1},
                      "a program file holds one YAML document; another document starts here");
    }
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's guard against stack exhaustion (2000 levels)
    Loc l{static_cast<std::uint32_t>(std::max(0, e.mark.line) + 1), static_cast<std::uint32_t>(std::max(0, e.mark.column) + 1)};
    throw LoadError(l, "invalid YAML: nested more than " + std::to_string(e.depth() - 1) + " levels deep");
  } catch (const YAML::Exception& e) {
    reject_tab_indentation(text);  // the likely cause, said plainly
    Loc l{static_cast<std::uint32_t>(std::max(0, e.mark.line) + 1), static_cast<std::uint32_t>(std::max(0, e.mark.column) + 1)};
    throw LoadError(l, "invalid YAML: " + e.msg);
  }
  try {
    Loader(p, text).load(root);
  } catch (const YAML::Exception& e) {
    Loc l{static_cast<std::uint32_t>(std::max(0, e.mark.line) + 1), static_cast<std::uint32_t>(std::max(0, e.mark.column) + 1)};
    throw LoadError(l, "malformed program: " + e.msg);
  }
  return p;
}

}  // namespace

Program load_program_string(const std::string& text, const std::string& filename) { return load(text, filename); }

Program load_program_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw LoadError({}, "is a directory, not a program file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw LoadError({}, "cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > (std::size_t{1} << 30)) throw LoadError({}, "file is larger than 1 GiB");
  return load(text, path);
}

}  // namespace spmd
