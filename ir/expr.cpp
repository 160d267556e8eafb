// ir/expr.cpp - hash-consed size expressions, folding and parsing.
#include "ir/expr.h"

#include <algorithm>
#include <cctype>

namespace spmd {

namespace {

bool checked_add(std::int64_t a, std::int64_t b, std::int64_t& r) {
  return !__builtin_add_overflow(a, b, &r) && r <= kMaxValue && r >= -kMaxValue;
}
bool checked_sub(std::int64_t a, std::int64_t b, std::int64_t& r) {
  return !__builtin_sub_overflow(a, b, &r) && r <= kMaxValue && r >= -kMaxValue;
}
bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& r) {
  return !__builtin_mul_overflow(a, b, &r) && r <= kMaxValue && r >= -kMaxValue;
}

std::uint64_t hash_node(const ENode& n) {
  std::uint64_t h = static_cast<std::uint64_t>(n.op) * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(n.a)) + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(n.b)) + 0x94D049BB133111EBull) * 0x94D049BB133111EBull;
  h ^= static_cast<std::uint64_t>(n.c) * 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 31);
}

}  // namespace

ExprId ExprPool::intern(ENode n) {
  if (n.op != EOp::Const && n.op != EOp::Var && n.op != EOp::AxisIndex && n.op != EOp::AxisSize) {
    const ENode& x = nodes_[static_cast<std::size_t>(n.a)];
    const ENode& y = nodes_[static_cast<std::size_t>(n.b)];
    n.depth = 1 + std::max(x.depth, y.depth);
    n.terms = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{x.terms} + y.terms, 1u << 30));
    if (n.depth > kMaxExprDepth || n.terms > kMaxExprTerms)
      throw ExprError(0, "size expression is too large (more than " + std::to_string(kMaxExprTerms) + " terms or " +
                             std::to_string(kMaxExprDepth) + " levels once named sizes are written out)");
  }
  std::uint64_t h = hash_node(n);
  auto& bucket = index_[h];
  for (ExprId id : bucket) {
    const ENode& m = nodes_[static_cast<std::size_t>(id)];
    if (m.op == n.op && m.a == n.a && m.b == n.b && m.c == n.c) return id;
  }
  auto id = static_cast<ExprId>(nodes_.size());
  nodes_.push_back(n);
  bucket.push_back(id);
  return id;
}

ExprId ExprPool::constant(std::int64_t v) { return intern({EOp::Const, -1, -1, v}); }
ExprId ExprPool::var(int index) { return intern({EOp::Var, index, -1, 0}); }

ExprId ExprPool::axis_index(int axis, const std::string& name) {
  if (axis_names_.size() <= static_cast<std::size_t>(axis)) axis_names_.resize(static_cast<std::size_t>(axis) + 1);
  axis_names_[static_cast<std::size_t>(axis)] = name;
  return intern({EOp::AxisIndex, axis, -1, 0});
}

ExprId ExprPool::axis_size(int axis, const std::string& name) {
  if (axis_names_.size() <= static_cast<std::size_t>(axis)) axis_names_.resize(static_cast<std::size_t>(axis) + 1);
  axis_names_[static_cast<std::size_t>(axis)] = name;
  return intern({EOp::AxisSize, axis, -1, 0});
}

bool ExprPool::has_axis(ExprId id) const {
  const ENode& n = node(id);
  switch (n.op) {
    case EOp::Const:
    case EOp::Var: return false;
    case EOp::AxisIndex:
    case EOp::AxisSize: return true;
    case EOp::Add:
    case EOp::Sub:
    case EOp::Mul:
    case EOp::Div: return has_axis(n.a) || has_axis(n.b);
  }
  return false;
}

// A sum of sums and differences as its terms with integer coefficients (c * t counts as t with c) and a constant;
// false on overflow.
bool ExprPool::linear(ExprId e, std::int64_t sign, std::vector<std::pair<ExprId, std::int64_t>>& terms, std::int64_t& c) const {
  const ENode& n = node(e);
  switch (n.op) {
    case EOp::Const: {
      std::int64_t v;
      return checked_mul(sign, n.c, v) && checked_add(c, v, c);
    }
    case EOp::Add: return linear(n.a, sign, terms, c) && linear(n.b, sign, terms, c);
    case EOp::Sub: return linear(n.a, sign, terms, c) && linear(n.b, -sign, terms, c);
    case EOp::Mul:
      if (is_const(n.a) || is_const(n.b)) {
        std::int64_t k;
        if (!checked_mul(sign, is_const(n.a) ? value(n.a) : value(n.b), k)) return false;
        terms.emplace_back(is_const(n.a) ? n.b : n.a, k);
        return true;
      }
      break;
    default: break;
  }
  terms.emplace_back(e, sign);
  return true;
}

// a + sign * b when either is a sum or a difference: like terms combined ((a + b) - a is b), written with the
// positive terms first in id order, then the negative ones, then the constant.
ExprId ExprPool::combine(ExprId a, ExprId b, std::int64_t sign) {
  std::vector<std::pair<ExprId, std::int64_t>> terms;
  std::int64_t c = 0;
  if (!linear(a, 1, terms, c) || !linear(b, sign, terms, c)) throw ExprError(0, "size expression overflows");
  std::sort(terms.begin(), terms.end());
  std::vector<std::pair<ExprId, std::int64_t>> merged;
  for (const auto& [t, k] : terms) {
    if (!merged.empty() && merged.back().first == t) {
      if (!checked_add(merged.back().second, k, merged.back().second)) throw ExprError(0, "size expression overflows");
    } else {
      merged.emplace_back(t, k);
    }
  }
  ExprId acc = -1;
  auto plus = [&](ExprId t) { acc = acc < 0 ? t : intern({EOp::Add, std::min(acc, t), std::max(acc, t), 0}); };
  for (const auto& [t, k] : merged)
    if (k > 0) plus(k == 1 ? t : mul(constant(k), t));
  for (const auto& [t, k] : merged)
    if (k < 0) {
      ExprId m = k == -1 ? t : mul(constant(-k), t);
      acc = acc < 0 ? intern({EOp::Sub, constant(0), m, 0}) : intern({EOp::Sub, acc, m, 0});
    }
  if (acc < 0) return constant(c);
  if (c > 0) return intern({EOp::Add, std::min(acc, constant(c)), std::max(acc, constant(c)), 0});
  if (c < 0) return intern({EOp::Sub, acc, constant(-c), 0});
  return acc;
}

ExprId ExprPool::add(ExprId a, ExprId b) {
  if (is_const(a) && is_const(b)) {
    std::int64_t r;
    if (!checked_add(value(a), value(b), r)) throw ExprError(0, "size expression overflows");
    return constant(r);
  }
  if (is_const(a) && value(a) == 0) return b;
  if (is_const(b) && value(b) == 0) return a;
  if (node(a).op == EOp::Sub || node(b).op == EOp::Sub) return combine(a, b, 1);
  if (a > b) std::swap(a, b);
  return intern({EOp::Add, a, b, 0});
}

ExprId ExprPool::sub(ExprId a, ExprId b) {
  if (is_const(a) && is_const(b)) {
    std::int64_t r;
    if (!checked_sub(value(a), value(b), r)) throw ExprError(0, "size expression overflows");
    return constant(r);
  }
  if (is_const(b) && value(b) == 0) return a;
  if (a == b) return constant(0);
  if (node(a).op == EOp::Add || node(a).op == EOp::Sub || node(b).op == EOp::Add || node(b).op == EOp::Sub) return combine(a, b, -1);
  return intern({EOp::Sub, a, b, 0});
}

ExprId ExprPool::mul(ExprId a, ExprId b) {
  if ((is_const(a) && value(a) == 0) || (is_const(b) && value(b) == 0)) return constant(0);
  if (is_const(a) && is_const(b)) {
    std::int64_t r;
    if (!checked_mul(value(a), value(b), r)) throw ExprError(0, "size expression overflows");
    return constant(r);
  }
  if (is_const(a) && value(a) == 1) return b;
  if (is_const(b) && value(b) == 1) return a;
  // Operand order is canonical so that printing and loading again is a fixed point: by id, except that a factor with
  // a mesh axis (axis_index, an axis size) goes after constants and size variables, ordered by kind and axis (its
  // id depends on where the parser met it first).
  auto axis_rank = [&](ExprId e) {
    EOp o = node(e).op;
    return o == EOp::AxisSize ? 1 + 2 * node(e).a : o == EOp::AxisIndex ? 2 + 2 * node(e).a : 0;
  };
  int ra = axis_rank(a), rb = axis_rank(b);
  bool leaf_b = is_const(b) || node(b).op == EOp::Var;
  if (ra || rb) {
    if ((ra && rb && ra > rb) || (ra && !rb && leaf_b)) std::swap(a, b);
  } else if (a > b) {
    std::swap(a, b);
  }
  return intern({EOp::Mul, a, b, 0});
}

ExprId ExprPool::div(ExprId a, ExprId b) {
  // Inexact constant divisions are kept as nodes so that an exactness obligation reports them.
  if (is_const(a) && is_const(b) && value(b) != 0 && value(a) % value(b) == 0) return constant(value(a) / value(b));
  if (is_const(b) && value(b) == 1) return a;
  return intern({EOp::Div, a, b, 0});
}

std::optional<std::int64_t> ExprPool::eval(ExprId id, const std::vector<std::int64_t>& vars, const AxisEnv& env) const {
  const ENode& n = node(id);
  switch (n.op) {
    case EOp::Const: return n.c;
    case EOp::AxisIndex:
    case EOp::AxisSize: {
      const auto* v = n.op == EOp::AxisIndex ? env.coords : env.sizes;
      if (!v) throw AxisExprError("a size expression uses " + std::string(n.op == EOp::AxisIndex ? "axis_index" : "the size") + " of a mesh axis, which has no value outside a rank of a local-view run");
      if (static_cast<std::size_t>(n.a) >= v->size()) return std::nullopt;
      return (*v)[static_cast<std::size_t>(n.a)];
    }
    case EOp::Var:
      if (static_cast<std::size_t>(n.a) >= vars.size()) return std::nullopt;
      return vars[static_cast<std::size_t>(n.a)];
    case EOp::Add:
    case EOp::Sub:
    case EOp::Mul:
    case EOp::Div: {
      auto x = eval(n.a, vars, env), y = eval(n.b, vars, env);
      if (!x || !y) return std::nullopt;
      std::int64_t r = 0;
      if (n.op == EOp::Add) return checked_add(*x, *y, r) ? std::optional(r) : std::nullopt;
      if (n.op == EOp::Sub) return checked_sub(*x, *y, r) ? std::optional(r) : std::nullopt;
      if (n.op == EOp::Mul) return checked_mul(*x, *y, r) ? std::optional(r) : std::nullopt;
      if (*y == 0 || *x % *y != 0) return std::nullopt;
      return *x / *y;
    }
  }
  return std::nullopt;
}

std::optional<std::int64_t> ExprPool::single_value(ExprId id, const std::vector<SizeVar>& vars) const {
  if (is_const(id)) return value(id);
  if (has_axis(id)) return std::nullopt;
  std::vector<int> used;
  collect_vars(id, used);
  std::vector<std::int64_t> vals(vars.size(), 0);
  for (int v : used) {
    if (static_cast<std::size_t>(v) >= vars.size() || vars[static_cast<std::size_t>(v)].in.size() != 1) return std::nullopt;
    vals[static_cast<std::size_t>(v)] = vars[static_cast<std::size_t>(v)].in[0];
  }
  return eval(id, vals);
}

void ExprPool::collect_vars(ExprId id, std::vector<int>& out) const {
  const ENode& n = node(id);
  if (n.op == EOp::AxisIndex || n.op == EOp::AxisSize) throw AxisExprError("collect_vars: axis_index / an axis size is not a size variable");
  if (n.op == EOp::Var) {
    if (std::find(out.begin(), out.end(), n.a) == out.end()) out.push_back(n.a);
  } else if (n.op != EOp::Const) {
    collect_vars(n.a, out);
    collect_vars(n.b, out);
  }
}

void ExprPool::visit(ExprId id, const std::function<void(ExprId)>& fn) const {
  const ENode& n = node(id);
  if (n.op == EOp::Const || n.op == EOp::Var || n.op == EOp::AxisIndex || n.op == EOp::AxisSize) return;
  visit(n.a, fn);
  visit(n.b, fn);
  fn(id);
}

std::string ExprPool::str(ExprId id, const std::vector<SizeVar>& vars) const {
  const ENode& n = node(id);
  auto wrap = [&](ExprId sub, bool tight) {
    EOp o = node(sub).op;
    std::string s = str(sub, vars);
    if (tight && (o == EOp::Add || o == EOp::Sub)) return "(" + s + ")";
    return s;
  };
  switch (n.op) {
    case EOp::Const: return std::to_string(n.c);
    case EOp::Var:
      return static_cast<std::size_t>(n.a) < vars.size() ? vars[static_cast<std::size_t>(n.a)].name : "?";
    case EOp::AxisIndex:
    case EOp::AxisSize: {
      std::string name = static_cast<std::size_t>(n.a) < axis_names_.size() ? axis_names_[static_cast<std::size_t>(n.a)] : "?";
      return n.op == EOp::AxisIndex ? "axis_index(" + name + ")" : name;
    }
    case EOp::Add: return str(n.a, vars) + " + " + str(n.b, vars);
    case EOp::Sub: return str(n.a, vars) + " - " + wrap(n.b, true);
    case EOp::Mul: {  // constants first: 4*H, not H*4; a quotient on the right keeps its parentheses (H*(T/2) is not H*T/2)
      ExprId l = n.a, r = n.b;
      if (node(r).op == EOp::Const && node(l).op != EOp::Const) std::swap(l, r);
      return wrap(l, true) + "*" + (node(r).op == EOp::Div ? "(" + str(r, vars) + ")" : wrap(r, true));
    }
    case EOp::Div: {
      std::string rhs = str(n.b, vars);
      EOp bo = node(n.b).op;
      if (bo != EOp::Const && bo != EOp::Var && bo != EOp::AxisIndex && bo != EOp::AxisSize) rhs = "(" + rhs + ")";
      return wrap(n.a, true) + "/" + rhs;
    }
  }
  return "?";
}

void ExprPool::monomial(ExprId id, std::int64_t& coef, std::vector<ExprId>& factors) const {
  const ENode& n = node(id);
  if (n.op == EOp::Const) {
    std::int64_t r;
    coef = checked_mul(coef, n.c, r) ? r : coef;
  } else if (n.op == EOp::Mul) {
    monomial(n.a, coef, factors);
    monomial(n.b, coef, factors);
  } else {
    factors.insert(std::upper_bound(factors.begin(), factors.end(), id), id);
  }
}

namespace {

class Parser {
 public:
  Parser(ExprPool& pool, std::string_view text, const std::function<std::optional<ExprId>(std::string_view)>& lookup, const ExprPool::CallFn* call)
      : pool_(pool), s_(text), lookup_(lookup), call_(call) {}

  ExprId parse_all() {
    ExprId e = expr(0);
    skip();
    if (pos_ != s_.size()) throw ExprError(pos_, "unexpected '" + std::string(1, s_[pos_]) + "' in size expression");
    return e;
  }

 private:
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  ExprId expr(int depth) {
    ExprId e = term(depth);
    for (;;) {
      skip();
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) {
        char c = s_[pos_++];
        ExprId r = term(depth);
        e = c == '+' ? pool_.add(e, r) : pool_.sub(e, r);
      } else {
        return e;
      }
    }
  }
  ExprId term(int depth) {
    ExprId e = atom(depth);
    for (;;) {
      skip();
      if (pos_ < s_.size() && (s_[pos_] == '*' || s_[pos_] == '/')) {
        const std::size_t at = pos_;
        char c = s_[pos_++];
        ExprId r = atom(depth);
        if (c == '/' && pool_.is_const(r) && pool_.value(r) == 0) throw ExprError(at, "division by zero in size expression");
        e = c == '*' ? pool_.mul(e, r) : pool_.div(e, r);
      } else {
        return e;
      }
    }
  }
  ExprId atom(int depth) {
    if (depth > 64) throw ExprError(pos_, "size expression nested too deeply");
    skip();
    if (pos_ >= s_.size()) throw ExprError(pos_, "size expression ends early");
    char c = s_[pos_];
    if (c == '-') {  // unary minus: "-4" is a (non-positive) size the caller rejects by name
      ++pos_;
      skip();
      if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) return pool_.sub(pool_.constant(0), number(true));
      return pool_.sub(pool_.constant(0), atom(depth + 1));
    }
    if (c == '(') {
      ++pos_;
      ExprId e = expr(depth + 1);
      skip();
      if (pos_ >= s_.size() || s_[pos_] != ')') throw ExprError(pos_, "missing ')' in size expression");
      ++pos_;
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(false);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t start = pos_;
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
      std::string_view name = s_.substr(start, pos_ - start);
      skip();
      if (pos_ < s_.size() && s_[pos_] == '(') {  // a call: f(NAME)
        ++pos_;
        skip();
        std::size_t a0 = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        std::string_view arg = s_.substr(a0, pos_ - a0);
        skip();
        if (arg.empty() || pos_ >= s_.size() || s_[pos_] != ')')
          throw ExprError(a0, "'" + std::string(name) + "(' must be followed by a mesh axis name and ')', e.g. axis_index(tp)");
        ++pos_;
        if (!call_) throw ExprError(start, "'" + std::string(name) + "(...)' is not allowed in a size expression here");
        return (*call_)(name, arg, a0);
      }
      auto e = lookup_(name);
      if (!e) throw ExprError(start, "");  // the caller words the unknown-name error
      return *e;
    }
    throw ExprError(pos_, "unexpected '" + std::string(1, c) + "' in size expression");
  }

  // A decimal literal; one above 2^40 is named as written (with its sign), however many digits it has.
  ExprId number(bool negative) {
    const std::size_t start = pos_;
    std::int64_t v = 0;
    bool big = false;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      if (!big) v = v * 10 + (s_[pos_] - '0');
      big |= v > kMaxSize;
      ++pos_;
    }
    if (big) {
      std::string_view digits = s_.substr(start, pos_ - start);
      std::string shown = digits.size() <= 24 ? std::string(digits)
                                              : std::string(digits.substr(0, 8)) + "..." + std::string(digits.substr(digits.size() - 4)) + " (" +
                                                    std::to_string(digits.size()) + " digits)";
      throw ExprError(
          start, "size " + std::string(negative ? "-" : "") + shown + " is too large" + (negative ? " in magnitude" : "") + " (the limit is 2^40)");
    }
    return pool_.constant(v);
  }

  ExprPool& pool_;
  std::string_view s_;
  const std::function<std::optional<ExprId>(std::string_view)>& lookup_;
  const ExprPool::CallFn* call_;
  std::size_t pos_ = 0;
};

}  // namespace

ExprId ExprPool::parse(std::string_view text, const std::function<std::optional<ExprId>(std::string_view)>& lookup, const CallFn* call) {
  return Parser(*this, text, lookup, call).parse_all();
}

}  // namespace spmd
