// spatial/obligations.cpp - concrete decisions and the Z3 discharge of symbolic obligations.
#include "spatial/obligations.h"

#include <fmt/format.h>
#include <z3++.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

namespace spmd {

namespace {

bool holds(OblKind k, std::int64_t a, std::int64_t b) {
  switch (k) {
    case OblKind::Divisible: return b != 0 && a % b == 0;
    case OblKind::Equal: return a == b;
    case OblKind::Positive: return a >= 1;
    case OblKind::ExactDiv: return true;  // evaluated on the Div's operands by the caller
  }
  return false;
}

// Sides of an obligation as values under `vals`; ExactDiv evaluates the Div's operands.
bool sides(const ExprPool& pool, const Obligation& o, const std::vector<std::int64_t>& vals, std::int64_t& a, std::int64_t& b) {
  if (o.kind == OblKind::ExactDiv) {
    const ENode& n = pool.node(o.a);
    auto x = pool.eval(n.a, vals), y = pool.eval(n.b, vals);
    if (!x || !y) return false;
    a = *x, b = *y;
    return true;
  }
  auto x = pool.eval(o.a, vals);
  if (!x) return false;
  a = *x;
  if (o.kind == OblKind::Positive) return true;
  auto y = pool.eval(o.b, vals);
  if (!y) return false;
  b = *y;
  return true;
}

bool holds_on(const Obligation& o, std::int64_t a, std::int64_t b) {
  if (o.kind == OblKind::ExactDiv) return b != 0 && a % b == 0;
  return holds(o.kind, a, b);
}

}  // namespace

std::string failure_words(OblKind k, std::int64_t a, std::int64_t b) {
  switch (k) {
    case OblKind::Divisible: return fmt::format("{} is not divisible by {}", a, b);
    case OblKind::Equal: return fmt::format("{} != {}", a, b);
    case OblKind::Positive: return fmt::format("it is {}", a);
    case OblKind::ExactDiv: return b == 0 ? fmt::format("{} / 0 divides by zero", a) : fmt::format("{} / {} is not exact", a, b);
  }
  return "";
}

std::optional<std::int64_t> Obligations::concrete(ExprId e) const {
  if (pool_.is_const(e)) return pool_.value(e);
  return pool_.single_value(e, vars_);
}

Decision Obligations::decide(OblKind k, ExprId a, ExprId b) const {
  if (k == OblKind::Equal && a == b) return Decision::Holds;
  if (k == OblKind::Divisible && pool_.is_const(b) && pool_.value(b) == 1) return Decision::Holds;
  if (pool_.is_const(a) && (k == OblKind::Positive || pool_.is_const(b)) && k != OblKind::ExactDiv)
    return holds(k, pool_.value(a), k == OblKind::Positive ? 0 : pool_.value(b)) ? Decision::Holds : Decision::Fails;
  std::vector<int> vs;
  pool_.collect_vars(a, vs);
  if (k != OblKind::Positive && k != OblKind::ExactDiv) pool_.collect_vars(b, vs);
  if (!vs.empty()) return Decision::Deferred;
  Obligation o{k, a, b, CheckId::ShapeMismatch, {}, -1, {}, {}, {}};
  std::int64_t x = 0, y = 0;
  if (!sides(pool_, o, {}, x, y)) return Decision::Fails;  // an inexact or overflowing sub-expression
  return holds_on(o, x, y) ? Decision::Holds : Decision::Fails;
}

bool Obligations::first_time(OblKind k, ExprId a, ExprId b) {
  return seen_.insert({static_cast<int>(k), a, b}).second;
}

namespace {

// Z3 for the obligations that need it: one context, made on the first query that reaches the solver,
// and a fresh solver per query holding only the sizes that query mentions and their constraints.
class Prover {
 public:
  Prover(const ExprPool& pool, const std::vector<SizeVar>& vars)
      : pool_(pool), vars_(vars), zvars_(vars.size(), z3::expr(ctx_)), made_(vars.size(), 0) {}

  z3::expr var(int i) {
    auto k = static_cast<std::size_t>(i);
    if (!made_[k]) zvars_[k] = ctx_.int_const(vars_[k].name.c_str()), made_[k] = 1;
    return zvars_[k];
  }

  z3::expr tr(ExprId id) {
    auto it = memo_.find(id);
    if (it != memo_.end()) return it->second;
    const ENode& n = pool_.node(id);
    z3::expr e(ctx_);
    switch (n.op) {
      case EOp::Const: e = ctx_.int_val(n.c); break;
      case EOp::Var: e = var(n.a); break;
      case EOp::Add: e = tr(n.a) + tr(n.b); break;
      case EOp::Sub: e = tr(n.a) - tr(n.b); break;
      case EOp::Mul: e = tr(n.a) * tr(n.b); break;
      case EOp::Div: e = tr(n.a) / tr(n.b); break;
      case EOp::AxisIndex:
      case EOp::AxisSize: throw AxisExprError("an obligation mentions axis_index or a mesh axis size (local view): not a size variable");
    }
    memo_.emplace(id, e);
    return e;
  }

  z3::expr claim(const Obligation& o) {
    switch (o.kind) {
      case OblKind::Divisible: return z3::mod(tr(o.a), tr(o.b)) == 0;
      case OblKind::Equal: return tr(o.a) == tr(o.b);
      case OblKind::Positive: return tr(o.a) >= 1;
      case OblKind::ExactDiv: {
        const ENode& n = pool_.node(o.a);
        return tr(n.b) != 0 && z3::mod(tr(n.a), tr(n.b)) == 0;
      }
    }
    return ctx_.bool_val(true);
  }

  // One query: is there an allowed assignment of `vs` under which `o` fails? `combos` lists the allowed
  // value tuples of the enumerated variables `finite` that are still open (the claim is instantiated with
  // each, so that a modulus by a pinned size stays linear); empty `finite`: no enumeration. `bound`,
  // when positive, caps the other variables (to find a small counterexample). On sat fills `model`.
  // The query goes to Z3's SMT core first (milliseconds where the default solver's preprocessing takes
  // tens), and to the default solver, with the whole timeout, only when the core gives up.
  z3::check_result refute(const Obligation& o, const std::vector<int>& vs, const std::vector<int>& finite,
                          const std::vector<std::vector<std::int64_t>>& combos, std::int64_t bound, unsigned timeout_ms,
                          std::vector<std::int64_t>& model) {
    z3::check_result r = query(o, vs, finite, combos, bound, std::min(timeout_ms, kCoreMs), true, model);
    if (r != z3::unknown) return r;
    return query(o, vs, finite, combos, bound, timeout_ms, false, model);
  }

  const std::string& reason() const { return reason_; }

 private:
  static constexpr unsigned kCoreMs = 2000;

  z3::check_result query(const Obligation& o, const std::vector<int>& vs, const std::vector<int>& finite,
                         const std::vector<std::vector<std::int64_t>>& combos, std::int64_t bound, unsigned timeout_ms, bool simple,
                         std::vector<std::int64_t>& model) {
    // A fresh solver per query: one kept with push/pop accumulates state and slows down with the program.
    z3::solver s = simple ? z3::solver(ctx_, z3::solver::simple()) : z3::solver(ctx_);
    z3::params p(ctx_);
    p.set("timeout", timeout_ms);
    s.set(p);
    for (int i : vs) {
      const SizeVar& v = vars_[static_cast<std::size_t>(i)];
      z3::expr x = var(i);
      if (std::find(finite.begin(), finite.end(), i) != finite.end()) continue;  // pinned by each combination
      s.add(x >= ctx_.int_val(v.min));
      s.add(x <= ctx_.int_val(bound > 0 ? std::min(bound, v.max) : v.max));
      if (v.multiple_of > 1) s.add(z3::mod(x, ctx_.int_val(v.multiple_of)) == 0);
      if (!v.in.empty()) {
        z3::expr_vector alts(ctx_);
        for (auto val : v.in) alts.push_back(x == ctx_.int_val(val));
        s.add(z3::mk_or(alts));
      }
    }
    z3::expr fails = !claim(o);
    if (finite.empty()) {
      s.add(fails);
    } else {
      z3::expr_vector from(ctx_), alts(ctx_);
      for (int i : finite) from.push_back(var(i));
      for (const auto& c : combos) {
        z3::expr_vector to(ctx_), pin(ctx_);
        for (std::size_t j = 0; j < finite.size(); ++j) {
          to.push_back(ctx_.int_val(c[j]));
          pin.push_back(from[static_cast<unsigned>(j)] == ctx_.int_val(c[j]));
        }
        pin.push_back(z3::expr(fails).substitute(from, to));
        alts.push_back(z3::mk_and(pin));
      }
      s.add(z3::mk_or(alts));
    }
    z3::check_result r = s.check();
    if (r == z3::sat) {
      z3::model m = s.get_model();
      for (int i : vs) {
        std::int64_t x = 0;
        if (m.eval(var(i), true).is_numeral_i64(x)) model[static_cast<std::size_t>(i)] = x;
      }
    } else if (r == z3::unknown) {
      reason_ = s.reason_unknown();
    }
    return r;
  }

  const ExprPool& pool_;
  const std::vector<SizeVar>& vars_;
  z3::context ctx_;
  std::vector<z3::expr> zvars_;
  std::vector<char> made_;
  std::map<ExprId, z3::expr> memo_;
  std::string reason_;
};

}  // namespace

namespace {

// A number that `e` is always a multiple of, given the size constraints and the pinned values (1 if unknown).
std::int64_t known_multiple(const ExprPool& pool, const std::vector<SizeVar>& vars, ExprId e, const std::map<int, std::int64_t>& fixed) {
  const ENode& n = pool.node(e);
  auto cap = [](std::int64_t v) { return v > (std::int64_t{1} << 40) || v < 1 ? std::int64_t{1} : v; };
  switch (n.op) {
    case EOp::Const: return n.c == 0 ? std::int64_t{1} << 40 : cap(n.c < 0 ? -n.c : n.c);
    case EOp::Var: {
      auto it = fixed.find(n.a);
      if (it != fixed.end()) return cap(it->second);
      const SizeVar& v = vars[static_cast<std::size_t>(n.a)];
      std::int64_t g = v.multiple_of;
      if (!v.in.empty()) {
        std::int64_t gi = 0;
        for (auto x : v.in) gi = std::gcd(gi, x);
        g = std::lcm(g, gi);
      }
      return cap(g);
    }
    case EOp::Mul: {
      std::int64_t r;
      if (__builtin_mul_overflow(known_multiple(pool, vars, n.a, fixed), known_multiple(pool, vars, n.b, fixed), &r)) return std::int64_t{1} << 40;
      return cap(r);
    }
    case EOp::Add:
    case EOp::Sub: return std::gcd(known_multiple(pool, vars, n.a, fixed), known_multiple(pool, vars, n.b, fixed));
    case EOp::Div: return 1;
    case EOp::AxisIndex:
    case EOp::AxisSize: throw AxisExprError("known_multiple: axis_index or a mesh axis size is not a size variable");
  }
  return 1;
}

// Polynomials with rational coefficients over the open sizes, for proving an equality by identity: two
// sides with the same normal form are equal for every value. A division by a pinned divisor d that is a
// known factor of the dividend is exact, so it is the rational 1/d; any other division is an opaque atom
// (the same node on both sides has the same value). Gives up (nullopt) on overflow or too many terms.
struct Rat {
  __int128 num = 0, den = 1;
};
using Mono = std::vector<std::int64_t>;  // sorted: open size i as i, an opaque division node n as -(n + 1)
using Poly = std::map<Mono, Rat>;

// Every number stays within 2^60, so a product of two (or a sum of two products) cannot overflow 128 bits.
bool fits(__int128 v) { return v <= (__int128{1} << 60) && v >= -(__int128{1} << 60); }

std::optional<Rat> rat(__int128 num, __int128 den) {
  if (den < 0) num = -num, den = -den;
  __int128 a = num < 0 ? -num : num, b = den;
  while (b) a %= b, std::swap(a, b);
  if (a > 1) num /= a, den /= a;
  if (!fits(num) || !fits(den)) return std::nullopt;
  return Rat{num, den};
}

std::optional<Poly> poly(const ExprPool& pool, const std::vector<SizeVar>& vars, ExprId e, const std::map<int, std::int64_t>& fixed,
                         std::int64_t (*multiple)(const ExprPool&, const std::vector<SizeVar>&, ExprId, const std::map<int, std::int64_t>&)) {
  constexpr std::size_t kMaxTerms = 64;
  const ENode& n = pool.node(e);
  auto constant = [](__int128 c) {
    Poly p;
    if (c != 0) p[{}] = Rat{c, 1};
    return p;
  };
  switch (n.op) {
    case EOp::Const:
      if (!fits(n.c)) return std::nullopt;
      return constant(n.c);
    case EOp::AxisIndex:
    case EOp::AxisSize: throw AxisExprError("poly: axis_index or a mesh axis size is not a size variable");
    case EOp::Var: {
      if (auto it = fixed.find(n.a); it != fixed.end()) return constant(it->second);
      Poly p;
      p[{n.a}] = Rat{1, 1};
      return p;
    }
    case EOp::Add:
    case EOp::Sub: {
      auto x = poly(pool, vars, n.a, fixed, multiple), y = poly(pool, vars, n.b, fixed, multiple);
      if (!x || !y) return std::nullopt;
      for (auto& [m, c] : *y) {
        Rat& t = (*x)[m];
        auto r = rat(t.num * c.den + (n.op == EOp::Add ? c.num : -c.num) * t.den, t.den * c.den);
        if (!r) return std::nullopt;
        if (r->num == 0) x->erase(m);
        else t = *r;
      }
      if (x->size() > kMaxTerms) return std::nullopt;
      return x;
    }
    case EOp::Mul: {
      auto x = poly(pool, vars, n.a, fixed, multiple), y = poly(pool, vars, n.b, fixed, multiple);
      if (!x || !y || x->size() * y->size() > kMaxTerms) return std::nullopt;
      Poly p;
      for (auto& [mx, cx] : *x)
        for (auto& [my, cy] : *y) {
          Mono m = mx;
          m.insert(m.end(), my.begin(), my.end());
          std::sort(m.begin(), m.end());
          auto prod = rat(cx.num * cy.num, cx.den * cy.den);
          if (!prod) return std::nullopt;
          Rat& t = p[m];
          auto r = rat(t.num * prod->den + prod->num * t.den, t.den * prod->den);
          if (!r) return std::nullopt;
          if (r->num == 0) p.erase(m);
          else t = *r;
        }
      return p;
    }
    case EOp::Div: {
      auto d = poly(pool, vars, n.b, fixed, multiple);
      if (d && d->size() == 1 && d->begin()->first.empty() && d->begin()->second.den == 1) {
        __int128 dv = d->begin()->second.num;
        if (dv > 0 && multiple(pool, vars, n.a, fixed) % static_cast<std::int64_t>(dv) == 0) {
          auto x = poly(pool, vars, n.a, fixed, multiple);
          if (!x) return std::nullopt;
          for (auto& [m, c] : *x) {
            auto r = rat(c.num, c.den * dv);
            if (!r) return std::nullopt;
            c = *r;
          }
          return x;
        }
      }
      Poly p;
      p[{-static_cast<std::int64_t>(e) - 1}] = Rat{1, 1};
      return p;
    }
  }
  return std::nullopt;
}

bool same_poly(const Poly& a, const Poly& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
    if (ia->first != ib->first || ia->second.num != ib->second.num || ia->second.den != ib->second.den) return false;
  return true;
}

}  // namespace

void Obligations::solve(std::vector<Diagnostic>& out) {
  if (pending_.empty()) return;
  std::optional<Prover> prover;  // made by the first obligation that needs the solver
  for (const Obligation& o : pending_) {
    std::vector<int> vs;
    pool_.collect_vars(o.a, vs);
    if (o.kind != OblKind::Positive && o.kind != OblKind::ExactDiv) pool_.collect_vars(o.b, vs);
    std::sort(vs.begin(), vs.end());
    vs.erase(std::unique(vs.begin(), vs.end()), vs.end());
    // Enumerate the finite-domain variables (when few), leaving the rest to the solver.
    std::vector<int> finite, open;
    std::size_t n_combos = 1;
    for (int i : vs) {
      const auto& in = vars_[static_cast<std::size_t>(i)].in;
      if (!in.empty() && n_combos * in.size() <= 4096) {
        finite.push_back(i);
        n_combos *= in.size();
      } else {
        open.push_back(i);
      }
    }
    // The divisor of a claim is pinned in every combination when all its sizes are enumerated; then a
    // product of multiples (B*S with B = 8k) is divisible with no solver.
    ExprId dividend = o.a, divisor = o.b;
    if (o.kind == OblKind::ExactDiv) dividend = pool_.node(o.a).a, divisor = pool_.node(o.a).b;
    std::vector<int> dvars;
    bool by_multiples = o.kind == OblKind::Divisible || o.kind == OblKind::ExactDiv;
    if (by_multiples) pool_.collect_vars(divisor, dvars);
    bool divisor_finite = by_multiples && std::all_of(dvars.begin(), dvars.end(), [&](int i) {
                            return std::find(finite.begin(), finite.end(), i) != finite.end();
                          });
    std::vector<std::int64_t> model(vars_.size(), 0);
    bool failed = false, unknown = false;
    std::string why_unknown;
    // The allowed combinations the cheap arguments leave open (decided by one solver query).
    std::vector<std::vector<std::int64_t>> left;
    std::vector<std::size_t> idx(finite.size(), 0);
    std::vector<std::int64_t> vals(vars_.size(), 0);
    std::map<int, std::int64_t> fixed;
    for (std::size_t c = 0; c < n_combos && !failed; ++c) {
      bool allowed = true;
      std::vector<std::int64_t> combo(finite.size());
      fixed.clear();
      for (std::size_t j = 0; j < finite.size(); ++j) {
        const SizeVar& v = vars_[static_cast<std::size_t>(finite[j])];
        std::int64_t val = v.in[idx[j]];
        allowed &= val >= v.min && val <= v.max && val % v.multiple_of == 0;
        combo[j] = val;
        fixed[finite[j]] = val;
        vals[static_cast<std::size_t>(finite[j])] = val;
      }
      // Next combination (odometer).
      for (std::size_t j = 0; j < finite.size(); ++j) {
        if (++idx[j] < vars_[static_cast<std::size_t>(finite[j])].in.size()) break;
        idx[j] = 0;
      }
      if (!allowed) continue;
      if (divisor_finite) {
        auto div = pool_.eval(divisor, vals);
        if (div && *div > 0 && known_multiple(pool_, vars_, dividend, fixed) % *div == 0) continue;
      }
      if (o.kind == OblKind::Equal && !open.empty()) {  // an identity needs no solver (4096*H == H/NH*4096*NH)
        auto pa = poly(pool_, vars_, o.a, fixed, known_multiple), pb = poly(pool_, vars_, o.b, fixed, known_multiple);
        if (pa && pb && same_poly(*pa, *pb)) continue;
      }
      if (open.empty()) {
        std::int64_t a = 0, b = 0;
        if (!sides(pool_, o, vals, a, b) || !holds_on(o, a, b)) {
          failed = true;
          for (int i : finite) model[static_cast<std::size_t>(i)] = vals[static_cast<std::size_t>(i)];
        }
        continue;
      }
      left.push_back(std::move(combo));
    }
    if (!failed && !left.empty()) {  // open sizes remain in some allowed combination
      if (!prover) prover.emplace(pool_, vars_);
      auto r = prover->refute(o, vs, finite, left, 0, timeout_ms_, model);
      if (r == z3::sat) {
        failed = true;
        // Small counterexamples read better: one more query with the open sizes capped, only on failure.
        bool large = std::any_of(open.begin(), open.end(), [&](int i) { return model[static_cast<std::size_t>(i)] > (std::int64_t{1} << 12); });
        std::vector<std::int64_t> small(vars_.size(), 0);
        if (large && prover->refute(o, vs, finite, left, std::int64_t{1} << 12, std::min(timeout_ms_, 1000u), small) == z3::sat) model = small;
      } else if (r == z3::unknown) {
        unknown = true, why_unknown = prover->reason();
      }
    }
    if (!failed && !unknown) continue;
    Diagnostic d;
    d.id = o.id;
    d.loc = o.loc;
    d.op = o.op;
    d.tensor = o.tensor;
    d.notes = o.notes;
    if (failed) {
      std::string assign;
      for (int i : vs) assign += (assign.empty() ? "" : ", ") + fmt::format("{} = {}", vars_[static_cast<std::size_t>(i)].name, model[static_cast<std::size_t>(i)]);
      std::int64_t a = 0, b = 0;
      std::string words = sides(pool_, o, model, a, b) ? failure_words(o.kind, a, b) : "a sub-expression is not an exact division";
      d.message = fmt::format("{} for every allowed size, but it fails when {}: {}", o.what, assign, words);
      for (int i : vs) {
        const SizeVar& v = vars_[static_cast<std::size_t>(i)];
        Loc l = static_cast<std::size_t>(i) < var_locs_.size() ? var_locs_[static_cast<std::size_t>(i)] : Loc{};
        if (l.line) d.notes.push_back({l, fmt::format("{} may be {} here; fix: narrow its allowed values or change the shape", v.name, model[static_cast<std::size_t>(i)])});
      }
    } else {
      d.message = fmt::format("{} for every allowed size, and the solver could not decide it ({}); this is not a pass: "
                              "narrow the sizes or raise --z3-timeout",
                              o.what, why_unknown.empty() ? "unknown" : why_unknown);
    }
    out.push_back(std::move(d));
  }
}

}  // namespace spmd
