// interp/num.cpp - the field lanes of Num: primes, random functions, constants, and each primitive's lane meaning.
#include "interp/num.h"

#include <cstring>
#include <unordered_map>

namespace spmd::interp {

namespace num {

constinit thread_local Context ctx;

namespace {

// Random-function evaluations per stage tag (docs/equivalence.md, "Stages") since the guard started.
thread_local std::vector<std::uint64_t> tag_evals;

// set_extreme's record: for each value it made, the set it stands for (sorted, distinct, two elements at least), per
// kind (min, max). A value is keyed by its pure lanes.
struct SetKey {
  Fp a = 0, b = 0;
  bool operator==(const SetKey& o) const { return a == o.a && b == o.b; }
  bool operator<(const SetKey& o) const { return a != o.a ? a < o.a : b < o.b; }
};
struct SetKeyHash {
  std::size_t operator()(const SetKey& k) const { return static_cast<std::size_t>(k.a * 0x9e3779b97f4a7c15ULL ^ k.b); }
};
struct SetTables {
  std::unordered_map<SetKey, std::vector<SetKey>, SetKeyHash> of[2];
  std::size_t keys = 0;
  std::vector<SetKey> scratch;
  std::vector<Fp> args;
};
thread_local SetTables* cur_sets = nullptr;

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr std::uint64_t kLogKey = key_of("L: the log part made pure");
constexpr std::uint64_t kTanHalf = key_of("T: tan of the half angle");
constexpr std::uint64_t kMax = key_of("max2"), kMin = key_of("min2");
constexpr std::uint64_t kMaxSet = key_of("max of a set"), kMinSet = key_of("min of a set");
constexpr std::uint64_t kInput = key_of("input element");

std::uint32_t sat(std::uint64_t d) { return d > kMaxDeg ? kMaxDeg : static_cast<std::uint32_t>(d); }

bool any_log(const Num& a) {
  for (int l = 0; l < kLanes; ++l)
    if (a.y[l] != 1) return true;
  return false;
}

// The nearest fraction n/den (den <= 2^20) to x > 0 when within 2^-50 relative: continued-fraction convergents.
bool near_fraction(double x, std::uint64_t& n, std::uint64_t& den) {
  if (!(x > 0x1p-30 && x < 0x1p30)) return false;
  double z = x;
  std::uint64_t h1 = 1, h2 = 0, k1 = 0, k2 = 1;
  for (int it = 0; it < 64; ++it) {
    double a = std::floor(z);
    if (a > 0x1p40) return false;
    auto ai = static_cast<std::uint64_t>(a);
    std::uint64_t h = ai * h1 + h2, k = ai * k1 + k2;
    if (k > (std::uint64_t{1} << 20)) return false;
    double err = std::fma(x, static_cast<double>(k), -static_cast<double>(h));
    if (std::abs(err) <= 0x1p-50 * x * static_cast<double>(k)) {
      n = h, den = k;
      return true;
    }
    h2 = h1, h1 = h, k2 = k1, k1 = k;
    double frac = z - a;
    if (frac <= 0) return false;
    z = 1 / frac;
  }
  return false;
}

}  // namespace

Fp powmod(Fp a, std::uint64_t e, Fp p) {
  Fp r = 1 % p;
  a %= p;
  for (; e; e >>= 1) {
    if (e & 1) r = mulmod(r, a, p);
    a = mulmod(a, a, p);
  }
  return r;
}

Fp finv_slow(Fp a, int l) {
  if (a == 0) {
    ctx.failed = true;
    return 0;
  }
  // the extended Euclidean algorithm (a few times faster than a^(p-2)); |t| <= p < 2^62 fits a signed word
  const Fp p = ctx.p[l];
  std::int64_t t = 0, nt = 1;
  std::uint64_t r = p, nr = a;
  while (nr) {
    std::uint64_t q = r / nr;
    std::int64_t tt = t - static_cast<std::int64_t>(q) * nt;
    t = nt, nt = tt;
    std::uint64_t rr = r - q * nr;
    r = nr, nr = rr;
  }
  Fp v = t < 0 ? static_cast<Fp>(t + static_cast<std::int64_t>(p)) : static_cast<Fp>(t);
  const auto slot = static_cast<std::size_t>(a & (Context::kInvCache - 1));
  ctx.inv_arg[l][slot] = a, ctx.inv_val[l][slot] = v;
  return v;
}

bool is_prime(std::uint64_t n) {
  if (n < 2) return false;
  for (std::uint64_t q : {2ULL, 3ULL, 5ULL, 7ULL, 11ULL, 13ULL, 17ULL, 19ULL, 23ULL, 29ULL, 31ULL, 37ULL})
    if (n % q == 0) return n == q;
  std::uint64_t d = n - 1;
  int s = 0;
  while (!(d & 1)) d >>= 1, ++s;
  for (std::uint64_t a : {2ULL, 3ULL, 5ULL, 7ULL, 11ULL, 13ULL, 17ULL, 19ULL, 23ULL, 29ULL, 31ULL, 37ULL}) {
    Fp x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mulmod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

Fp from_int(std::int64_t v, int l) {
  Fp p = ctx.p[l];
  if (v >= 0) return static_cast<Fp>(v) % p;
  Fp m = (static_cast<Fp>(-(v + 1)) + 1) % p;
  return fneg(m, l);
}

Fp from_double(double x, int l) {
  if (!std::isfinite(x) || x == 0) return 0;
  Fp p = ctx.p[l];
  double ax = std::abs(x);
  Fp v;
  std::uint64_t n, den;
  if (ax < 0x1p53 && ax == std::floor(ax)) {
    v = static_cast<Fp>(ax) % p;
  } else if (near_fraction(ax, n, den)) {
    v = mulmod(n % p, finv(den % p, l), p);
  } else {  // the exact dyadic value m * 2^e
    int e;
    double m = std::frexp(ax, &e);
    auto M = static_cast<std::uint64_t>(std::ldexp(m, 53));
    e -= 53;
    Fp two = e >= 0 ? 2 : (p + 1) / 2;
    v = mulmod(M % p, powmod(two, static_cast<std::uint64_t>(e >= 0 ? e : -e), p), p);
  }
  return x < 0 ? fneg(v, l) : v;
}

void count_evaluations(std::uint32_t tag, std::uint64_t n) {
  ctx.uf_evals += n;
  if (tag_evals.size() <= tag) tag_evals.resize(std::size_t{tag} + 1, 0);
  tag_evals[tag] += n;
}

Fp rf(std::uint64_t key, const Fp* args, int n, int l, std::uint32_t tag) {
  if (l == 0) count_evaluations(tag, 1);
  // the tag's own key (the last one is kept: a kernel evaluates many functions under one tag)
  thread_local std::uint32_t last_tag = 0;
  thread_local std::uint64_t last_tag_key = 0;
  if (tag != last_tag) last_tag = tag, last_tag_key = splitmix(0x7a9ULL + tag);
  std::uint64_t h = splitmix(ctx.key[l] ^ key ^ (tag ? last_tag_key : 0));
  for (int i = 0; i < n; ++i) h = splitmix(h ^ args[i]) + static_cast<std::uint64_t>(i);
  return freduce(splitmix(h), l);
}

std::vector<std::uint64_t> tag_evaluations() { return tag_evals; }

void add_evaluations(const std::vector<std::uint64_t>& per_tag) {
  for (std::size_t t = 0; t < per_tag.size(); ++t)
    if (per_tag[t]) count_evaluations(static_cast<std::uint32_t>(t), per_tag[t]);
}

void restore_evaluations(const std::vector<std::uint64_t>& per_tag) {
  tag_evals = per_tag;
  ctx.uf_evals = 0;
  for (std::uint64_t u : per_tag) ctx.uf_evals += u;
}

double uf_pairs() {
  double pairs = 0;
  for (std::uint64_t u : tag_evals) pairs += static_cast<double>(u) * (static_cast<double>(u) - 1) / 2;
  return pairs;
}

Lanes::Lanes(const LaneParams& params) : saved_(ctx), saved_tags_(std::move(tag_evals)), saved_sets_(cur_sets) {
  tag_evals.clear();
  cur_sets = params.sets ? new SetTables : nullptr;
  Context c;
  c.on = true;
  c.sets = params.sets;
  c.seed = params.seed;
  std::uint64_t s = splitmix(params.seed ^ 0x5eed0f11e1d5ULL);
  for (int l = 0; l < kLanes; ++l) {
    // a prime in (2^61, 2^62), which freduce needs (one past the top starts again from the bottom)
    auto next_prime = [](std::uint64_t x) {
      for (;; x += 2) {
        if (x >> 62) x = (std::uint64_t{1} << 61) + 1;
        if (is_prime(x)) return x;
      }
    };
    std::uint64_t cand = next_prime((splitmix(s + static_cast<std::uint64_t>(l) * 0x1000193ULL) >> 2) | (std::uint64_t{1} << 61) | 1);
    if (l > 0 && cand == c.p[0]) cand = next_prime(cand + 2);  // two lanes, two different primes
    c.p[l] = cand;
    c.bm[l] = static_cast<std::uint64_t>((static_cast<unsigned __int128>(1) << 124) / cand);
    c.r64[l] = static_cast<Fp>((static_cast<unsigned __int128>(1) << 64) % cand);
    c.key[l] = splitmix(s ^ (0xa5a5a5a5ULL + static_cast<std::uint64_t>(l)));
  }
  ctx = c;
}

Lanes::~Lanes() {
  delete cur_sets;
  cur_sets = static_cast<SetTables*>(saved_sets_);
  ctx = saved_;
  tag_evals = std::move(saved_tags_);
}

namespace {

// a + b, or a - b (`neg_b`), lane l: the log parts combine when their coefficients agree, else both are made pure.
void add_lane(Num& r, const Num& a, const Num& b, bool neg_b, int l) {
  Fp fb = neg_b ? fneg(b.f[l], l) : b.f[l];
  Fp yb = b.y[l] == 1 || !neg_b ? b.y[l] : finv(b.y[l], l);
  bool la = a.y[l] != 1, lb = b.y[l] != 1;
  if (la && lb && a.k[l] != b.k[l]) {
    Fp pb = b.pure(l);
    r.f[l] = fadd(a.pure(l), neg_b ? fneg(pb, l) : pb, l), r.y[l] = 1, r.k[l] = 1;
    return;
  }
  r.f[l] = fadd(a.f[l], fb, l);
  r.y[l] = la && lb ? fmul(a.y[l], yb, l) : la ? a.y[l] : yb;
  r.k[l] = la ? a.k[l] : lb ? b.k[l] : 1;
}

std::uint32_t add_deg(const Num& a, const Num& b) { return any_log(a) && any_log(b) ? sat(std::uint64_t{a.deg} + b.deg) : std::max(a.deg, b.deg); }

// a * b or a / b, lane l: (f + k log y) * g = fg + (kg) log y when only one side has a log part; else both pure.
void mul_lane(Num& r, const Num& a, const Num& b, bool div, int l) {
  bool la = a.y[l] != 1, lb = b.y[l] != 1;
  if (la && lb) la = lb = false;
  if (!la && !lb) {
    Fp pa = a.pure(l), pb = b.pure(l);
    r.f[l] = fmul(pa, div ? finv(pb, l) : pb, l), r.y[l] = 1, r.k[l] = 1;
    return;
  }
  if (la) {  // (fa + ka log ya) * pb, or / pb
    Fp g = b.f[l];
    if (div) g = finv(g, l);
    r.f[l] = fmul(a.f[l], g, l), r.k[l] = fmul(a.k[l], g, l), r.y[l] = a.y[l];
    if (r.k[l] == 0) r.y[l] = 1, r.k[l] = 1;
    return;
  }
  // a pure times (fb + kb log yb); a division by a log part is made pure
  if (div) {
    r.f[l] = fmul(a.f[l], finv(b.pure(l), l), l), r.y[l] = 1, r.k[l] = 1;
    return;
  }
  Fp g = a.f[l];
  r.f[l] = fmul(g, b.f[l], l), r.k[l] = fmul(g, b.k[l], l), r.y[l] = b.y[l];
  if (r.k[l] == 0) r.y[l] = 1, r.k[l] = 1;
}

}  // namespace

void lanes_add(Num& r, const Num& a, const Num& b) {
  r.tag = std::max(a.tag, b.tag);
  for (int l = 0; l < kLanes; ++l) add_lane(r, a, b, false, l);
  r.deg = add_deg(a, b);
}

void lanes_sub(Num& r, const Num& a, const Num& b) {
  r.tag = std::max(a.tag, b.tag);
  for (int l = 0; l < kLanes; ++l) add_lane(r, a, b, true, l);
  r.deg = add_deg(a, b);
}

void lanes_neg(Num& r, const Num& a) {
  r.tag = a.tag;
  for (int l = 0; l < kLanes; ++l) r.f[l] = fneg(a.f[l], l), r.y[l] = a.y[l] == 1 ? 1 : finv(a.y[l], l), r.k[l] = a.k[l];
  r.deg = a.deg;
}

void lanes_mul(Num& r, const Num& a, const Num& b) {
  r.tag = std::max(a.tag, b.tag);
  for (int l = 0; l < kLanes; ++l) mul_lane(r, a, b, false, l);
  r.deg = sat(std::uint64_t{a.deg} + b.deg);
}

void lanes_div(Num& r, const Num& a, const Num& b) {
  r.tag = std::max(a.tag, b.tag);
  for (int l = 0; l < kLanes; ++l) mul_lane(r, a, b, true, l);
  r.deg = sat(std::uint64_t{a.deg} + b.deg);
}

}  // namespace num

void div_many(const Num* a, const Num* b, Num* r, std::size_t n) {
  const Num one = 1.0;  // (made here: a constant's lanes are set only while the lanes are on)
  if (!num::ctx.on) {
    for (std::size_t i = 0; i < n; ++i) r[i] = (a ? a[i] : one) / b[i];
    return;
  }
  // The plain quotients with a divisor that is nonzero in every lane take the batch; the rest (a log part, a field
  // zero that fails the trial) are divided one by one as before.
  std::vector<std::size_t> batch;
  batch.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Num& x = a ? a[i] : one;
    if (num::plain(x) && num::plain(b[i]) && std::all_of(b[i].f, b[i].f + kLanes, [](Fp f) { return f != 0; }))
      batch.push_back(i);
    else
      r[i] = x / b[i];
  }
  if (batch.empty()) return;
  std::vector<Fp> pre(batch.size());
  std::vector<Fp> inv(batch.size() * kLanes);
  for (int l = 0; l < kLanes; ++l) {
    Fp acc = 1;
    for (std::size_t k = 0; k < batch.size(); ++k) pre[k] = acc = num::fmul(acc, b[batch[k]].f[l], l);
    Fp t = num::finv(acc, l);  // 1 / (b_0 ... b_last)
    for (std::size_t k = batch.size(); k-- > 0;) {
      inv[k * kLanes + static_cast<std::size_t>(l)] = k ? num::fmul(t, pre[k - 1], l) : t;
      t = num::fmul(t, b[batch[k]].f[l], l);
    }
  }
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const std::size_t i = batch[k];
    const Num& x = a ? a[i] : one;
    Num q;  // operator/'s plain branch with the inverse from the batch
    q.d = x.d / b[i].d;
    for (int l = 0; l < kLanes; ++l) q.f[l] = num::fmul(x.f[l], inv[k * kLanes + static_cast<std::size_t>(l)], l);
    q.deg = num::deg_mul(x.deg, b[i].deg), q.tag = std::max(x.tag, b[i].tag);
    r[i] = q;
  }
}

namespace num {

void lanes_fn(Fn fn, Num& r, const Num& a) {
  auto key = static_cast<std::uint64_t>(fn);
  const std::uint32_t tag = a.tag;
  r.tag = tag;
  auto copy = [&](const Num& v) {
    for (int l = 0; l < kLanes; ++l) r.f[l] = v.f[l], r.y[l] = v.y[l], r.k[l] = v.k[l];
    r.deg = v.deg;
    r.tag = v.tag;
  };
  switch (fn) {
    case Fn::Exp:
      if (a.d == -INFINITY) return copy(Num(0.0));  // exp(-inf) = 0: a masked score, an empty block's log-sum-exp
      for (int l = 0; l < kLanes; ++l) {
        // exp(f + log y) = E(f) y; a log part with another coefficient is made pure first
        Fp f = a.y[l] == 1 || a.k[l] == 1 ? a.f[l] : a.pure(l), y = a.y[l] == 1 || a.k[l] == 1 ? a.y[l] : 1;
        Fp e = f == 0 ? 1 : rf(key, &f, 1, l, tag);
        r.f[l] = fmul(e, y, l), r.y[l] = 1;
      }
      r.deg = any_log(a) ? sat(std::uint64_t{a.deg} + 1) : 1;
      return;
    case Fn::Log:
      for (int l = 0; l < kLanes; ++l) {
        Fp x = a.pure(l);
        if (x == 0) ctx.failed = true, x = 1;
        r.f[l] = 0, r.y[l] = x;
      }
      r.deg = std::max<std::uint32_t>(a.deg, 1);
      return;
    case Fn::Sqrt:
    case Fn::Rsqrt:
      for (int l = 0; l < kLanes; ++l) {
        Fp x = a.pure(l);
        Fp s = rf(static_cast<std::uint64_t>(Fn::Sqrt), &x, 1, l, tag);  // rsqrt(x) = 1 / sqrt(x)
        r.f[l] = fn == Fn::Sqrt ? s : finv(s, l), r.y[l] = 1;
      }
      r.deg = 1;
      return;
    case Fn::Silu: return copy(a / (Num(1.0) + exp(-a)));
    case Fn::Gelu: return copy(Num(0.5) * a * (Num(1.0) + erf(a * Num(1 / std::sqrt(2.0)))));
    case Fn::Cos:
    case Fn::Sin:
      for (int l = 0; l < kLanes; ++l) {
        Fp x = a.pure(l), x2 = fmul(x, x, l);
        Fp t = fmul(x, rf(kTanHalf, &x2, 1, l, tag), l), t2 = fmul(t, t, l);
        Fp inv = finv(fadd(1, t2, l), l);
        r.f[l] = fmul(fn == Fn::Cos ? fsub(1, t2, l) : fadd(t, t, l), inv, l), r.y[l] = 1;
      }
      r.deg = 1;
      return;
    case Fn::Erf:
    case Fn::Tanh:
    case Fn::Relu:
    case Fn::Abs:
      for (int l = 0; l < kLanes; ++l) {
        Fp x = a.pure(l);
        r.f[l] = rf(key, &x, 1, l, tag), r.y[l] = 1;
      }
      r.deg = 1;
      return;
  }
}

void lanes_uf(std::uint64_t key, Num& r, const Num* const* args, int n) {
  Fp xs[8];
  n = std::min(n, 8);
  std::uint32_t tag = 0;
  for (int i = 0; i < n; ++i) tag = std::max(tag, args[i]->tag);
  r.tag = tag;
  for (int l = 0; l < kLanes; ++l) {
    for (int i = 0; i < n; ++i) xs[i] = args[i]->pure(l);
    r.f[l] = rf(key, xs, n, l, tag), r.y[l] = 1;
  }
  r.deg = 1;
}

void lanes_max(Num& r, const Num& a, const Num& b, bool max) {
  bool same = true;
  Fp pa[kLanes], pb[kLanes];
  for (int l = 0; l < kLanes; ++l) pa[l] = a.pure(l), pb[l] = b.pure(l), same &= pa[l] == pb[l];
  r.tag = std::max(a.tag, b.tag);
  for (int l = 0; l < kLanes; ++l) {
    Fp xs[2] = {std::min(pa[l], pb[l]), std::max(pa[l], pb[l])};  // symmetric
    r.f[l] = same ? pa[l] : rf(max ? kMax : kMin, xs, 2, l, r.tag), r.y[l] = 1;
  }
  r.deg = same ? std::max(a.deg, b.deg) : 1;
}

void lanes_pick(Num& r, const Num& a, const Num& b, bool max) {
  bool take_a;
  if (a.d != b.d) take_a = !(max ? a.d < b.d : b.d < a.d);  // as std::max / std::min pick d (a NaN: as they do)
  else {  // a tie: a total order on the lanes, so every fold picks the same element
    take_a = true;
    for (int l = 0; l < kLanes; ++l) {
      if (a.f[l] != b.f[l]) {
        take_a = a.f[l] > b.f[l];
        break;
      }
      if (a.y[l] != b.y[l]) {
        take_a = a.y[l] > b.y[l];
        break;
      }
    }
  }
  const Num& c = take_a ? a : b;
  for (int l = 0; l < kLanes; ++l) r.f[l] = c.f[l], r.y[l] = c.y[l], r.k[l] = c.k[l];
  r.deg = c.deg;
  r.tag = c.tag;
}

Num set_extreme(const Num* const* xs, std::size_t n, bool max) {
  if (n == 0) return Num(max ? -INFINITY : INFINITY);
  // exact constants (integer data, positions): the extreme is one of them, known exactly
  if (std::all_of(xs, xs + n, [](const Num* x) { return x->deg == 0 && x->y[0] == 1 && x->y[1] == 1; })) {
    Num r = *xs[0];
    for (std::size_t i = 1; i < n; ++i) r = max ? pick_max(r, *xs[i]) : pick_min(r, *xs[i]);
    return r;
  }
  SetTables& st = *cur_sets;
  auto& tab = st.of[max ? 1 : 0];
  auto& ks = st.scratch;
  ks.clear();
  double d = xs[0]->d;
  std::uint32_t tag = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Num& x = *xs[i];
    if (i) d = max ? std::max(d, x.d) : std::min(d, x.d);  // the fold pick_max makes (a NaN: as it does)
    tag = std::max(tag, x.tag);
    SetKey k{x.pure(0), x.pure(1)};
    if (auto it = tab.find(k); it != tab.end()) ks.insert(ks.end(), it->second.begin(), it->second.end());
    else ks.push_back(k);
  }
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  if (ks.size() == 1) {  // one value (a recorded set has two at least): the extreme is that value
    Num r = *xs[0];
    r.d = d;
    return r;
  }
  Num r;
  r.d = d;
  r.tag = tag;
  r.deg = 1;
  for (int l = 0; l < kLanes; ++l) {
    st.args.clear();
    for (const SetKey& k : ks) st.args.push_back(l == 0 ? k.a : k.b);
    r.f[l] = rf(max ? kMaxSet : kMinSet, st.args.data(), static_cast<int>(st.args.size()), l, tag);
  }
  if (st.keys + ks.size() > kMaxSetKeys) {
    ctx.sets_full = true;  // not recorded: a later reduction over r would not see its set
    return r;
  }
  st.keys += ks.size();
  tab.emplace(SetKey{r.f[0], r.f[1]}, ks);
  return r;
}

}  // namespace num

Fp Num::pure(int lane) const {
  if (y[lane] == 1) return f[lane];
  return num::fadd(f[lane], num::fmul(k[lane], num::rf(num::kLogKey, &y[lane], 1, lane, tag), lane), lane);
}

void Num::set_constant(double x) {
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const auto slot = static_cast<std::size_t>((bits ^ (bits >> 29) ^ (bits >> 52)) & (num::Context::kConstCache - 1));
  num::Context& c = num::ctx;
  if (c.const_bits[slot] != bits) {
    for (int l = 0; l < kLanes; ++l) c.const_val[slot][l] = num::from_double(x, l);
    c.const_bits[slot] = bits;
  }
  for (int l = 0; l < kLanes; ++l) f[l] = c.const_val[slot][l], y[l] = 1;
  deg = 0;
}

Num Num::rational(std::int64_t n, std::int64_t den) {
  Num r;
  r.d = static_cast<double>(n) / static_cast<double>(den);
  if (num::ctx.on)
    for (int l = 0; l < kLanes; ++l) r.f[l] = num::fmul(num::from_int(n, l), num::finv(num::from_int(den, l), l), l);
  return r;
}

Num Num::input(double x, std::uint64_t h, bool integer) {
  if (!num::ctx.on || integer) return Num(x);
  Num r;  // the lanes are drawn below: converting x to a field constant first would be discarded work
  r.d = x;
  for (int l = 0; l < kLanes; ++l) r.f[l] = num::freduce(num::splitmix(h ^ num::ctx.key[l] ^ num::kInput), l);
  r.deg = 1;
  return r;
}

}  // namespace spmd::interp
