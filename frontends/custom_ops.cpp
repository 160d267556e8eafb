// frontends/custom_ops.cpp - mapping files of custom ops: loading (yaml-cpp, located errors) and the expansion of
// an entry's op templates ($param, $result, $temporary, $last(p, x), $lead(p, x), $rank(x), $shape(x), $axis(group)).
#include "frontends/custom_ops.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "frontends/custom_ops_builtin.h"
#include "frontends/yaml_util.h"
#include "ir/op_table.h"

namespace spmd::frontends {

namespace {

// A template attribute value: a scalar as written, or a flow list of scalars.
std::string value_text(const YAML::Node& n, const std::string& file) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsSequence()) {
    std::string s = "[";
    for (std::size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + value_text(n[i], file);
    return s + "]";
  }
  throw ImportError(file, loc_of(n), "a template attribute must be a scalar or a list");
}

std::vector<std::string> names(const YAML::Node& n, const std::string& file, const std::string& what) {
  std::vector<std::string> out;
  if (!n) return out;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence()) throw ImportError(file, loc_of(n), what + " must be a name or a list of names");
  for (const auto& x : n) out.push_back(scalar(x, file, what));
  return out;
}

}  // namespace

void CustomOps::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ImportError(path, {}, "cannot read the mapping file");
  std::ostringstream ss;
  ss << in.rdbuf();
  load_text(ss.str(), path);
}

void CustomOps::load_text(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ImportError(file, {static_cast<std::uint32_t>(e.mark.line + 1), static_cast<std::uint32_t>(e.mark.column + 1)}, "invalid YAML: " + e.msg);
  }
  if (!root.IsMap() || !root["ops"] || !root["ops"].IsMap())
    throw ImportError(file, {1, 1}, "a mapping file is a YAML mapping with `ops: {target: {params: ..., ops: [...]}}` (docs/import.md)");
  for (const auto& it : root) {
    std::string k = it.first.Scalar();
    if (k != "ops") throw ImportError(file, loc_of(it.first), "unknown key '" + k + "' in a mapping file (it has `ops:`)");
  }
  std::vector<std::string> ir_ops;
  for (const auto& i : all_ops()) ir_ops.emplace_back(i.name);
  for (const auto& it : root["ops"]) {
    CustomOp op;
    op.target = it.first.Scalar();
    op.file = file;
    op.loc = loc_of(it.first);
    const YAML::Node& e = it.second;
    if (!e.IsMap()) throw ImportError(file, loc_of(e), "the entry of '" + op.target + "' must be a mapping");
    for (const auto& kv : e) {
      std::string key = kv.first.Scalar();
      static const std::set<std::string> keys = {"params", "results", "ops", "shapes", "identity"};
      if (!keys.count(key)) throw ImportError(file, loc_of(kv.first), "unknown key '" + key + "' in the entry of '" + op.target + "' (params, results, ops, shapes, identity)");
    }
    if (!e["params"]) throw ImportError(file, op.loc, "the entry of '" + op.target + "' needs `params:` (the op's argument names, in order)");
    if (e["params"].IsSequence()) {
      for (std::size_t i = 0; i < e["params"].size(); ++i) op.params += (i ? ", " : "") + scalar(e["params"][i], file, "a parameter");
    } else {
      op.params = scalar(e["params"], file, "`params`");
    }
    op.results = names(e["results"], file, "`results`");
    if (op.results.empty()) op.results = {"out"};
    if (auto id = e["identity"]) {
      std::string v = scalar(id, file, "`identity`");
      if (v == "true") op.inplace_identity = true;
      else op.identity = v;
    }
    if (auto sh = e["shapes"]) {
      if (!sh.IsMap()) throw ImportError(file, loc_of(sh), "`shapes` must map a result to the parameter whose shape it has");
      for (const auto& kv : sh) op.shapes[kv.first.Scalar()] = scalar(kv.second, file, "a shape source");
    }
    if (auto ops = e["ops"]) {
      if (!ops.IsSequence()) throw ImportError(file, loc_of(ops), "`ops` must be a list of op templates like {op: LayerNorm, in: [$x], out: $out}");
      for (const auto& t : ops) {
        if (!t.IsMap() || !t["op"]) throw ImportError(file, loc_of(t), "an op template needs `op:`");
        CustomTemplateOp top;
        top.op = scalar(t["op"], file, "`op`");
        if (!op_by_name(top.op)) {
          auto dym = did_you_mean(top.op, ir_ops);
          throw ImportError(file, loc_of(t["op"]), "unknown op '" + top.op + "' in the template of '" + op.target + "'" + (dym ? "; did you mean '" + *dym + "'?" : ""));
        }
        for (const auto& kv : t) {
          std::string key = kv.first.Scalar();
          if (key == "op") continue;
          if (key == "in") top.in = names(kv.second, file, "`in`");
          else if (key == "out") top.out = names(kv.second, file, "`out`");
          else top.attrs.emplace_back(key, value_text(kv.second, file));
        }
        op.ops.push_back(std::move(top));
      }
    }
    if (op.ops.empty() && op.identity.empty() && !op.inplace_identity)
      throw ImportError(file, op.loc, "the entry of '" + op.target + "' needs `ops:` (a template) or `identity:`");
    ops_[op.target] = std::move(op);
  }
}

const CustomOp* CustomOps::find(const std::string& target) const {
  auto it = ops_.find(target);
  return it == ops_.end() ? nullptr : &it->second;
}

void CustomOps::emit(Ctx& c, const CustomOp& op) const {
  if (op.inplace_identity) c.fail("'" + op.target + "' is a mutating op; it appears only inside auto_functionalized");
  if (!op.identity.empty()) {
    c.alias(0, c.T(op.identity));
    return;
  }
  std::map<std::string, std::string> temps;
  auto result_index = [&](const std::string& n) -> int {
    for (std::size_t k = 0; k < op.results.size(); ++k)
      if (op.results[k] == n) return static_cast<int>(k);
    return -1;
  };
  auto param_text = [&](const std::string& p) -> std::string {
    const PyVal& v = c.v(p);
    switch (v.k) {
      case PyVal::K::Name: return c.t(p);
      case PyVal::K::Int: return c.size(p);
      case PyVal::K::Float: return num_text(v.f);
      case PyVal::K::Bool: return v.b ? "true" : "false";
      case PyVal::K::Str: return v.s;
      case PyVal::K::List:
      case PyVal::K::Tuple: return ints_text(c.Is(p));
      case PyVal::K::None:
      case PyVal::K::Call:
      case PyVal::K::Index: break;
    }
    c.fail("argument '" + p + "' of " + op.target + " cannot be written into its template");
  };
  // $name: a parameter, a result or a temporary
  auto name_text = [&](const std::string& n) -> std::string {
    if (int k = result_index(n); k >= 0) return c.out(static_cast<std::size_t>(k));
    if (c.is_param(n)) return param_text(n);
    auto it = temps.find(n);
    if (it == temps.end()) it = temps.emplace(n, c.tmp(n)).first;
    return it->second;
  };
  auto fn = [&](const std::string& f, const std::vector<std::string>& args) -> std::string {
    auto rank_of = [&](const std::string& x) { return c.ty(x).shape.size(); };
    if ((f == "last" || f == "lead") && args.size() == 2) {
      std::size_t k = c.Is(args[0]).size(), r = rank_of(args[1]);
      if (k > r) c.fail(args[0] + " has more dims than " + args[1]);
      std::vector<std::int64_t> d;
      for (std::size_t i = f == "last" ? r - k : 0; i < (f == "last" ? r : r - k); ++i) d.push_back(static_cast<std::int64_t>(i));
      return ints_text(d);
    }
    if (f == "rank" && args.size() == 1) return std::to_string(rank_of(args[0]));
    if (f == "shape" && args.size() == 1) {  // a parameter's shape, or a result's annotated one
      if (int k = result_index(args[0]); k >= 0) {
        const TensorType* a = c.annotated(static_cast<std::size_t>(k));
        if (!a) c.fail("$shape(" + args[0] + ") in the mapping of " + op.target + ": the graph does not annotate that result");
        return shape_text(a->shape);
      }
      return shape_text(c.ty(args[0]).shape);
    }
    if (f == "axis" && args.size() == 1) return c.axis_of_group(c.v(args[0]));
    if (f == "value" && args.size() == 1) {  // a constant tensor argument's value (HLO passes eps as a constant)
      const Value& v = c.T(args[0]);
      if (!v.scalar) c.fail("$value(" + args[0] + ") in the mapping of " + op.target + ": the argument is not a constant scalar");
      return num_text(*v.scalar);
    }
    if (f == "lift" && args.size() == 3) {  // the shape of w placed at dim d of x's rank, 1 elsewhere (to broadcast w along d)
      const auto& w = c.ty(args[0]).shape;
      std::size_t r = c.ty(args[1]).shape.size();
      long d = std::strtol(param_text(args[2]).c_str(), nullptr, 10);
      if (d < 0) d += static_cast<long>(r);
      if (d < 0 || static_cast<std::size_t>(d) + w.size() > r) c.fail("$lift: dim " + std::to_string(d) + " out of range");
      std::vector<std::int64_t> s(r, 1);
      for (std::size_t i = 0; i < w.size(); ++i) s[static_cast<std::size_t>(d) + i] = w[i];
      return shape_text(s);
    }
    throw ImportError(op.file, op.loc, "unknown template function $" + f + " with " + std::to_string(args.size()) + " arguments in the entry of '" + op.target +
                                           "' ($last(p, x), $lead(p, x), $rank(x), $shape(x), $axis(group), $value(c), $lift(w, x, d))");
  };
  auto subst = [&](const std::string& s) -> std::string {
    std::string o;
    for (std::size_t i = 0; i < s.size();) {
      if (s[i] != '$') {
        o += s[i++];
        continue;
      }
      std::size_t a = ++i;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      std::string n = s.substr(a, i - a);
      if (n.empty()) throw ImportError(op.file, op.loc, "a '$' without a name in the template of '" + op.target + "'");
      if (i < s.size() && s[i] == '(') {
        auto close = s.find(')', i);
        if (close == std::string::npos) throw ImportError(op.file, op.loc, "unclosed '(' after $" + n + " in the template of '" + op.target + "'");
        std::vector<std::string> args;
        std::stringstream ss(s.substr(i + 1, close - i - 1));
        std::string x;
        while (std::getline(ss, x, ',')) {
          while (!x.empty() && x.front() == ' ') x.erase(x.begin());
          while (!x.empty() && x.back() == ' ') x.pop_back();
          args.push_back(x);
        }
        o += fn(n, args);
        i = close + 1;
      } else {
        o += name_text(n);
      }
    }
    return o;
  };
  auto ref = [&](const std::string& s) {
    if (s.empty() || s[0] != '$') throw ImportError(op.file, op.loc, "'" + s + "' in the template of '" + op.target + "' must be a $name (a parameter, a result or a temporary)");
    return subst(s);
  };
  // Only the template ops the read results need (a tuple's unread results, and what only they read, are skipped).
  std::set<std::string> want;
  for (std::size_t k = 0; k < op.results.size(); ++k)
    if (op.results.size() == 1 || c.needs(k)) want.insert("$" + op.results[k]);
  std::vector<bool> keep(op.ops.size());
  for (std::size_t i = op.ops.size(); i-- > 0;) {
    const auto& t = op.ops[i];
    keep[i] = std::any_of(t.out.begin(), t.out.end(), [&](const std::string& o) { return want.count(o) > 0; });
    if (keep[i]) want.insert(t.in.begin(), t.in.end());
  }
  for (std::size_t i = 0; i < op.ops.size(); ++i) {
    if (!keep[i]) continue;
    const auto& t = op.ops[i];
    std::vector<std::string> in, out;
    for (const auto& x : t.in) in.push_back(ref(x));
    for (const auto& x : t.out) out.push_back(ref(x));
    std::vector<std::pair<std::string, std::string>> attrs;
    for (const auto& [k, v] : t.attrs) attrs.emplace_back(k, subst(v));
    c.emit(t.op, std::move(in), std::move(out), std::move(attrs));
  }
  for (std::size_t k = 0; k < op.results.size(); ++k) {
    const std::string& r = op.results[k];
    if (op.results.size() > 1 && !c.needs(k)) continue;
    bool written = false;
    for (const auto& t : op.ops)
      for (const auto& o : t.out) written |= o == "$" + r;
    if (!written) c.fail("result '" + r + "' of " + op.target + " is read, but its mapping (" + op.file + ":" + std::to_string(op.loc.line) + ") does not compute it");
    auto sh = op.shapes.find(r);
    if (sh != op.shapes.end()) {
      c.result(k, c.ty(sh->second));
    } else if (const TensorType* a = c.annotated(k)) {
      c.result(k, *a);
    } else {
      c.fail("the shape of result '" + r + "' of " + op.target + " is neither annotated nor given by `shapes:` in its mapping");
    }
  }
}

bool custom_op_is_identity(const Ctx& c, const std::string& target) {
  const CustomOps* ops = c.custom();
  const CustomOp* op = ops ? ops->find(target) : nullptr;
  return op && op->inplace_identity;
}

CustomOps default_custom_ops() {
  CustomOps ops;
  if (const char* env = std::getenv("SPMDCHECK_OPS"); env && *env) {
    std::stringstream ss(env);
    std::string p;
    while (std::getline(ss, p, ':'))
      if (!p.empty()) ops.load_file(p);
    return ops;
  }
#ifdef SPMD_SOURCE_DIR
  std::string repo = std::string(SPMD_SOURCE_DIR) + "/frontends/custom_ops.yaml";
  std::error_code ec;
  if (std::filesystem::is_regular_file(repo, ec)) {
    ops.load_file(repo);
    return ops;
  }
#endif
  ops.load_text(kBuiltinCustomOps, "frontends/custom_ops.yaml (built in)");
  return ops;
}

}  // namespace spmd::frontends
