// frontends/lower.cpp - lower_graph: the nodes a compared output needs, each mapped by its op-table row.
#include "frontends/lower.h"

#include <stdexcept>

#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "frontends/custom_ops.h"

namespace spmd::frontends {

namespace {

bool is_collective(const std::string& target) {
  return target.rfind("_c10d_functional.", 0) == 0 || target == "all-reduce" || target == "all-reduce-start" || target == "all-gather" || target == "reduce-scatter" ||
         target == "all-to-all" || target == "collective-permute";
}

void refs(const PyVal& v, std::vector<std::string>& out) {
  if (v.k == PyVal::K::Name) out.push_back(v.s);
  for (const auto& x : v.items) refs(x, out);
  for (const auto& [k, x] : v.kw) refs(x, out);
}

std::vector<std::string> node_refs(const Node& n) {
  std::vector<std::string> out;
  for (const auto& a : n.args) refs(a, out);
  for (const auto& [k, a] : n.kwargs) refs(a, out);
  return out;
}

struct Param {
  std::string name;
  std::optional<std::string> dflt;
};

// "self, other, *, alpha=1" -> [{self}, {other}, {alpha, "1"}] (cached per text; the key is a copy: a custom op's
// text lives only as long as its import).
const std::vector<Param>& params_of(std::string_view text) {
  static std::unordered_map<std::string, std::vector<Param>> cache;
  auto it = cache.find(std::string(text));
  if (it != cache.end()) return it->second;
  std::vector<Param> ps;
  std::size_t a = 0;
  while (a < text.size()) {
    auto comma = text.find(',', a);
    // a default may be a list: "dims=[]"
    auto lb = text.find('[', a);
    if (lb != std::string_view::npos && lb < comma) comma = text.find(',', text.find(']', lb));
    std::string_view item = text.substr(a, comma == std::string_view::npos ? std::string_view::npos : comma - a);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty() && item != "*" && item != "**") {
      Param p;
      auto eq = item.find('=');
      p.name = std::string(item.substr(0, eq));
      if (eq != std::string_view::npos) p.dflt = std::string(item.substr(eq + 1));
      ps.push_back(std::move(p));
    }
    if (comma == std::string_view::npos) break;
    a = comma + 1;
  }
  return cache.emplace(text, std::move(ps)).first->second;
}

PyVal parse_default(const std::string& s) {
  PyVal v;
  if (s == "None") return v;
  if (s == "True" || s == "False") return v.k = PyVal::K::Bool, v.b = s == "True", v;
  if (s == "[]") return v.k = PyVal::K::List, v;
  if (s.front() == '\'') return v.k = PyVal::K::Str, v.s = s.substr(1, s.size() - 2), v;
  if (s.find_first_of(".e") != std::string::npos && s.find_first_not_of("0123456789.e-+") == std::string::npos)
    return v.k = PyVal::K::Float, v.f = std::strtod(s.c_str(), nullptr), v;
  if (s.find_first_not_of("0123456789-") == std::string::npos) return v.k = PyVal::K::Int, v.i = std::strtoll(s.c_str(), nullptr, 10), v;
  v.k = PyVal::K::Name;
  v.s = s;
  return v;
}

}  // namespace

// ---- shared helpers ----------------------------------------------------------------------------

std::string ints_text(const std::vector<std::int64_t>& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
std::string shape_text(const std::vector<std::int64_t>& s) { return ints_text(s); }
std::string type_text(const TensorType& t) {
  std::string o = t.dtype + "[";
  for (std::size_t i = 0; i < t.shape.size(); ++i) o += (i ? ", " : "") + std::to_string(t.shape[i]);
  return o + "]";
}

std::string num_text(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

std::vector<std::int64_t> broadcast_shape(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b, const Ctx& c) {
  std::size_t n = std::max(a.size(), b.size());
  std::vector<std::int64_t> o(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) c.fail("operands of shapes " + shape_text(a) + " and " + shape_text(b) + " do not broadcast");
    o[i] = x == 1 ? y : x;
  }
  return o;
}

// ---- the lowering of one graph -----------------------------------------------------------------

class Lowering {
 public:
  Lowering(const Graph& g, const LowerOptions& o) : g_(g), o_(o) {}

  Lowered run();

  const Graph& g_;
  const LowerOptions& o_;
  std::unordered_map<std::string, Value> env_;
  std::unordered_map<std::string, std::vector<Value>> parts_;          // tuple node -> its results
  std::unordered_map<std::string, std::vector<std::string>> getitems_;  // tuple node -> the getitem reading part k
  std::unordered_map<std::string, std::string> undefined_;             // name -> why it cannot be used
  std::set<std::string> needed_;
  std::unordered_map<std::string, const Node*> nodes_;  // graph name -> its node
  std::vector<EOp> ops_;
  std::set<std::string> used_names_;
  int tmp_ = 0;
  const Node* cur_ = nullptr;
  std::string at_;

  std::string ir_name(const std::string& n) const { return o_.prefix + n; }
  const Value& lookup(const PyVal& ref, const Node& n) const {
    auto it = env_.find(ref.s);
    if (it != env_.end()) return it->second;
    auto u = undefined_.find(ref.s);
    if (u != undefined_.end()) throw ImportError(g_.file, ref.loc.line ? ref.loc : n.loc, u->second);
    throw ImportError(g_.file, ref.loc.line ? ref.loc : n.loc, "'" + ref.s + "' is not defined before this node");
  }
  std::string at_of(const Node& n) const {
    std::string s;
    if (!n.origin.file.empty()) s = n.origin.file + ":" + std::to_string(n.origin.line) + " | ";
    s += o_.graph_label + ":" + std::to_string(n.loc.line) + ":" + std::to_string(n.loc.col) + " " + n.name + " = " + n.target;
    return s;
  }
  void lower_node(const Node& n);
};

Lowered Lowering::run() {
  // Which nodes the compared outputs (and the collectives) need, and which tuple parts are read.
  for (const auto& r : o_.roots) needed_.insert(r);
  std::unordered_map<std::string, const Node*>& by_name = nodes_;
  for (const auto& n : g_.nodes) by_name[n.name] = &n;
  // Every collective is kept (each rank must issue it), and so is every reader of a collective's result (a read
  // before its wait_tensor is a missing-wait whether or not a compared output needs it).
  std::set<std::string> collective_results;
  for (const auto& n : g_.nodes)
    if (is_collective(n.target)) collective_results.insert(n.name);
  for (auto it = g_.nodes.rbegin(); it != g_.nodes.rend(); ++it) {
    const Node& n = *it;
    bool keep = needed_.count(n.name) || (o_.keep_collectives && (is_collective(n.target) || n.target == "_c10d_functional.wait_tensor.default" || n.target == "all-reduce-done"));
    if (o_.keep_collectives && !keep)
      for (const auto& r : node_refs(n)) keep |= collective_results.count(r) > 0;
    if (!keep) continue;
    needed_.insert(n.name);
    for (const auto& r : node_refs(n)) needed_.insert(r);
    if (n.target == "getitem" && n.args.size() == 2 && n.args[0].k == PyVal::K::Name && n.args[1].k == PyVal::K::Int) {
      auto& v = getitems_[n.args[0].s];
      auto k = static_cast<std::size_t>(std::max<std::int64_t>(0, n.args[1].i));
      if (v.size() <= k) v.resize(k + 1);
      v[k] = n.name;
    }
  }
  for (const auto& in : g_.inputs) {
    Value v;
    auto r = o_.input_ir.find(in.name);
    v.ir = r == o_.input_ir.end() ? in.name : r->second;
    v.type = *in.type;
    env_[in.name] = std::move(v);
  }
  Lowered out;
  for (const auto& n : g_.nodes) {
    if (!needed_.count(n.name)) {
      out.skipped.insert(n.target);
      continue;
    }
    lower_node(n);
  }
  out.ops = std::move(ops_);
  for (auto& [k, v] : env_) out.values[k] = v;
  return out;
}

void Lowering::lower_node(const Node& n) {
  cur_ = &n;
  at_ = at_of(n);
  if (n.type && !n.type->symbolic.empty())
    throw ImportError(g_.file, n.loc, "node " + n.name + " (" + n.target + ") has a shape with the symbolic dim '" + n.type->symbolic +
                                          "' (a data-dependent or dynamic shape), which is not supported yet: capture with static shapes");
  if (n.target == "getitem") {
    if (n.args.size() != 2 || n.args[0].k != PyVal::K::Name || n.args[1].k != PyVal::K::Int)
      throw ImportError(g_.file, n.loc, "a tuple element must be read as name[index]");
    auto p = parts_.find(n.args[0].s);
    if (p == parts_.end()) {
      lookup(n.args[0], n);  // the located error for an undefined name
      throw ImportError(g_.file, n.loc, "'" + n.args[0].s + "' is not a tuple");
    }
    auto k = static_cast<std::size_t>(n.args[1].i);
    if (n.args[1].i < 0 || k >= p->second.size() || (p->second[k].ir.empty() && !p->second[k].int_value))
      throw ImportError(g_.file, n.loc, "element " + std::to_string(n.args[1].i) + " of '" + n.args[0].s + "' is not available");
    Value v = p->second[k];
    if (n.type && !v.ir.empty() && n.type->shape != v.type.shape)
      throw ImportError(g_.file, n.loc, "the annotation " + type_text(*n.type) + " contradicts the element's type " + type_text(v.type));
    env_[n.name] = std::move(v);
    return;
  }
  if (n.target == "get_attr") {
    std::string attr = n.args.empty() ? "" : n.args[0].s;
    auto it = o_.constants.find(attr);
    std::optional<double> val = it != o_.constants.end() ? std::optional<double>(it->second) : o_.default_constant;
    if (!val) {
      undefined_[n.name] = "the value of self." + attr + " is not in the graph dump (print_readable does not print tensor constants): give it in a relation file as `constants: {" +
                           attr + ": VALUE}`";
      return;
    }
    Value v;
    v.scalar = *val;
    v.type = {"f32", {}};
    env_[n.name] = std::move(v);  // materialized as a tensor by lift_fresh_copy or a use
    return;
  }
  const Row* row = nullptr;
  static std::unordered_map<std::string_view, const Row*> fx_index, hlo_index;
  auto& index = g_.format == "hlo" ? hlo_index : fx_index;
  if (index.empty())
    for (const auto& r : g_.format == "hlo" ? hlo_rows() : aten_rows()) index[r.target] = &r;
  if (auto it = index.find(n.target); it != index.end()) row = it->second;
  // A number the text spells out of range or not at all (std::stoll's errors) is this node's bad input.
  auto guarded = [&](auto&& emit) {
    try {
      emit();
    } catch (const std::invalid_argument&) {
      throw ImportError(g_.file, n.loc, n.target + ": an attribute or operand that should be an integer is not one");
    } catch (const std::out_of_range&) {
      throw ImportError(g_.file, n.loc, n.target + ": an integer attribute or operand is out of range");
    }
  };
  if (row) {
    Ctx c(*this, n, row->params);
    guarded([&] { row->emit(c); });
  } else if (o_.custom && o_.custom->find(n.target)) {
    const CustomOp& co = *o_.custom->find(n.target);
    Ctx c(*this, n, co.params);
    guarded([&] { o_.custom->emit(c, co); });
  } else {
    std::string hint = g_.format == "hlo" ? "" : " (add it to a mapping file of custom ops, docs/import.md)";
    throw ImportError(g_.file, n.loc, "unsupported op '" + n.target + "' (node " + n.name + "): spmdcheck has no mapping for it" + hint);
  }
  if (!env_.count(n.name) && !parts_.count(n.name)) throw ImportError(g_.file, n.loc, "internal: the row for '" + n.target + "' gave no result");
}

Lowered lower_graph(const Graph& g, const LowerOptions& o) { return Lowering(g, o).run(); }

// ---- Ctx ---------------------------------------------------------------------------------------

Ctx::Ctx(Lowering& l, const Node& n, std::string_view params) : l_(l), n_(n) {
  const auto& ps = params_of(params);
  defaults_.reserve(ps.size());
  std::size_t pos = 0;
  for (const auto& p : ps) {
    const PyVal* v = nullptr;
    if (pos < n.args.size() && !n.kwarg(p.name)) v = &n.args[pos++];
    else if (const PyVal* k = n.kwarg(p.name)) v = k;
    else if (p.dflt) {
      defaults_.push_back(parse_default(*p.dflt));
      v = &defaults_.back();
    }
    bound_.emplace_back(p.name, v);
  }
  bool any_kw = params.find("**") != std::string_view::npos;  // "**": further operands and the op's own keyword arguments
  if (pos < n.args.size() && !any_kw) fail(n.target + " takes " + std::to_string(pos) + " positional arguments here, got " + std::to_string(n.args.size()));
  for (const auto& [k, x] : n.kwargs) {
    if (any_kw) break;
    bool known = false;
    for (const auto& p : ps) known |= p.name == k;
    // keyword arguments that do not change values (device, layout, memory format, pin_memory) are accepted
    static const std::set<std::string> inert = {"device", "layout", "memory_format", "pin_memory", "non_blocking", "requires_grad",
                                                // HLO: placement hints and names that do not change values
                                                "sharding", "frontend_attributes", "operand_precision", "precision_config", "channel_id",
                                                "use_global_device_ids", "to_apply", "api_version", "custom_call_target", "backend_config", "reducer",
                                                "statistics", "custom_call_schedule", "output_to_operand_aliasing"};
    if (!known && !inert.count(k)) fail_at(x, "unsupported keyword argument '" + k + "' of " + n.target);
  }
}

const PyVal* Ctx::find(std::string_view p) const {
  for (const auto& [k, v] : bound_)
    if (k == p) return v;
  throw ImportError(l_.g_.file, n_.loc, "internal: parameter '" + std::string(p) + "' is not in the row of " + n_.target);
}

bool Ctx::is_param(std::string_view p) const {
  for (const auto& [k, v] : bound_)
    if (k == p) return true;
  return false;
}

bool Ctx::has(std::string_view p) const {
  if (!is_param(p)) return false;  // a row without that parameter: never given
  const PyVal* x = find(p);
  return x && x->k != PyVal::K::None;
}

const PyVal& Ctx::v(std::string_view p) const {
  const PyVal* x = find(p);
  if (!x) fail(n_.target + " needs argument '" + std::string(p) + "'");
  return *x;
}

bool Ctx::is_tensor(std::string_view p) const {
  const PyVal* x = find(p);
  if (!x || x->k != PyVal::K::Name) return false;
  auto it = l_.env_.find(x->s);
  return it == l_.env_.end() || !it->second.int_value;
}

const Value& Ctx::tensor_at(const PyVal& x) const {
  if (x.k != PyVal::K::Name) fail_at(x, n_.target + " expects a tensor here");
  const Value& v = l_.lookup(x, n_);
  if (v.is_tuple) fail_at(x, "'" + x.s + "' is a tuple; read an element with " + x.s + "[i]");
  if (v.ir.empty()) {
    if (v.scalar) {  // a lifted constant used directly: materialize it
      auto& self = const_cast<Ctx&>(*this);
      Value nv = v;
      nv.ir = self.full({}, *v.scalar, v.type.dtype);
      l_.env_[x.s] = nv;
      return l_.env_[x.s];
    }
    fail_at(x, "'" + x.s + "' is not a tensor");
  }
  return v;
}

const Value& Ctx::T(std::string_view p) const { return tensor_at(v(p)); }

const Node* Ctx::producer(const PyVal& x) const {
  if (x.k != PyVal::K::Name) return nullptr;
  auto it = l_.nodes_.find(x.s);
  return it == l_.nodes_.end() ? nullptr : it->second;
}

std::optional<double> Ctx::constant(std::string_view p) const {
  const PyVal& x = v(p);
  if (x.k != PyVal::K::Name) return x.is_num() && x.expr.empty() ? std::optional<double>(x.num()) : std::nullopt;
  return l_.lookup(x, n_).scalar;
}

std::int64_t Ctx::I(std::string_view p) const {
  const PyVal& x = v(p);
  if (x.k == PyVal::K::Name) {
    const Value& val = l_.lookup(x, n_);
    if (val.int_value) return *val.int_value;
  }
  if (x.k != PyVal::K::Int && x.k != PyVal::K::Bool) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be an integer");
  if (!x.expr.empty()) throw RankVarying(l_.g_.file, x.loc, "argument '" + std::string(p) + "' of " + n_.target + " differs between ranks");
  return x.k == PyVal::K::Bool ? x.b : x.i;
}

double Ctx::F(std::string_view p) const {
  const PyVal& x = v(p);
  if (!x.is_num()) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be a number");
  if (!x.expr.empty()) throw RankVarying(l_.g_.file, x.loc, "argument '" + std::string(p) + "' of " + n_.target + " differs between ranks");
  return x.num();
}

std::vector<std::int64_t> Ctx::Is(std::string_view p) const {
  const PyVal& x = v(p);
  std::vector<std::int64_t> o;
  if (x.k == PyVal::K::Int) return {I(p)};
  if (!x.is_seq()) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be a list of integers");
  for (const auto& e : x.items) {
    if (e.k == PyVal::K::Name) {
      const Value& val = l_.lookup(e, n_);
      if (val.int_value) {
        o.push_back(*val.int_value);
        continue;
      }
    }
    if (e.k != PyVal::K::Int) fail_at(e, "argument '" + std::string(p) + "' of " + n_.target + " must hold integers");
    if (!e.expr.empty()) throw RankVarying(l_.g_.file, e.loc, "argument '" + std::string(p) + "' of " + n_.target + " differs between ranks");
    o.push_back(e.i);
  }
  return o;
}

std::string Ctx::S(std::string_view p) const {
  const PyVal& x = v(p);
  if (x.k != PyVal::K::Str) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be a string");
  return x.s;
}

std::string Ctx::size(std::string_view p) const {
  const PyVal& x = v(p);
  if (x.k != PyVal::K::Int) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be an integer");
  return x.expr.empty() ? std::to_string(x.i) : x.expr;
}

int Ctx::dim(std::string_view p, std::size_t rank) const {
  std::int64_t d = I(p);
  auto r = static_cast<std::int64_t>(rank);
  if (d < -std::max<std::int64_t>(r, 1) || d >= std::max<std::int64_t>(r, 1)) fail_at(v(p), "dim " + std::to_string(d) + " is out of range for a tensor of rank " + std::to_string(rank));
  return static_cast<int>(d < 0 ? d + r : d);
}

std::size_t Ctx::n_results() const {
  auto it = l_.getitems_.find(n_.name);
  return it == l_.getitems_.end() ? 1 : it->second.size();
}

bool Ctx::needs(std::size_t k) const {
  auto it = l_.getitems_.find(n_.name);
  return it != l_.getitems_.end() && k < it->second.size() && !it->second[k].empty();
}

std::string Ctx::out(std::size_t k) {
  auto it = l_.getitems_.find(n_.name);
  if (it != l_.getitems_.end() || !n_.tuple.empty()) {  // a tuple: the part read by getitem k, else a temporary
    if (it != l_.getitems_.end() && k < it->second.size() && !it->second[k].empty()) return l_.ir_name(it->second[k]);
    return l_.ir_name(n_.name) + "~" + std::to_string(k);
  }
  if (k) return l_.ir_name(n_.name) + "~" + std::to_string(k);
  return l_.ir_name(n_.name);
}

const TensorType* Ctx::annotated(std::size_t k) const {
  if (k < n_.tuple.size()) return &n_.tuple[k];
  auto it = l_.getitems_.find(n_.name);
  if (it != l_.getitems_.end()) {
    if (k >= it->second.size() || it->second[k].empty()) return nullptr;
    for (const auto& m : l_.g_.nodes)
      if (m.name == it->second[k]) return m.type ? &*m.type : nullptr;
    return nullptr;
  }
  return k == 0 && n_.type ? &*n_.type : nullptr;
}

namespace {
Value& slot(Lowering& l, const Node& n, std::size_t k, bool tuple) {
  if (!tuple) return l.env_[n.name];
  auto& p = l.parts_[n.name];
  if (p.size() <= k) p.resize(k + 1);
  return p[k];
}
}  // namespace

void Ctx::result(std::size_t k, TensorType t) {
  if (const TensorType* a = annotated(k)) {
    if (a->shape != t.shape)
      fail("the annotation " + type_text(*a) + (k ? " of element " + std::to_string(k) : "") + " contradicts " + n_.target + ", which gives shape " + shape_text(t.shape) +
           " here");
    t.dtype = a->dtype;
  }
  bool tuple = l_.getitems_.count(n_.name) || !n_.tuple.empty();
  Value& v = slot(l_, n_, k, tuple);
  v.ir = out(k);
  v.type = std::move(t);
  if (tuple) l_.env_[n_.name].is_tuple = true;
}

void Ctx::alias(std::size_t k, const Value& src) {
  bool tuple = l_.getitems_.count(n_.name) || !n_.tuple.empty();
  if (const TensorType* a = annotated(k); a && !src.ir.empty() && a->shape != src.type.shape)
    fail("the annotation " + type_text(*a) + " contradicts " + n_.target + ", which gives shape " + shape_text(src.type.shape) + " here");
  Value v = src;
  v.handle.clear();
  if (!src.handle.empty()) v.handle = src.handle;
  if (const TensorType* a = annotated(k); a && !src.ir.empty()) v.type.dtype = a->dtype;
  slot(l_, n_, k, tuple) = std::move(v);
  if (tuple) l_.env_[n_.name].is_tuple = true;
}

void Ctx::set_scalar(std::size_t k, double x) { slot(l_, n_, k, l_.parts_.count(n_.name) > 0).scalar = x; }
void Ctx::set_handle(std::size_t k, const std::string& h) { slot(l_, n_, k, l_.parts_.count(n_.name) > 0).handle = h; }
void Ctx::set_arange0(std::size_t k) { slot(l_, n_, k, l_.parts_.count(n_.name) > 0).arange0 = true; }
void Ctx::set_int(std::size_t k, std::int64_t x) {
  Value& v = slot(l_, n_, k, false);
  v.int_value = x;
}
void Ctx::set_bases(std::vector<std::string> b) {
  l_.env_[n_.name].is_tuple = true;
  l_.env_[n_.name].bases = std::move(b);
}

std::string Ctx::tmp(std::string_view hint) { return l_.ir_name(n_.name) + "~" + std::string(hint) + std::to_string(l_.tmp_++); }

void Ctx::emit(std::string op, std::vector<std::string> in, std::vector<std::string> out, std::vector<std::pair<std::string, std::string>> attrs) {
  l_.ops_.push_back({std::move(op), std::move(in), std::move(out), std::move(attrs), l_.at_});
}

std::string Ctx::full(const std::vector<std::int64_t>& shape, double value, const std::string& dtype) {
  std::string o = tmp("c");
  if (!std::isfinite(value)) fail("the constant " + num_text(value) + " is not finite; the value check models finite values only");
  emit("Full", {}, {o}, {{"shape", shape_text(shape)}, {"value", num_text(value)}, {"dtype", dtype}});
  return o;
}

std::string Ctx::scalar_tensor(std::string_view p, const std::string& dtype) {
  const PyVal& x = v(p);
  if (x.k == PyVal::K::Name) return t(p);
  if (!x.is_num()) fail_at(x, "argument '" + std::string(p) + "' of " + n_.target + " must be a number or a tensor");
  if (x.expr.empty() && (x.k != PyVal::K::Int || x.i < 0)) return full({}, x.num(), dtype);
  // an integer (rank-varying, or one that may be a size): one element of an Arange that starts there, as a 0-d
  // tensor, so the value is a size attribute (a + b*axis_index(tp), a named size)
  std::string a = tmp("r"), o = tmp("c");
  std::string e = x.expr.empty() ? std::to_string(x.i) : x.expr;
  emit("Arange", {}, {a}, {{"start", e}, {"end", e + " + 1"}, {"dtype", "i64"}});
  emit("Reshape", {a}, {o}, {{"shape", "[]"}});
  return o;
}

std::string Ctx::axis_of_group(const PyVal& group) const {
  std::string g = group.k == PyVal::K::Str ? group.s : group.k == PyVal::K::Int ? std::to_string(group.i) : "";
  if (g.empty()) fail_at(group, "a process group must be named by a string");
  if (g.rfind("axis:", 0) == 0) return g.substr(5);  // canonicalized by the importer
  auto it = l_.o_.groups.find(g);
  if (it != l_.o_.groups.end()) return it->second;
  if (!l_.o_.default_axis.empty()) return l_.o_.default_axis;
  fail_at(group, "process group '" + g + "' is not a mesh axis: name it in the relation file, e.g. `groups: {'" + g + "': tp}`");
}

bool Ctx::local_view() const { return l_.o_.local_view; }
const CustomOps* Ctx::custom() const { return l_.o_.custom; }

void Ctx::fail(const std::string& msg) const { throw ImportError(l_.g_.file, n_.loc, msg); }
void Ctx::rank_varying(const std::string& msg) const { throw RankVarying(l_.g_.file, n_.loc, msg); }
void Ctx::fail_at(const PyVal& at, const std::string& msg) const { throw ImportError(l_.g_.file, at.loc.line ? at.loc : n_.loc, msg); }

}  // namespace spmd::frontends
