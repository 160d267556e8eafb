// interp/num.h - the interpreter's number domain: a real value and, when lanes are on, its image in two prime fields.
//
// Every kernel of interp/ computes on Num, so the numeric oracle (the double `d`) and the equivalence prover
// (the field lanes `f`, `y`) share each op's meaning (issue 11, docs/equivalence.md "The number domain").
// Lanes are off by default (a thread-local flag): then only `d` is computed and the oracle keeps its speed.
// `num::Lanes guard(params)` turns them on for the current thread: two random 62-bit primes and random
// function keys derived from the seed. In lane i a Num means f[i] + k[i] log(y[i]) (y = 1: no log part).
// Comparisons look at `d` only: branches, masks and routing follow the real value, the lanes follow the branch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace spmd::interp {

inline constexpr int kLanes = 2;
using Fp = std::uint64_t;  // a residue modulo the lane's prime (< 2^62)
inline constexpr std::uint32_t kMaxDeg = std::uint32_t{1} << 30;

namespace num {

struct LaneParams {
  std::uint64_t seed = 0;
  bool sets = false;  // max / min reductions as functions of sets (set_extreme)
};

// The thread's lane context (private to num.h / num.cpp; use the functions below). Trivially destructible, so a
// kernel's access to it is a plain thread-local load (no TLS wrapper call per operation).
struct Context {
  bool on = false;
  bool failed = false;           // a field division by zero (or log of a field zero) in this trial
  bool sets = false;             // LaneParams::sets
  std::uint64_t seed = 0;        // LaneParams::seed
  bool sets_full = false;        // set_extreme stopped recording sets (over kMaxSetKeys): the trial proves nothing
  Fp p[kLanes] = {0, 0};         // the primes (2^61 < p < 2^62)
  std::uint64_t bm[kLanes] = {0, 0};   // Barrett constants floor(2^124 / p): a product is reduced without a division
  Fp r64[kLanes] = {0, 0};             // 2^64 mod p (fwide)
  std::uint64_t key[kLanes] = {0, 0};  // random function keys
  std::uint64_t uf_evals = 0;    // random function evaluations (the error bound needs them)
  // Recent inverses per lane (direct-mapped by the argument's low bits): a kernel divides a whole row by one value
  // (a norm's sd, softmax's sum, attention's z) and alternates with a few constants (a mean's 1/n).
  static constexpr int kInvCache = 8;
  Fp inv_arg[kLanes][kInvCache] = {}, inv_val[kLanes][kInvCache] = {};
  // Recent constants (direct-mapped by the double's bits; bits 0 is 0.0, whose lanes are 0): a kernel multiplies
  // every element by one constant (a scale, a frequency), whose conversion (from_double) is slow.
  static constexpr int kConstCache = 16;
  std::uint64_t const_bits[kConstCache] = {};
  Fp const_val[kConstCache][kLanes] = {};
};
extern constinit thread_local Context ctx;

inline bool on() { return ctx.on; }
// Turns the lanes on for this thread while it lives (nesting restores the outer context).
class Lanes {
 public:
  explicit Lanes(const LaneParams& params);
  ~Lanes();
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

 private:
  Context saved_;
  std::vector<std::uint64_t> saved_tags_;  // the outer guard's per-tag evaluation counts (num.cpp)
  void* saved_sets_ = nullptr;             // the outer guard's recorded sets (num.cpp, set_extreme)
};
inline bool trial_failed() { return ctx.failed; }
inline void clear_failed() { ctx.failed = false; }
inline void mark_failed() { ctx.failed = true; }
inline std::uint64_t uf_evaluations() { return ctx.uf_evals; }
// The parameters of this thread's lanes (another thread's Lanes of them computes the same functions).
inline LaneParams lane_params() { return {ctx.seed, ctx.sets}; }
// This thread's random-function evaluations per stage tag, and those of another thread of the same lanes counted
// here (a trial's runs on two threads: their pairs of evaluations can collide too).
std::vector<std::uint64_t> tag_evaluations();
void add_evaluations(const std::vector<std::uint64_t>& per_tag);
// Puts this thread's counts back to `per_tag` (tag_evaluations() taken earlier): a run whose result is not taken.
void restore_evaluations(const std::vector<std::uint64_t>& per_tag);
// Pairs of random-function evaluations that share a stage tag (so a key): sum over tags of U_t (U_t - 1) / 2. Only
// such pairs can collide (evaluations under different tags use independent functions).
double uf_pairs();
inline Fp prime(int lane) { return ctx.p[lane]; }

// Field arithmetic in lane `l` (the context's prime).
inline Fp fadd(Fp a, Fp b, int l) {
  Fp s = a + b;
  return s >= ctx.p[l] ? s - ctx.p[l] : s;
}
inline Fp fsub(Fp a, Fp b, int l) { return a >= b ? a - b : a + ctx.p[l] - b; }
inline Fp fneg(Fp a, int l) { return a ? ctx.p[l] - a : 0; }
inline Fp mulmod(Fp a, Fp b, Fp p) { return static_cast<Fp>(static_cast<unsigned __int128>(a) * b % p); }
// x mod p for x < 2^124 (a product of two residues, or any 64-bit value) in lane l, by Barrett reduction with
// bm = floor(2^124 / p): the quotient estimate is at most 2 below the true one (p > 2^61), so the remainder is
// below 3p < 2^64 and two conditional subtractions finish. The same residue as `x % p`, without a division.
inline Fp freduce(unsigned __int128 x, int l) {
  const Fp p = ctx.p[l];
  auto q = static_cast<std::uint64_t>((static_cast<unsigned __int128>(static_cast<std::uint64_t>(x >> 60)) * ctx.bm[l]) >> 64);
  Fp r = static_cast<std::uint64_t>(x) - q * p;
  if (r >= p) r -= p;
  if (r >= p) r -= p;
  return r;
}
inline Fp fmul(Fp a, Fp b, int l) { return freduce(static_cast<unsigned __int128>(a) * b, l); }
// x mod p for any 128-bit x (a sum of up to 15 products and a residue): x = hi 2^64 + lo is (hi mod p) (2^64 mod p)
// + lo, below (p - 1)^2 + 2^64 <= 2^124 - 2^64 + 3 (p < 2^62), so one more Barrett reduction finishes.
inline Fp fwide(unsigned __int128 x, int l) {
  Fp hi = freduce(static_cast<std::uint64_t>(x >> 64), l);
  return freduce(static_cast<unsigned __int128>(hi) * ctx.r64[l] + static_cast<std::uint64_t>(x), l);
}
Fp powmod(Fp a, std::uint64_t e, Fp p);
// The inverse of `a` in lane l; a zero sets the trial-failed flag and gives 0.
Fp finv_slow(Fp a, int l);
inline Fp finv(Fp a, int l) {
  const auto slot = static_cast<std::size_t>(a & (Context::kInvCache - 1));
  if (a == ctx.inv_arg[l][slot] && a) return ctx.inv_val[l][slot];
  return finv_slow(a, l);
}
// Deterministic Miller-Rabin for 64-bit n.
bool is_prime(std::uint64_t n);
// The field value of a double in lane l: the nearest fraction with denominator <= 2^20 when within 2^-50
// relative, else the double's exact dyadic value (non-finite: 0).
Fp from_double(double x, int l);
Fp from_int(std::int64_t v, int l);
// A random function of (key, stage tag, args) in lane l: a keyed hash reduced modulo the prime; counts an
// evaluation under its tag. Tag 0 is the unstaged key (tags come from stage cuts, see Num::tag).
Fp rf(std::uint64_t key, const Fp* args, int n, int l, std::uint32_t tag = 0);
// Counts `n` evaluations under `tag` without computing them: a caller that reuses the results of evaluations it
// already made for identical arguments (equiv's cut of a value another rank holds bit for bit) keeps the count, and
// so the error bound, what evaluating them again would give.
void count_evaluations(std::uint32_t tag, std::uint64_t n);

// A function key from its name (FNV-1a), for uf().
constexpr std::uint64_t key_of(std::string_view s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

}  // namespace num

struct Num {  // 64 bytes: d, f, y, deg, tag, k
  double d = 0;
  Fp f[kLanes] = {0, 0};
  Fp y[kLanes] = {1, 1};
  std::uint32_t deg = 0;
  // The stage tag: the largest stage cut this value depends on (0: none; docs/equivalence.md, "Stages"). Random
  // functions are keyed by their argument's tag, so each stage evaluates its own independent functions and the
  // error bound counts colliding pairs per stage. Any deterministic tag is sound (a formal identity holds for every
  // choice of the functions, so for the real one in all of them); equal tags in plan and spec keep completeness.
  std::uint32_t tag = 0;
  // The coefficient of the log part: lane i means f + k log(y) (k = 1 when y = 1). Multiplying or dividing by a
  // value with no log part scales k, so a mean of log-sum-exps (a loss averaged per microbatch, then over the
  // microbatches) keeps its log part and equals the mean over all tokens (an extension of EQUIV.md's struct).
  Fp k[kLanes] = {1, 1};

  Num() = default;
  // A constant (degree 0); integers are exact.
  Num(double x) : d(x) {  // NOLINT(google-explicit-constructor): kernels mix literals and values
    if (num::ctx.on && x != 0) [[unlikely]]  // zero is the default's lanes
      set_constant(x);
  }
  // The exact rational n / den (den != 0).
  static Num rational(std::int64_t n, std::int64_t den);
  // An input element: real value x, field values drawn from the hash h of (seed, tensor, global index) so that
  // every run draws the same field value for the same global element (degree 1). Integer data is exact.
  static Num input(double x, std::uint64_t h, bool integer);
  // The shift subtracted in softmax / log-sum-exp for stability: d = the real value, field lanes 0 (the result of
  // those kernels does not depend on the shift).
  static Num stabilizer(double m) {
    Num r;
    r.d = m;
    return r;
  }
  // The lane's value as a plain field element: f + k L(y), L a random function with L(1) = 0.
  Fp pure(int lane) const;
  bool has_log(int lane) const { return y[lane] != 1; }

  Num& operator+=(const Num& b);
  Num& operator-=(const Num& b);
  Num& operator*=(const Num& b);
  Num& operator/=(const Num& b);

 private:
  void set_constant(double x);
};

namespace num {
// The lane parts of the operators (only called with lanes on).
void lanes_add(Num& r, const Num& a, const Num& b);
void lanes_sub(Num& r, const Num& a, const Num& b);
void lanes_mul(Num& r, const Num& a, const Num& b);
void lanes_div(Num& r, const Num& a, const Num& b);
void lanes_neg(Num& r, const Num& a);
}  // namespace num

namespace num {
// Neither lane has a log part (y = 1, k = 1): the common case, whose lane arithmetic is inlined below. It computes
// what lanes_add / lanes_sub / lanes_mul give for such operands (no log part to combine or make pure).
inline bool plain(const Num& a) { return (a.y[0] == 1) & (a.y[1] == 1); }
inline std::uint32_t deg_mul(std::uint32_t a, std::uint32_t b) {
  std::uint64_t s = std::uint64_t{a} + b;
  return s > kMaxDeg ? kMaxDeg : static_cast<std::uint32_t>(s);
}
}  // namespace num

inline Num operator+(const Num& a, const Num& b) {
  Num r;
  r.d = a.d + b.d;
  if (num::ctx.on) [[unlikely]] {
    if (num::plain(a) && num::plain(b)) {
      for (int l = 0; l < kLanes; ++l) r.f[l] = num::fadd(a.f[l], b.f[l], l);
      r.deg = std::max(a.deg, b.deg), r.tag = std::max(a.tag, b.tag);
    } else {
      num::lanes_add(r, a, b);
    }
  }
  return r;
}
inline Num operator-(const Num& a, const Num& b) {
  Num r;
  r.d = a.d - b.d;
  if (num::ctx.on) [[unlikely]] {
    if (num::plain(a) && num::plain(b)) {
      for (int l = 0; l < kLanes; ++l) r.f[l] = num::fsub(a.f[l], b.f[l], l);
      r.deg = std::max(a.deg, b.deg), r.tag = std::max(a.tag, b.tag);
    } else {
      num::lanes_sub(r, a, b);
    }
  }
  return r;
}
inline Num operator*(const Num& a, const Num& b) {
  Num r;
  r.d = a.d * b.d;
  if (num::ctx.on) [[unlikely]] {
    if (num::plain(a) && num::plain(b)) {
      for (int l = 0; l < kLanes; ++l) r.f[l] = num::fmul(a.f[l], b.f[l], l);
      r.deg = num::deg_mul(a.deg, b.deg), r.tag = std::max(a.tag, b.tag);
    } else {
      num::lanes_mul(r, a, b);
    }
  }
  return r;
}
inline Num operator/(const Num& a, const Num& b) {
  Num r;
  r.d = a.d / b.d;
  if (num::ctx.on) [[unlikely]] {
    if (num::plain(a) && num::plain(b)) {
      for (int l = 0; l < kLanes; ++l) r.f[l] = num::fmul(a.f[l], num::finv(b.f[l], l), l);
      r.deg = num::deg_mul(a.deg, b.deg), r.tag = std::max(a.tag, b.tag);
    } else {
      num::lanes_div(r, a, b);
    }
  }
  return r;
}
// r[i] = a[i] / b[i] for i < n, exactly as operator/ gives each (the same lanes, degree, tag and real value), with
// one field inverse per lane for all the plain quotients (Montgomery's batch inversion: three products each) instead
// of one each. `a` may be null: the dividend 1. r may be a or b.
void div_many(const Num* a, const Num* b, Num* r, std::size_t n);
inline Num operator-(const Num& a) {
  Num r;
  r.d = -a.d;
  if (num::ctx.on) [[unlikely]] {
    if (num::plain(a)) {
      for (int l = 0; l < kLanes; ++l) r.f[l] = num::fneg(a.f[l], l), r.k[l] = a.k[l];
      r.deg = a.deg, r.tag = a.tag;
    } else {
      num::lanes_neg(r, a);
    }
  }
  return r;
}
inline Num& Num::operator+=(const Num& b) { return *this = *this + b; }
inline Num& Num::operator-=(const Num& b) { return *this = *this - b; }
inline Num& Num::operator*=(const Num& b) { return *this = *this * b; }
inline Num& Num::operator/=(const Num& b) { return *this = *this / b; }

// Comparisons look at the real value only (branches, masks, routing).
inline bool operator<(const Num& a, const Num& b) { return a.d < b.d; }
inline bool operator>(const Num& a, const Num& b) { return a.d > b.d; }
inline bool operator<=(const Num& a, const Num& b) { return a.d <= b.d; }
inline bool operator>=(const Num& a, const Num& b) { return a.d >= b.d; }
inline bool operator==(const Num& a, const Num& b) { return a.d == b.d; }

// ---- named functions: d as the double formula the oracle always used, field lanes as docs/equivalence.md says ----
namespace num {
enum class Fn : std::uint64_t {
  Exp = key_of("exp"), Log = key_of("log"), Sqrt = key_of("sqrt"), Rsqrt = key_of("rsqrt"), Silu = key_of("silu"), Gelu = key_of("gelu"),
  Erf = key_of("erf"), Tanh = key_of("tanh"), Relu = key_of("relu"), Abs = key_of("abs"), Cos = key_of("cos"), Sin = key_of("sin"),
};
// The lane part of a named function of one argument (only called with lanes on).
void lanes_fn(Fn fn, Num& r, const Num& a);
void lanes_uf(std::uint64_t key, Num& r, const Num* const* args, int n);
void lanes_max(Num& r, const Num& a, const Num& b, bool max);
void lanes_pick(Num& r, const Num& a, const Num& b, bool max);
inline Num fn1(Fn fn, double d, const Num& a) {
  Num r;
  r.d = d;
  if (ctx.on) [[unlikely]]
    lanes_fn(fn, r, a);
  return r;
}
}  // namespace num

// exp(a + log y) = E(a) * y, E a random function with E(0) = 1.
inline Num exp(const Num& a) { return num::fn1(num::Fn::Exp, std::exp(a.d), a); }
// log(x) = (f 0, y = pure(x)); a field zero fails the trial.
inline Num log(const Num& a) { return num::fn1(num::Fn::Log, std::log(a.d), a); }
inline Num sqrt(const Num& a) { return num::fn1(num::Fn::Sqrt, std::sqrt(a.d), a); }       // S(pure), S random
inline Num rsqrt(const Num& a) { return num::fn1(num::Fn::Rsqrt, 1 / std::sqrt(a.d), a); }  // 1 / S(pure)
// x / (1 + exp(-x)) in the lanes too.
inline Num silu(const Num& a) { return num::fn1(num::Fn::Silu, a.d / (1 + std::exp(-a.d)), a); }
// x/2 * (1 + Erf(x * c)), c the constant 1/sqrt(2), Erf random.
inline Num gelu(const Num& a) { return num::fn1(num::Fn::Gelu, 0.5 * a.d * (1 + std::erf(a.d / std::sqrt(2.0))), a); }
inline Num erf(const Num& a) { return num::fn1(num::Fn::Erf, std::erf(a.d), a); }
inline Num tanh(const Num& a) { return num::fn1(num::Fn::Tanh, std::tanh(a.d), a); }
inline Num relu(const Num& a) { return num::fn1(num::Fn::Relu, a.d > 0 ? a.d : 0.0, a); }  // random function of pure(x)
inline Num abs(const Num& a) { return num::fn1(num::Fn::Abs, std::abs(a.d), a); }          // random function of pure(x)
// cos and sin of an angle: (1 - t^2)/(1 + t^2) and 2t/(1 + t^2) with t = a * T(a^2), T random: cos is even, sin odd
// and cos^2 + sin^2 = 1 (so RoPE and its inverse cancel).
inline Num cos(const Num& a) { return num::fn1(num::Fn::Cos, std::cos(a.d), a); }
inline Num sin(const Num& a) { return num::fn1(num::Fn::Sin, std::sin(a.d), a); }
// max / min of two values: symmetric random functions of the pure values (M(x, x) = x).
inline Num max2(const Num& a, const Num& b) {
  Num r;
  r.d = std::max(a.d, b.d);
  if (num::ctx.on) [[unlikely]]
    num::lanes_max(r, a, b, true);
  return r;
}
inline Num min2(const Num& a, const Num& b) {
  Num r;
  r.d = std::min(a.d, b.d);
  if (num::ctx.on) [[unlikely]]
    num::lanes_max(r, a, b, false);
  return r;
}
// The larger (smaller) of two values by d, ties broken by the lanes: a selection (routing), so a fold of
// pick_max over any grouping and order picks the same element. Reductions (ReduceMax, AllReduce max) use it.
inline Num pick_max(const Num& a, const Num& b) {
  Num r;
  r.d = std::max(a.d, b.d);
  if (num::ctx.on) [[unlikely]]
    num::lanes_pick(r, a, b, true);
  return r;
}
inline Num pick_min(const Num& a, const Num& b) {
  Num r;
  r.d = std::min(a.d, b.d);
  if (num::ctx.on) [[unlikely]]
    num::lanes_pick(r, a, b, false);
  return r;
}
// Any other nonlinear scalar function: d given by the caller, the lanes a random function keyed by `key` of the
// pure values of the arguments (degree 1).
inline Num uf(std::uint64_t key, double d, const Num& a) {
  Num r;
  r.d = d;
  const Num* args[] = {&a};
  if (num::ctx.on) [[unlikely]]
    num::lanes_uf(key, r, args, 1);
  return r;
}
inline Num uf(std::uint64_t key, double d, const Num& a, const Num& b) {
  Num r;
  r.d = d;
  const Num* args[] = {&a, &b};
  if (num::ctx.on) [[unlikely]]
    num::lanes_uf(key, r, args, 2);
  return r;
}

// Max and min as functions of sets (docs/equivalence.md, "Max and min reductions"). Only with LaneParams::sets: the
// lanes of a max (min) reduction of xs are a random function of the set of the operands' pure values, where an
// operand that is itself such a result stands for its set (max is associative, commutative and idempotent, so
// max(A u {max B}) = max(A u B)) and a set of one value is that value; d is the real extreme, as pick_max gives.
// A set of exact constants (degree 0: integer data, positions) gives its extreme exactly.
// The real max is one such function of the set, so an identity proved with these lanes holds for it: the equality
// of plan and spec no longer depends on which element the drawn values make the largest.
namespace num {
inline bool sets() { return ctx.sets; }
inline bool sets_full() { return ctx.sets_full; }
inline constexpr std::size_t kMaxSetKeys = std::size_t{1} << 22;  // recorded set elements per trial (16 bytes each)
Num set_extreme(const Num* const* xs, std::size_t n, bool max);
}  // namespace num

static_assert(sizeof(Num) == 64, "Num: one cache line");

}  // namespace spmd::interp
