// ir/loader_ops.cpp - ops, attributes, schedules and per-rank programs.
#include "ir/loader_impl.h"

#include <cctype>
#include <cmath>
#include <functional>
#include <optional>

namespace spmd::load_detail {

namespace {

// A scale constant written as an expression of sizes (`scalar: 1/dp`, `scale: 1/(dp*cp)`, `0.5*H`,
// `1/sqrt(D)`, MLA's `(0.1*log(40) + 1)*(0.1*log(40) + 1)/sqrt(D)`): numbers, size names and mesh axis names
// (their sizes) with + - * / ( ), sqrt( ) and log( ) (natural).
// Evaluated in double precision; every name must have a concrete value. Throws ExprError(offset, why).
class ScaleParser {
 public:
  ScaleParser(std::string_view s, const std::function<std::optional<double>(std::string_view)>& lookup) : s_(s), lookup_(lookup) {}
  double run() {
    double v = sum();
    skip();
    if (i_ != s_.size()) throw ExprError(i_, "unexpected '" + std::string(1, s_[i_]) + "'");
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  double sum() {
    double v = product();
    for (;;) {
      if (eat('+')) v += product();
      else if (eat('-')) v -= product();
      else return v;
    }
  }
  double product() {
    double v = factor();
    for (;;) {
      if (eat('*')) v *= factor();
      else if (eat('/')) {
        std::size_t at = i_;
        double d = factor();
        if (d == 0) throw ExprError(at, "division by zero");
        v /= d;
      } else return v;
    }
  }
  double factor() {
    if (++depth_ > 64) throw ExprError(i_, "nested too deeply");
    double v = atom();
    --depth_;
    return v;
  }
  double atom() {
    skip();
    if (i_ >= s_.size()) throw ExprError(i_, "expected a number, a size or '('");
    if (eat('-')) return -factor();
    if (eat('(')) {
      double v = sum();
      if (!eat(')')) throw ExprError(i_, "expected ')'");
      return v;
    }
    char c = s_[i_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      std::string text(s_.substr(i_));
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str()) throw ExprError(i_, "bad number");
      i_ += static_cast<std::size_t>(end - text.c_str());
      return v;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t at = i_;
      while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_')) ++i_;
      std::string_view name = s_.substr(at, i_ - at);
      if (name == "sqrt" || name == "log") {
        if (!eat('(')) throw ExprError(i_, "expected '(' after " + std::string(name));
        double v = sum();
        if (!eat(')')) throw ExprError(i_, "expected ')'");
        if (name == "sqrt" && v < 0) throw ExprError(at, "sqrt of a negative value");
        if (name == "log" && !(v > 0)) throw ExprError(at, "log of a value that is not positive");
        return name == "sqrt" ? std::sqrt(v) : std::log(v);
      }
      auto v = lookup_(name);
      if (!v) throw ExprError(at, "unknown size '" + std::string(name) + "'");
      return *v;
    }
    throw ExprError(i_, "unexpected '" + std::string(1, c) + "'");
  }
  std::string_view s_;
  const std::function<std::optional<double>(std::string_view)>& lookup_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

double Loader::scale_expr(N v, const std::string& what) {
  const std::string& text = v.Scalar();
  std::vector<std::string> known;
  std::string symbolic;
  auto lookup = [&](std::string_view name) -> std::optional<double> {
    for (const auto& m : p_.mesh)
      if (m.name == name) {
        if (!p_.exprs.is_const(m.size)) return symbolic = std::string(name), std::nullopt;
        return static_cast<double>(p_.exprs.value(m.size));
      }
    auto it = p_.sizes.find(std::string(name));
    if (it == p_.sizes.end()) return std::nullopt;
    // a generalized size (shape reduction) is a value here: its declared one
    auto v = p_.exprs.single_value(it->second, p_.vars);
    if (!v) return symbolic = std::string(name), std::nullopt;
    return static_cast<double>(*v);
  };
  try {
    if (text.size() > 400) throw ExprError(0, "too long (the limit is 400 characters)");
    double d = ScaleParser(text, lookup).run();
    if (!std::isfinite(d)) throw ExprError(0, "the value is not finite");
    return d;
  } catch (const ExprError& e) {
    if (!symbolic.empty())
      fail(v, what + " uses '" + symbolic + "', a symbolic size; a scale expression needs concrete sizes (write the number, or give " + symbolic +
                  " a value)");
    for (const auto& [k, x] : p_.sizes) known.push_back(k);
    for (const auto& m : p_.mesh) known.push_back(m.name);
    std::sort(known.begin(), known.end());
    std::string msg = e.what();
    if (msg.rfind("unknown size '", 0) == 0) {
      std::string name = msg.substr(14, msg.size() - 15);
      msg += suggestion(name, known) + " (sizes and mesh axes: " + join(known) + ")";
    }
    fail(v, what + " must be a number or a scale expression over sizes such as 1/dp, got '" + (text.size() > 60 ? text.substr(0, 60) + "..." : text) +
                "': " + msg);
  }
}

void Loader::load_names_into(N n, const char* key, const std::string& where, std::vector<NameId>& out) {
  out.clear();
  if (!n.IsDefined() || n.IsNull()) return;
  if (n.IsScalar()) {
    if (n.sv().empty()) fail(n, key + where + " must name a tensor");
    out.push_back(name_id(n.sv(), n));
    return;
  }
  if (!n.IsSequence()) fail(n, key + where + " must be a list of tensor names");
  for (const auto& x : n) {
    if (!x.IsScalar() || x.sv().empty()) fail(x, key + where + " must hold tensor names, got " + kind_of(x));
    out.push_back(name_id(x.sv(), x));
  }
}

const std::string& Loader::info_name(OpKind k) {
  auto& s = labels_[static_cast<std::uint32_t>(k) << 8];
  if (s.empty()) s = std::string(op_info(k).name);
  return s;
}

const std::string& Loader::attr_what(OpKind k, const AttrSpec& spec, const std::string& where) {
  auto& s = labels_[static_cast<std::uint32_t>(k) << 8 | static_cast<std::uint32_t>(&spec - op_info(k).attrs.data() + 1)];
  if (s.empty()) s = "attribute `" + spec.name + "` of " + where;
  return s;
}

std::vector<NameId> Loader::load_names(N n, const std::string& what, bool allow_scalar) {
  std::vector<NameId> out;
  if (!n.IsDefined() || n.IsNull()) return out;
  if (n.IsScalar() && allow_scalar) {
    if (n.sv().empty()) fail(n, what + " must name a tensor");
    out.push_back(name_id(n.sv(), n));
    return out;
  }
  if (!n.IsSequence()) fail(n, what + " must be a list of tensor names");
  for (const auto& x : n) {
    if (!x.IsScalar() || x.sv().empty()) fail(x, what + " must hold tensor names, got " + kind_of(x));
    out.push_back(name_id(x.sv(), x));
  }
  return out;
}

void Loader::load_ops(N n) {
  if (n.IsNull()) return;
  if (!n.IsSequence()) fail(n, "`ops` must be a list of ops like {op: MatMul, in: [x, w], out: y}");
  if (n.size() > kMaxOps) fail(n, "the program has " + std::to_string(n.size()) + " ops; the limit is 10,000,000");
  if (target_->empty()) target_->reserve(n.size());
  for (const auto& item : n) load_item(item);
}

void Loader::load_item(N item) {
  if (target_->size() >= kMaxOps) fail(item, "the program has more than 10,000,000 ops (the limit)");
  if (item.IsMap() && !item.key_node("op").IsDefined() && (item.key_node("use").IsDefined() || item.key_node("repeat").IsDefined()))
    return load_instance(item);
  if (!scopes_.empty() && ++expanded_ > kMaxExpansion)
    fail(item, "modules expand to more than " + std::to_string(kMaxExpansion) + " ops and instances (the limit)");
  load_op(item);
}

// schedule: {kind: 1F1B, axis: pp, microbatches: 8, virtual_stages: 2} or {csv: file.csv, axis: pp}
void Loader::load_schedule(N n) {
  if (!n.IsMap()) fail(n, "`schedule` must be a mapping, e.g. {kind: 1F1B, axis: pp, microbatches: 8} or {csv: schedule.csv}");
  ScheduleSpec& sp = p_.schedule;
  sp.present = true;
  sp.loc = n.loc();
  for_each_key(n, {"kind", "axis", "microbatches", "virtual_stages", "csv", "stages", "batch", "merge", "steps", "scale_grads"}, "`schedule`", [](N, N) {});
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
    sp.kind_loc = kind.loc();
  } else {
    if (!csv.IsScalar() || csv.Scalar().empty()) fail(csv, "`csv` must be a file name (relative to this file)");
    sp.csv = csv.Scalar();
    sp.csv_loc = csv.loc();
    for (const char* k : {"microbatches", "virtual_stages"})
      if (n[k].IsDefined()) fail(n[k], std::string("`") + k + "` comes from the CSV file; remove it");
  }
  load_stages(n);
}

void Loader::load_programs(N n) {
  if (!n.IsSequence() || n.size() == 0) fail(n, "`programs` must be a non-empty list of {ranks: {axis: coordinate}, ops: [...]}");
  for (const auto& item : n) load_program_item(item);
}

void Loader::load_program_item(N item) {
  p_.per_rank = true;
  {
    if (!item.IsMap()) fail(item, "a program must be a mapping {ranks: {pp: 0}, ops: [...]}");
    for_each_key(item, {"ranks", "ops"}, "a program", [](N, N) {});
    RankProgram rp;
    rp.loc = item.loc();
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
std::vector<std::pair<int, std::int64_t>> Loader::load_coords(N v, const std::string& what) {
  if (!v.IsMap()) fail(v, what + " must be a mapping of mesh coordinates, e.g. {pp: 1}");
  std::vector<std::pair<int, std::int64_t>> c;
  for_each_key(v, {}, what, [&](N k, N x) {
    int axis = axis_index(k, what);
    std::int64_t hi = (1 << 20) - 1;
    ExprId size = p_.mesh[static_cast<std::size_t>(axis)].size;
    if (p_.exprs.is_const(size)) hi = p_.exprs.value(size) - 1;
    c.emplace_back(axis, attr_int(x, "coordinate of axis " + k.Scalar() + " in " + what, 0, hi));
  });
  return c;
}

void Loader::load_op(N item) {
  if (!item.IsMap()) fail(item, "an op must be a mapping like {op: MatMul, in: [x, w], out: y}, got " + kind_of(item));
  auto opn = item["op"];
  if (!opn.IsDefined()) fail(item, "an op needs `op: <name>`");
  if (!opn.IsScalar()) fail(opn, "`op` must be an op name");
  auto kind = op_by_name(opn.sv());
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
  op.loc = item.loc();
  const std::string& where = info_name(*kind);
  std::uint64_t given = 0;  // bit i: attribute i of the op table's list
  for_each_key(item, {}, where, [&](N k, N v) {
    std::string_view kv = k.sv();
    if (kv == "op" || kv == "in" || kv == "out") return;
    const std::string key(kv);
    const AttrSpec* spec = info.find_attr(key);
    if (!spec) {
      std::vector<std::string> allowed = {"op", "in", "out"};
      for (const auto& a : info.attrs) allowed.push_back(a.name);
      std::vector<std::string> attrs;
      for (const auto& a : info.attrs)
        if (a.name != "at") attrs.push_back(a.name);  // (every op's source origin, written by the importer)
      fail(k, "unknown attribute '" + key + "' for " + where + suggestion(key, allowed) + " (" + where + " takes: " +
                  join(attrs) + ")");
    }
    given |= std::uint64_t{1} << (spec - info.attrs.data());
    if (v.IsNull()) fail(k, "attribute `" + key + "` of " + where + " has no value (" + attr_type_name(*spec) + ")");
    load_attr(op, *spec, v, where);
  });
  for (const auto& a : info.attrs)
    if (a.required && !(given >> (&a - info.attrs.data()) & 1))
      fail(item, where + " needs attribute `" + a.name + "` (" + attr_type_name(a) + ")");
  if (op.kind == OpKind::MoEDispatch && op.attrs.dropless && op.attrs.has_number)
    fail(item["capacity_factor"], where + " is `dropless: true`, so it drops no token and takes no `capacity_factor`; remove one of them");
  if (op.kind == OpKind::AllToAll && op.attrs.shape != kNoIndex) {  // one split size per rank of the group, when its size is known
    std::int64_t group = 1;
    bool known = op.attrs.bad_axis == kNoIndex;
    for (std::size_t i = 0; i < p_.mesh.size() && known; ++i)
      if (op.attrs.axes & (1u << i)) {
        known = p_.exprs.is_const(p_.mesh[i].size);
        if (known) group *= p_.exprs.value(p_.mesh[i].size);
      }
    std::size_t n = p_.shapes[op.attrs.shape].size();
    if (known && static_cast<std::int64_t>(n) != group)
      fail(item["split_sizes"], where + " lists " + std::to_string(n) + " split size" + (n == 1 ? "" : "s") + ", but its group has " + std::to_string(group) +
                                    " ranks: give one per rank");
  }
  std::vector<NameId>& ins = ins_;
  std::vector<NameId>& outs = outs_;
  load_names_into(item["in"], "`in` of ", where, ins);
  load_names_into(item["out"], "`out` of ", where, outs);
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
  if (scopes_.empty() && !instance_at_.empty())
    for (NameId o : outs) claim_program_name(o);
  p_.add_op(*target_, op, ins, outs);
}

// AllToAll's `split_sizes: [4, 4, 4, 0]`: one size expression per rank of the group (0 allowed), in Program::shapes.
void Loader::load_split_sizes(Op& op, N v, const std::string& what) {
  if (!v.IsSequence() || v.size() == 0) fail(v, what + " must be a non-empty list of sizes, one per rank of the group, e.g. [3, 3, 3, 3]");
  if (v.size() > 4096) fail(v, what + " lists " + std::to_string(v.size()) + " sizes; the limit is 4096");
  std::vector<ExprId> sizes;
  for (const auto& x : v) {
    ExprId e = parse_expr(x, what, true);
    if (p_.exprs.is_const(e) && p_.exprs.value(e) < 0) fail(x, what + " must not be negative, got " + std::to_string(p_.exprs.value(e)));
    if (p_.exprs.is_const(e) && p_.exprs.value(e) > kMaxSize) fail(x, what + " is too large (the limit is 2^40)");
    sizes.push_back(e);
  }
  op.attrs.shape = static_cast<std::uint32_t>(p_.shapes.size());
  p_.shapes.push_back(std::move(sizes));
}

std::int64_t Loader::attr_int(N v, const std::string& what, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (!v.IsScalar() || !parse_int(v.Scalar(), x)) fail(v, what + " must be an integer, got " + kind_of(v));
  if (x < lo || x > hi) fail(v, what + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + std::to_string(x));
  return x;
}

void Loader::load_attr(Op& op, const AttrSpec& spec, N v, const std::string& where) {
  const std::string& what = attr_what(op.kind, spec, where);
  OpAttrs& a = op.attrs;
  const std::string& n = spec.name;
  switch (spec.type) {
    case AttrType::Axes: {
      std::vector<N> items;
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
            p_.bad_axes.push_back({x.Scalar(), x.loc()});
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
      else if (n == "step") a.k = static_cast<std::int32_t>(attr_int(v, what, op.kind == OpKind::AdamWUpdate ? 1 : 0, 1 << 20));  // AdamW counts from 1
      else if (n == "margin") a.k = static_cast<std::int32_t>(attr_int(v, what, 0, 64));  // FP8Scale: scale / 2^margin
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
      if (s.empty()) fail(v, what + " must be a finite number, got " + kind_of(v));
      if (s.find("axis_index") != std::string::npos) {  // a per-rank scalar (local view): a size expression
        if (n != "scalar")
          fail(v, what + " cannot use axis_index: only `scalar` and the size attributes of ops may depend on the rank's coordinate");
        if (!p_.local_view)
          fail(v, what + " uses axis_index, which needs a local-view program: add `view: local` at the top level (in the global view a scalar is the "
                         "same on every rank)");
        ExprId e = parse_expr(v, what, true);
        a.number = 0;
        a.has_number = true;
        a.scalar_expr = true;
        a.sizes = static_cast<std::uint32_t>(p_.shapes.size());
        p_.shapes.push_back({e});
        return;
      }
      bool expr = s.find_first_of("/*()+") != std::string::npos || std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_';
      if (end != s.c_str() + s.size() && expr) d = scale_expr(v, what);  // an expression of sizes: 1/dp, 1/(dp*cp)
      else if (end != s.c_str() + s.size()) fail(v, what + " must be a finite number, got " + kind_of(v));
      if (!std::isfinite(d)) fail(v, what + " must be a finite number, got " + kind_of(v));
      if (n == "p" && (d < 0 || d >= 1)) fail(v, what + " must be in [0, 1)");
      if (n == "scalar" && d == 0 && op.kind == OpKind::Div) fail(v, what + " must not be 0 (Div divides by it)");
      if (n == "capacity_factor" && (d <= 0 || d > 1e6)) fail(v, what + " must be in (0, 1e6], got " + s);
      if (const char* why = number_range_error(op.kind, n, d)) fail(v, what + " " + why + ", got " + s);
      if (Program::several_numbers(op.kind)) return p_.set_number_attr(op, n, d);  // the optimizer ops
      a.number = d;
      a.has_number = true;
      return;
    }
    case AttrType::Bool: {
      bool b = load_bool(v, what);
      if (n == "keepdim") a.keepdim = b;
      else if (n == "causal") a.causal = b;
      else if (n == "vocab_parallel") a.vocab_parallel = b;
      else if (n == "dropless") a.dropless = b;
      else if (n == "inverse") a.inverse = b;
      else if (n == "uneven") a.uneven = b;
      else if (n == "reverse") a.reverse = b;
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
      if ((op.kind == OpKind::FP8Quantize || op.kind == OpKind::FP8Scale) && a.dtype != DType::FP8E4M3 && a.dtype != DType::FP8E5M2)
        fail(v, what + " must be an fp8 dtype (fp8_e4m3 or fp8_e5m2), got " + v.Scalar());
      return;
    case AttrType::Shape:
      if (n == "split_sizes") return load_split_sizes(op, v, what);
      a.shape = static_cast<std::uint32_t>(p_.shapes.size());
      p_.shapes.push_back(load_shape(v, "`" + n + "` of " + where, nullptr, true));
      if (n == "buffer" && p_.shapes.back().size() != 2) fail(v, what + " must list two sizes, [experts, capacity], got " + std::to_string(p_.shapes.back().size()));
      return;
    case AttrType::Name:
      if (!v.IsScalar() || v.Scalar().empty()) fail(v, what + " must be a name");
      if (n == "at") {
        if (v.Scalar().size() > 4096) fail(v, what + " is longer than 4096 characters");
        a.at = static_cast<std::uint32_t>(p_.origins.size());
        p_.origins.push_back(v.Scalar());
        return;
      }
      (n == "handle"                ? a.handle
       : n == "group"               ? a.group
       : n == "matches"             ? a.matches
       : n == "label"               ? a.label
       : n == "for" || n == "event" ? a.sync
                                    : a.stream) = n == "stream" || n == "label" || n == "for" ? p_.intern(v.Scalar()) : name_id(v.sv(), v);
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
    case AttrType::Size: {
      ExprId e = parse_expr(v, what, true);
      if (p_.exprs.is_const(e) && p_.exprs.value(e) < 0) fail(v, what + " must not be negative, got " + std::to_string(p_.exprs.value(e)));
      if (p_.exprs.is_const(e) && p_.exprs.value(e) > kMaxSize) fail(v, what + " is too large (the limit is 2^40)");
      if (p_.exprs.is_const(e))
        if (const char* why = size_range_error(op.kind, n, p_.exprs.value(e))) fail(v, what + " " + why + ", got " + std::to_string(p_.exprs.value(e)));
      p_.set_size_attr(op, n, e);
      return;
    }
    case AttrType::Enum: {
      if (!v.IsScalar() || std::find(spec.choices.begin(), spec.choices.end(), v.Scalar()) == spec.choices.end())
        fail(v, what + " must be one of " + attr_type_name(spec) + ", got " + kind_of(v) +
                    (v.IsScalar() ? suggestion(v.Scalar(), spec.choices) : ""));
      const std::string& s = v.Scalar();
      if (n == "dst") a.dst_invariant = s == "I";
      else if (n == "rng") a.rng_per_rank = s == "per_rank";
      else if (n == "reduction") a.reduction = s == "sum" ? Reduction::Sum : s == "none" ? Reduction::None : Reduction::Mean;
      else if (n == "layout") a.layout = s == "bshd" ? AttnLayout::BSHD : s == "sbhd" ? AttnLayout::SBHD : AttnLayout::BHSD;
      else if (n == "order") a.order = s == "zigzag" ? 1 : 0;
      else a.choice = static_cast<std::uint8_t>(std::find(spec.choices.begin(), spec.choices.end(), s) - spec.choices.begin());
      return;
    }
  }
}

}  // namespace spmd::load_detail
