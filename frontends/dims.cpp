// frontends/dims.cpp - symbolize: named sizes for the lowered ops by unification over monomials of named sizes.
//
// Each declared input dim starts as its own named size (sN, N its value); the plan's S(d) dims are that size / TP.
// Walking the ops, a dim two shapes must share (contracted, broadcast, reshaped whole) unifies the two monomials:
// one named size is solved for in terms of the others (a size made for a literal first). A literal with no
// structural meaning (a Full's shape, an Arange's end, a vocab bound) is the one named size (or one / TP) of that
// value when there is exactly one, else a size of its own. Values never change: every expression evaluates to
// the literal it replaces, so the program is the same program with its sizes named.
#include "frontends/dims.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace spmd::frontends {

namespace {

struct Mono {
  std::int64_t num = 1, den = 1;
  std::map<int, int> f;  // named size -> power (nonzero)
};

struct Atom {
  std::string name;
  std::int64_t value = 0;
  bool fixed = false, fresh = false, eliminated = false;
  Mono subst;
};

struct Fail {
  std::string why;
};

void normalize(Mono& m) {
  if (m.den < 0) m.num = -m.num, m.den = -m.den;
  std::int64_t g = std::gcd(m.num, m.den);
  if (g > 1) m.num /= g, m.den /= g;
  for (auto it = m.f.begin(); it != m.f.end();) it = it->second == 0 ? m.f.erase(it) : std::next(it);
}

Mono konst(std::int64_t c) {
  Mono m;
  m.num = c;
  return m;
}

Mono mul(Mono a, const Mono& b, int pw = 1) {
  for (int k = 0; k < std::abs(pw); ++k) {
    __int128 n = pw > 0 ? static_cast<__int128>(a.num) * b.num : static_cast<__int128>(a.num) * b.den;
    __int128 d = pw > 0 ? static_cast<__int128>(a.den) * b.den : static_cast<__int128>(a.den) * b.num;
    if (n > (__int128{1} << 62) || d > (__int128{1} << 62) || n < -(__int128{1} << 62)) throw Fail{"a coefficient overflows"};
    a.num = static_cast<std::int64_t>(n), a.den = static_cast<std::int64_t>(d);
    normalize(a);
  }
  for (const auto& [k, p] : b.f) a.f[k] += p * pw;
  normalize(a);
  return a;
}

class Solver {
 public:
  std::vector<Atom> atoms;
  int tp = -1;
  std::vector<Mono> seen;  // dims seen (canonical when stored), for naming literals

  int make(std::int64_t v, bool fresh) {
    std::string base = "s" + std::to_string(v), n = base;
    for (int k = 2; taken(n); ++k) n = base + "_" + std::to_string(k);
    atoms.push_back({n, v, false, fresh, false, {}});
    return static_cast<int>(atoms.size()) - 1;
  }
  bool taken(const std::string& n) const {
    return std::any_of(atoms.begin(), atoms.end(), [&](const Atom& a) { return a.name == n; });
  }
  Mono of(int a) const {
    Mono m;
    m.f[a] = 1;
    return m;
  }
  Mono fresh(std::int64_t v) { return v <= 1 ? konst(v) : of(make(v, true)); }

  Mono canon(const Mono& m) const {
    Mono out;
    out.num = m.num, out.den = m.den;
    for (const auto& [a, p] : m.f) {
      if (atoms[static_cast<std::size_t>(a)].eliminated) out = mul(out, canon(atoms[static_cast<std::size_t>(a)].subst), p);
      else out.f[a] += p;
    }
    normalize(out);
    return out;
  }

  // The exact value, or nullopt when it is not an integer.
  std::optional<std::int64_t> value(const Mono& m0) const {
    Mono m = canon(m0);
    __int128 n = m.num, d = m.den;
    for (const auto& [a, p] : m.f)
      for (int k = 0; k < std::abs(p); ++k) {
        (p > 0 ? n : d) *= atoms[static_cast<std::size_t>(a)].value;
        if (n > (__int128{1} << 62) || d > (__int128{1} << 62)) return std::nullopt;
      }
    if (d == 0 || n % d) return std::nullopt;
    return static_cast<std::int64_t>(n / d);
  }

  void unify(const Mono& a0, const Mono& b0, const std::string& what) {
    Mono a = canon(a0), b = canon(b0);
    if (value(a) != value(b)) throw Fail{what + ": sizes " + text(a) + " and " + text(b) + " differ"};
    Mono r = mul(a, b, -1);
    if (r.f.empty()) return;
    // only fixed sizes (TP) left: equal values are equal, as fixed sizes keep their values under --reduce
    if (std::all_of(r.f.begin(), r.f.end(), [&](const auto& kp) { return atoms[static_cast<std::size_t>(kp.first)].fixed; })) return;
    // Products of sizes of the same values (B*S against B'*S'): pair them up size by size.
    if (r.num == 1 && r.den == 1) {
      std::vector<std::pair<std::int64_t, int>> up, down;
      for (const auto& [k, p] : r.f)
        for (int i = 0; i < std::abs(p); ++i) (p > 0 ? up : down).emplace_back(atoms[static_cast<std::size_t>(k)].value, k);
      std::sort(up.begin(), up.end()), std::sort(down.begin(), down.end());
      bool pairs = up.size() == down.size() && up.size() > 1;
      for (std::size_t i = 0; pairs && i < up.size(); ++i) pairs = up[i].first == down[i].first && !atoms[static_cast<std::size_t>(up[i].second)].fixed;
      if (pairs) {
        for (std::size_t i = 0; i < up.size(); ++i) unify(of(up[i].second), of(down[i].second), what);
        return;
      }
    }
    int x = -1;
    long best = -1;
    for (const auto& [k, p] : r.f) {
      const Atom& t = atoms[static_cast<std::size_t>(k)];
      if (std::abs(p) != 1 || t.fixed) continue;
      long score = (t.fresh ? 1L << 30 : 0) + k;
      if (score > best) best = score, x = k;
    }
    if (x < 0) throw Fail{what + ": " + text(a) + " = " + text(b) + " has no size to solve for"};
    int p = r.f[x];
    Mono rest = r;
    rest.f.erase(x);
    Mono e = mul(konst(1), rest, -p);  // x^p * rest = 1
    if (value(e) != atoms[static_cast<std::size_t>(x)].value) throw Fail{what + ": " + atoms[static_cast<std::size_t>(x)].name + " = " + text(e) + " is not exact"};
    atoms[static_cast<std::size_t>(x)].eliminated = true;
    atoms[static_cast<std::size_t>(x)].subst = e;
  }

  // A literal with no structural meaning: the one named size of that value (or one / TP), else a size of its own.
  Mono literal(std::int64_t v) {
    if (v <= 1) return konst(v);
    std::vector<Mono> cands;
    auto add = [&](Mono m) {
      m = canon(m);
      std::string t = text(m);
      for (const auto& c : cands)
        if (text(c) == t) return;
      cands.push_back(m);
    };
    for (std::size_t a = 0; a < atoms.size(); ++a) {
      const Atom& t = atoms[a];
      if (t.eliminated || t.fixed) continue;
      if (t.value == v) add(of(static_cast<int>(a)));
      if (tp >= 0 && t.value == v * atoms[static_cast<std::size_t>(tp)].value) add(mul(of(static_cast<int>(a)), of(tp), -1));
    }
    if (cands.empty()) return fresh(v);
    // several sizes of that value: the literal cannot say which, so they are one size (the values stay the same;
    // only the shape reduction loses the freedom to shrink them apart). Whole sizes before quotients by TP.
    std::vector<Mono> plain;
    for (const auto& c : cands)
      if (c.den == 1 && c.f.size() == 1) plain.push_back(c);
    const auto& pick = plain.empty() ? cands : plain;
    for (std::size_t i = 1; i < pick.size(); ++i) unify(pick[0], pick[i], "the literal " + std::to_string(v));
    return canon(pick[0]);
  }

  std::string text(const Mono& m0) const {
    Mono m = canon(m0);
    std::vector<std::string> up, down;
    if (m.num != 1 || m.f.empty()) up.push_back(std::to_string(m.num));
    if (m.den != 1) down.push_back(std::to_string(m.den));
    for (const auto& [a, p] : m.f)
      for (int k = 0; k < std::abs(p); ++k) (p > 0 ? up : down).push_back(atoms[static_cast<std::size_t>(a)].name);
    if (up.empty()) up.push_back("1");
    std::string s;
    for (std::size_t i = 0; i < up.size(); ++i) s += (i ? "*" : "") + up[i];
    if (down.empty()) return s;
    std::string d;
    for (std::size_t i = 0; i < down.size(); ++i) d += (i ? "*" : "") + down[i];
    return s + "/" + (down.size() > 1 ? "(" + d + ")" : d);
  }
};

// ---- attribute texts ----------------------------------------------------------------------------------

std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t i = s.find('[');
  if (i == std::string::npos) throw Fail{"not a list: " + s};
  ++i;
  while (i < s.size() && s[i] != ']') {
    while (s[i] == ' ' || s[i] == ',') ++i;
    if (s[i] == ']') break;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str() + i, &end, 10);
    if (end == s.c_str() + i) throw Fail{"not a list of integers: " + s};
    out.push_back(v);
    i = static_cast<std::size_t>(end - s.c_str());
  }
  return out;
}

// "a", "a + b*axis_index(tp)", "b*axis_index(tp) + 1", "a - axis_index(tp)": a + b * axis_index.
void parse_affine(const std::string& s, std::int64_t& a, std::int64_t& b) {
  a = 0, b = 0;
  std::size_t i = 0;
  int sign = 1;
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ') {
      ++i;
      continue;
    }
    if (c == '+' || c == '-') {
      sign = c == '-' ? -1 : 1;
      ++i;
      continue;
    }
    std::int64_t k = 1;
    if (std::isdigit(static_cast<unsigned char>(c))) {
      char* end = nullptr;
      k = std::strtoll(s.c_str() + i, &end, 10);
      i = static_cast<std::size_t>(end - s.c_str());
      if (i < s.size() && s[i] == '*') ++i;
      else {
        a += sign * k;
        sign = 1;
        continue;
      }
    }
    if (s.compare(i, 11, "axis_index(") != 0) throw Fail{"not an affine size: " + s};
    i = s.find(')', i);
    if (i == std::string::npos) throw Fail{"not an affine size: " + s};
    ++i;
    b += sign * k;
    sign = 1;
  }
}

// An attribute to rewrite, kept symbolic until every op is walked (a later unification may solve for its sizes).
struct Pending {
  std::string key;
  bool list = false;
  std::vector<Mono> items;                  // list: its elements
  std::optional<Mono> a, b;                 // else a + b*axis_index(axis), then `suffix`
  std::string suffix;
};

// The sum of dim d of the inputs when each is a rational multiple of one product of named sizes, else none.
std::optional<Mono> sum_of_multiples(const Solver& sv, const std::vector<const std::vector<Mono>*>& ins, std::size_t d) {
  Mono first = sv.canon((*ins[0])[d]);
  __int128 num = 0, den = 1;
  for (const auto* t : ins) {
    Mono m = sv.canon((*t)[d]);
    if (m.f != first.f) return std::nullopt;
    num = num * m.den + static_cast<__int128>(m.num) * den;
    den *= m.den;
    __int128 a = num < 0 ? -num : num, b = den;
    while (b) a %= b, std::swap(a, b);
    if (a > 1) num /= a, den /= a;
    if (den > (__int128{1} << 62) || num > (__int128{1} << 62) || num < -(__int128{1} << 62)) return std::nullopt;
  }
  first.num = static_cast<std::int64_t>(num), first.den = static_cast<std::int64_t>(den);
  normalize(first);
  return first;
}

struct Walker {
  Solver& sv;
  std::string axis;
  bool plan;  // local view on TP ranks (collectives change shapes), else the single-device spec
  std::unordered_map<std::string, std::vector<Mono>> env;
  std::vector<std::vector<Pending>> attrs;  // per op: rewritten attributes
  std::size_t literals = 0;

  const std::vector<Mono>& in(const std::string& n) {
    auto it = env.find(n);
    if (it == env.end()) throw Fail{"'" + n + "' has no shape"};
    return it->second;
  }
  std::int64_t val(const Mono& m) {
    auto v = sv.value(m);
    if (!v) throw Fail{"a size is not an integer"};
    return *v;
  }
  void set(const std::string& n, std::vector<Mono> s) {
    for (auto& m : s) sv.seen.push_back(sv.canon(m));
    env[n] = std::move(s);
  }
  Pending list(const char* key, const std::vector<Mono>& s) {
    literals += s.size();
    return {key, true, s, {}, {}, {}};
  }
  // a + b*axis_index(axis), with a and b as multiples of `unit` when they are, else literals
  Pending affine(const char* key, std::int64_t a, std::int64_t b, const Mono* unit, std::string suffix = "") {
    auto term = [&](std::int64_t v) -> Mono {
      if (unit) {
        std::int64_t u = val(*unit);
        if (u > 0 && v % u == 0) return mul(konst(v / u), *unit);
      }
      return sv.literal(v);
    };
    ++literals;
    Pending p{key, false, {}, {}, {}, std::move(suffix)};
    if (a != 0 || b == 0) p.a = term(a);
    if (b != 0) p.b = term(b);
    return p;
  }
  std::string text(const Pending& p) {
    if (p.list) {
      std::string o = "[";
      for (std::size_t i = 0; i < p.items.size(); ++i) o += (i ? ", " : "") + sv.text(p.items[i]);
      return o + "]";
    }
    std::string s;
    if (p.a) s = sv.text(*p.a);
    if (p.b) {
      std::string t = sv.text(*p.b);
      if (t.find_first_of("*/") != std::string::npos) t = "(" + t + ")";
      s += (s.empty() ? "" : " + ") + t + "*axis_index(" + axis + ")";
    }
    return s + p.suffix;
  }

  std::vector<Mono> broadcast(std::vector<Mono> a, std::vector<Mono> b, const std::string& what) {
    if (a.size() < b.size()) std::swap(a, b);
    std::size_t off = a.size() - b.size();
    for (std::size_t i = 0; i < b.size(); ++i) {
      Mono& x = a[off + i];
      const Mono& y = b[i];
      std::int64_t vx = val(x), vy = val(y);
      if (vy == 1) continue;
      if (vx == 1) {
        x = y;
        continue;
      }
      sv.unify(x, y, what);
    }
    return a;
  }

  static const std::string* attr(const EOp& e, const char* k) {
    for (const auto& [n, v] : e.attrs)
      if (n == k) return &v;
    return nullptr;
  }
  static int norm(int d, std::size_t r) { return d < 0 ? d + static_cast<int>(r) : d; }

  // one reshape: groups of input dims and output values of equal product
  std::vector<Mono> reshape(const std::vector<Mono>& x, const std::vector<std::int64_t>& w) {
    std::vector<Mono> out;
    std::size_t i = 0, j = 0;
    while (i < x.size() || j < w.size()) {
      if (i < x.size() && val(x[i]) == 1) {
        ++i;
        continue;
      }
      if (j < w.size() && w[j] == 1) {
        out.push_back(konst(1));
        ++j;
        continue;
      }
      if (i >= x.size() || j >= w.size()) throw Fail{"a reshape's element counts differ"};
      std::size_t i0 = i, j0 = j;
      __int128 pi = val(x[i++]), pj = w[j++];
      while (pi != pj) {
        if (pi < pj) {
          if (i >= x.size()) throw Fail{"a reshape's element counts differ"};
          pi *= val(x[i++]);
        } else {
          if (j >= w.size()) throw Fail{"a reshape's element counts differ"};
          pj *= w[j++];
        }
      }
      Mono whole = konst(1);
      for (std::size_t k = i0; k < i; ++k) whole = mul(whole, x[k]);
      if (j - j0 == 1) {
        out.push_back(whole);
        continue;
      }
      // split `whole` into w[j0..j): named sizes of it in order, else sizes of their own (the last takes the rest)
      Mono rest = sv.canon(whole);
      for (std::size_t k = j0; k + 1 < j; ++k) {
        Mono piece = take(rest, w[k]);
        out.push_back(piece);
        rest = mul(rest, piece, -1);
      }
      if (val(rest) != w[j - 1]) throw Fail{"a reshape's split does not fit"};
      out.push_back(rest);
    }
    return out;
  }
  // A factor of m (named sizes of m, or m's coefficient) with value v; else a new size.
  Mono take(const Mono& m, std::int64_t v) {
    std::vector<int> items;
    for (const auto& [a, p] : m.f)
      for (int k = 0; k < p; ++k) items.push_back(a);
    for (std::size_t n = 1; n <= items.size() && n <= 3; ++n) {
      std::vector<bool> pick(items.size());
      std::fill(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(n), true);
      do {
        Mono c = konst(1);
        for (std::size_t k = 0; k < items.size(); ++k)
          if (pick[k]) c = mul(c, sv.of(items[k]));
        if (val(c) == v) return c;
        if (m.den == 1 && m.num > 1 && v % val(c) == 0 && m.num % (v / val(c)) == 0) return mul(c, konst(v / val(c)));
      } while (std::prev_permutation(pick.begin(), pick.end()));
    }
    if (m.den == 1 && m.num % v == 0 && v > 1) return konst(v);
    return sv.literal(v);  // a size of that value seen before (a head count / TP), else its own
  }

  void op(EOp& e, std::size_t k) {
    auto& out_attrs = attrs[k];
    const std::string& kind = e.op;
    auto rw = [&](Pending p) { out_attrs.push_back(std::move(p)); };
    std::vector<const std::vector<Mono>*> ins;
    for (const auto& n : e.in) ins.push_back(&in(n));
    std::string what = kind + " writing " + (e.out.empty() ? std::string("-") : e.out[0]);
    auto same = [&] { set(e.out[0], *ins[0]); };
    if (kind == "GELU" || kind == "Exp" || kind == "Log" || kind == "Neg" || kind == "Sqrt" || kind == "Rsqrt" || kind == "ReLU" || kind == "SiLU" ||
        kind == "Cast" || kind == "Softmax" || kind == "LayerNorm" || kind == "RMSNorm" || kind == "Dropout" || kind == "Sin" || kind == "Cos") {
      if (kind == "LayerNorm" || kind == "RMSNorm")
        for (std::size_t i = 1; i < ins.size(); ++i) {  // the weight and bias broadcast against x
          auto b = *ins[i];
          broadcast(*ins[0], b, what);
        }
      return same();
    }
    if (kind == "Add" || kind == "Sub" || kind == "Multiply" || kind == "Div" || kind == "Maximum" || kind == "Minimum" || kind == "PointwiseGrad") {
      if (ins.size() == 1) return same();
      return set(e.out[0], broadcast(*ins[0], *ins[1], what));
    }
    if (kind == "NormGrad") {
      set(e.out[0], broadcast(*ins[0], *ins[1], what));
      return;
    }
    if (kind == "Where") return set(e.out[0], broadcast(*ins[0], broadcast(*ins[1], *ins[2], what), what));
    if (kind == "Transpose") {
      auto d = parse_list(*attr(e, "dims"));
      auto s = *ins[0];
      std::swap(s[static_cast<std::size_t>(norm(static_cast<int>(d[0]), s.size()))], s[static_cast<std::size_t>(norm(static_cast<int>(d[1]), s.size()))]);
      return set(e.out[0], s);
    }
    if (kind == "MatMul") {
      auto a = *ins[0], b = *ins[1];
      if (a.size() < 2 || b.size() < 2) throw Fail{what + ": rank below 2"};
      sv.unify(a.back(), b[b.size() - 2], what);
      if (b.size() > 2)
        for (std::size_t i = 0; i + 2 < b.size(); ++i) sv.unify(a[i], b[i], what);
      a.back() = b.back();
      return set(e.out[0], a);
    }
    if (kind == "Reshape") {
      auto w = parse_list(*attr(e, "shape"));
      auto s = reshape(*ins[0], w);
      rw(list("shape", s));
      return set(e.out[0], s);
    }
    if (kind == "Expand" || kind == "Full") {
      auto w = parse_list(*attr(e, "shape"));
      std::vector<Mono> s;
      const std::vector<Mono>* x = ins.empty() ? nullptr : ins[0];
      for (std::size_t i = 0; i < w.size(); ++i) {
        std::size_t lead = x ? w.size() - x->size() : w.size();
        if (x && i >= lead && val((*x)[i - lead]) != 1) s.push_back((*x)[i - lead]);
        else s.push_back(sv.fresh(w[i]));
      }
      rw(list("shape", s));
      return set(e.out[0], s);
    }
    if (kind == "Sum" || kind == "Mean" || kind == "ReduceMax" || kind == "ReduceMin") {
      auto d = parse_list(*attr(e, "dims"));
      bool keep = attr(e, "keepdim") != nullptr;
      std::vector<Mono> s;
      const auto& x = *ins[0];
      for (std::size_t i = 0; i < x.size(); ++i) {
        bool red = std::any_of(d.begin(), d.end(), [&](std::int64_t q) { return norm(static_cast<int>(q), x.size()) == static_cast<int>(i); });
        if (!red) s.push_back(x[i]);
        else if (keep) s.push_back(konst(1));
      }
      return set(e.out[0], s);
    }
    if (kind == "Embedding") {
      auto s = *ins[0];
      s.push_back((*ins[1])[1]);
      return set(e.out[0], s);
    }
    if (kind == "EmbeddingGrad") {
      sv.unify(ins[0]->back(), ins[2]->back(), what);
      return set(e.out[0], *ins[2]);
    }
    if (kind == "IndexSelect") {
      auto s = *ins[0];
      s[static_cast<std::size_t>(norm(std::atoi(attr(e, "dim")->c_str()), s.size()))] = (*ins[1])[0];
      return set(e.out[0], s);
    }
    if (kind == "Slice") {
      auto s = *ins[0];
      auto d = static_cast<std::size_t>(norm(std::atoi(attr(e, "dim")->c_str()), s.size()));
      std::int64_t sa, sb, ea, eb, n = val(s[d]);
      parse_affine(*attr(e, "start"), sa, sb);
      parse_affine(*attr(e, "end"), ea, eb);
      std::int64_t len = ea - sa;
      if (eb != sb) throw Fail{what + ": a slice whose length differs between ranks"};
      Mono m;
      if (len == n) m = s[d];
      else if (tp_value() > 0 && len * tp_value() == n) m = mul(s[d], sv.of(sv.tp), -1);
      else if (len > 0 && n % len == 0) m = mul(s[d], konst(n / len), -1);
      else if (std::int64_t g = len > 0 ? std::gcd(len, n) : 1; g > 1) m = mul(mul(s[d], konst(n / g), -1), konst(len / g));  // (len/g) parts of n/g
      else m = sv.literal(len);
      rw(affine("start", sa, sb, &m));
      rw(affine("end", ea, eb, &m));
      s[d] = m;
      return set(e.out[0], s);
    }
    if (kind == "Split") {
      auto s = *ins[0];
      auto d = static_cast<std::size_t>(norm(std::atoi(attr(e, "dim")->c_str()), s.size()));
      auto sizes = parse_list(*attr(e, "sizes"));
      bool equal = std::all_of(sizes.begin(), sizes.end(), [&](std::int64_t x) { return x == sizes[0]; });
      std::vector<Mono> parts;
      for (auto x : sizes) parts.push_back(equal ? mul(s[d], konst(static_cast<std::int64_t>(sizes.size())), -1) : sv.literal(x));
      rw(list("sizes", parts));
      for (std::size_t k2 = 0; k2 < e.out.size(); ++k2) {
        auto o = s;
        o[d] = parts[k2];
        set(e.out[k2], o);
      }
      return;
    }
    if (kind == "Concat" || kind == "Stack") {
      auto s = *ins[0];
      auto d = static_cast<std::size_t>(norm(std::atoi(attr(e, "dim")->c_str()), kind == "Stack" ? s.size() + 1 : s.size()));
      bool equal = true;
      for (std::size_t i = 1; i < ins.size(); ++i) {
        const auto& t = *ins[i];
        for (std::size_t q = 0; q < s.size(); ++q) {
          if (kind == "Concat" && q == d) {
            equal &= sv.text(t[q]) == sv.text(s[q]);
            continue;
          }
          sv.unify(s[q], t[q], what);
        }
      }
      if (kind == "Stack") s.insert(s.begin() + static_cast<std::ptrdiff_t>(d), konst(static_cast<std::int64_t>(ins.size())));
      else if (equal) s[d] = mul(s[d], konst(static_cast<std::int64_t>(ins.size())));
      else if (auto sum = sum_of_multiples(sv, ins, d)) s[d] = *sum;  // Q | K | V chunks of one size's multiples
      else {
        std::int64_t total = 0;
        for (const auto* t : ins) total += val((*t)[d]);
        s[d] = sv.literal(total);
      }
      return set(e.out[0], s);
    }
    if (kind == "Arange") {
      std::int64_t sa = 0, sb = 0, ea, eb;
      if (const std::string* st = attr(e, "start")) parse_affine(*st, sa, sb);
      parse_affine(*attr(e, "end"), ea, eb);
      if (eb != sb) throw Fail{what + ": an Arange whose length differs between ranks"};
      std::int64_t len = ea - sa;
      if (sa == 0 && sb == 0) {
        Mono m = sv.literal(len);
        Pending p{"end", false, {}, m, {}, {}};
        ++literals;
        rw(p);
        return set(e.out[0], {m});
      }
      if (len != 1) throw Fail{what + ": an Arange that starts elsewhere than 0 is named only for one element"};
      Pending st = affine("start", sa, sb, nullptr);
      Pending en = st;
      en.key = "end", en.suffix = " + 1";
      rw(st);
      rw(en);
      return set(e.out[0], {konst(1)});
    }
    if (kind == "AllReduce" || kind == "Broadcast") return same();
    if (kind == "AllGather" || kind == "ReduceScatter") {
      auto s = *ins[0];
      auto d = static_cast<std::size_t>(norm(std::atoi(attr(e, "dim")->c_str()), s.size()));
      if (plan) s[d] = mul(s[d], sv.of(sv.tp), kind == "AllGather" ? 1 : -1);
      return set(e.out[0], s);
    }
    if (kind == "Wait") return;
    throw Fail{"op " + kind + " has no size rule here"};
  }
  std::int64_t tp_value() const { return sv.tp >= 0 ? sv.atoms[static_cast<std::size_t>(sv.tp)].value : 0; }

  void run(std::vector<EOp>& ops) {
    attrs.assign(ops.size(), {});
    for (std::size_t k = 0; k < ops.size(); ++k) op(ops[k], k);
  }
};

}  // namespace

Symbolized symbolize(const std::vector<InputDecl>& inputs, std::vector<EOp>& spec, std::vector<std::vector<EOp>>& plans, std::int64_t tp, const std::string& axis,
                     bool reduce) {
  Symbolized res;
  Solver sv;
  std::vector<std::vector<Pending>> res_pending;  // every rewritten attribute (its sizes are declared too)
  sv.atoms.push_back({"TP", tp, true, false, false, {}});
  sv.tp = 0;
  std::map<std::string, std::vector<Mono>> global;
  for (const auto& in : inputs) {
    std::vector<Mono> s;
    for (auto v : in.shape) s.push_back(v <= 1 ? konst(v) : sv.of(sv.make(v, false)));
    global[in.name] = s;
  }
  try {
    Walker ws{sv, axis, false, {}, {}, 0};
    for (const auto& [n, s] : global) ws.set(n, s);
    ws.run(spec);
    std::vector<Walker> wp;
    for (auto& ops : plans) {
      Walker w{sv, axis, true, {}, {}, 0};
      for (const auto& in : inputs) {
        auto s = global[in.name];
        if (in.shard_dim >= 0) s[static_cast<std::size_t>(in.shard_dim)] = mul(s[static_cast<std::size_t>(in.shard_dim)], sv.of(sv.tp), -1);
        w.set(in.name, s);
      }
      w.run(ops);
      wp.push_back(std::move(w));
    }
    // Every op walked: the texts come from the final solution.
    std::vector<std::tuple<EOp*, std::string, std::string>> edits;  // all texts first: a failure changes nothing
    auto collect = [&](std::vector<EOp>& ops, Walker& w) {
      for (std::size_t k = 0; k < ops.size(); ++k)
        for (const auto& p : w.attrs[k]) edits.emplace_back(&ops[k], p.key, w.text(p));
      res.literals += w.literals;
      res_pending.insert(res_pending.end(), w.attrs.begin(), w.attrs.end());
    };
    collect(spec, ws);
    for (std::size_t i = 0; i < plans.size(); ++i) collect(plans[i], wp[i]);
    for (const auto& in : inputs) {
      std::string t = "[";
      const auto& s = global[in.name];
      for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + sv.text(s[i]);
      res.shapes[in.name] = t + "]";
    }
    for (auto& [op, key, t] : edits)
      for (auto& [ok, ov] : op->attrs)
        if (ok == key) ov = t;
  } catch (const Fail& f) {
    res.why = f.why;
    return res;
  }
  std::set<int> used;
  auto note = [&](const Mono& m) {
    for (const auto& [a, p] : sv.canon(m).f) used.insert(a);
  };
  for (const auto& [n, s] : global)
    for (const auto& m : s) note(m);
  for (const auto& m : sv.seen) note(m);
  for (const auto& ops : res_pending)
    for (const auto& pend : ops) {
      for (const auto& m : pend.items) note(m);
      if (pend.a) note(*pend.a);
      if (pend.b) note(*pend.b);
    }
  res.sizes.emplace_back("TP", tp);
  for (std::size_t a = 1; a < sv.atoms.size(); ++a)
    if (!sv.atoms[a].eliminated && used.count(static_cast<int>(a))) res.sizes.emplace_back(sv.atoms[a].name, sv.atoms[a].value);
  res.ok = true;
  if (reduce) {
    // Every expression the program holds, over the declared sizes: dims (positive) and offsets (integers).
    std::vector<Mono> dims, offsets;
    for (const auto& [n, s] : global)
      for (const auto& m : s) dims.push_back(sv.canon(m));
    for (const auto& m : sv.seen) dims.push_back(sv.canon(m));
    for (const auto& ops : res_pending)
      for (const auto& pend : ops) {
        for (const auto& m : pend.items) dims.push_back(sv.canon(m));
        if (pend.a) offsets.push_back(sv.canon(*pend.a));
        if (pend.b) offsets.push_back(sv.canon(*pend.b));
      }
    std::vector<int> ids;
    for (std::size_t a = 1; a < sv.atoms.size(); ++a)
      if (!sv.atoms[a].eliminated && used.count(static_cast<int>(a))) ids.push_back(static_cast<int>(a));
    auto ok = [&] {
      for (const auto& m : dims)
        if (auto v = sv.value(m); !v || *v < 1) return false;
      for (const auto& m : offsets)
        if (!sv.value(m)) return false;
      return true;
    };
    std::vector<std::int64_t> orig;
    for (int a : ids) orig.push_back(sv.atoms[static_cast<std::size_t>(a)].value);
    std::vector<std::size_t> order(ids.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return orig[x] > orig[y]; });
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t i : order) {
        Atom& t = sv.atoms[static_cast<std::size_t>(ids[i])];
        std::int64_t floor = std::min<std::int64_t>(orig[i], orig[i] < 64 ? 2 : 4), cur = t.value;
        for (std::int64_t d = floor; d < cur; ++d) {
          if (orig[i] % d) continue;
          t.value = d;
          if (ok()) {
            changed = true;
            break;
          }
          t.value = cur;
        }
      }
    }
    res.reduced.push_back(tp);
    for (int a : ids) res.reduced.push_back(sv.atoms[static_cast<std::size_t>(a)].value);
  }
  return res;
}

void drop_dead_ops(std::vector<EOp>& ops, const std::set<std::string>& roots) {
  std::set<std::string> live = roots, async;  // async: results of collectives with a handle; their readers stay
  for (const auto& e : ops)
    for (const auto& [k, v] : e.attrs)
      if (k == "handle") async.insert(e.out.begin(), e.out.end());
  std::vector<bool> keep(ops.size());
  for (std::size_t k = ops.size(); k-- > 0;) {
    const EOp& e = ops[k];
    bool effect = e.op == "AllReduce" || e.op == "AllGather" || e.op == "ReduceScatter" || e.op == "Broadcast" || e.op == "AllToAll" || e.op == "Wait" ||
                  e.op == "Send" || e.op == "Recv";
    bool used = std::any_of(e.out.begin(), e.out.end(), [&](const std::string& o) { return live.count(o) > 0; }) ||
                std::any_of(e.in.begin(), e.in.end(), [&](const std::string& i) { return async.count(i) > 0; });
    if (!effect && !used) continue;
    keep[k] = true;
    for (const auto& i : e.in) live.insert(i);
  }
  std::vector<EOp> out;
  for (std::size_t k = 0; k < ops.size(); ++k)
    if (keep[k]) out.push_back(std::move(ops[k]));
  ops = std::move(out);
}

}  // namespace spmd::frontends
