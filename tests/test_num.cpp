// tests/test_num.cpp - the number domain (interp/num.h): field arithmetic, the log part, the stabilizer, and the
// identities the equivalence prover relies on (ring attention's merge is full attention in the field lanes).
#include <doctest/doctest.h>

#include "interp/runner.h"

using namespace spmd;
using namespace spmd::interp;

namespace {

// Field agreement in every lane (the values as plain field elements).
bool same(const Num& a, const Num& b) {
  for (int l = 0; l < kLanes; ++l)
    if (a.pure(l) != b.pure(l)) return false;
  return true;
}

Num draw(std::uint64_t i) { return Num::input(static_cast<double>(i % 7) * 0.25 - 0.8, mix(1234 + i), false); }

Tensor random_tensor(const Shape& s, std::uint64_t salt) {
  Tensor t(s);
  for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = Num::input(unit(mix(salt * 1000 + i)) * 4 - 2, mix(salt * 7777 + i), false);
  return t;
}

}  // namespace

TEST_CASE("num: lanes are off by default and then only the real value is computed") {
  CHECK(!num::on());
  Num a = 1.5, b = 2.0;
  Num c = a * b + exp(a);
  CHECK(c.d == doctest::Approx(3.0 + std::exp(1.5)));
  CHECK(c.f[0] == 0);
  CHECK(c.y[0] == 1);
  CHECK(c.deg == 0);
}

TEST_CASE("num: primes, field arithmetic and inverses") {
  CHECK(num::is_prime(2));
  CHECK(num::is_prime((std::uint64_t{1} << 61) - 1));
  CHECK(!num::is_prime((std::uint64_t{1} << 61) + 1));
  CHECK(!num::is_prime(3215031751ULL));  // a strong pseudoprime to bases 2, 3, 5, 7
  num::Lanes on({42});
  CHECK(num::on());
  for (int l = 0; l < kLanes; ++l) {
    Fp p = num::prime(l);
    CHECK((p >> 61) == 1);  // 62 bits
    CHECK(num::is_prime(p));
    for (Fp x : {Fp{1}, Fp{2}, Fp{12345}, p - 1, p / 3, p - 2, p / 2, Fp{1} << 61}) CHECK(num::fmul(x, num::finv(x, l), l) == 1);
    // the slow path (the cache bypassed) on random residues
    std::uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 2000; ++i) {
      h = h * 6364136223846793005ULL + 1442695040888963407ULL;
      Fp x = (h >> 2) % p;
      if (x == 0) continue;
      CHECK(num::fmul(x, num::finv_slow(x, l), l) == 1);
    }
  }
  CHECK(num::prime(0) != num::prime(1));
  Num a = draw(1), b = draw(2), c = draw(3);
  CHECK(same((a + b) - b, a));
  CHECK(same(a * b / b, a));
  CHECK(same(a * (b + c), a * b + a * c));
  CHECK(same(-(-a), a));
  CHECK(same((a - b) * (a + b), a * a - b * b));
  CHECK(a.deg == 1);
  CHECK((a * b * c).deg == 3);
  CHECK((a * b + c).deg == 2);
  CHECK(Num(3.0).deg == 0);
  CHECK(!num::trial_failed());
}

TEST_CASE("num: two different polynomials differ in the field lanes, equal ones agree") {
  num::Lanes on({7});
  Num a = draw(10), b = draw(11);
  CHECK(!same((a + b) * (a + b), a * a + b * b));
  CHECK(same((a + b) * (a + b), a * a + Num(2.0) * a * b + b * b));
  CHECK(!same(a * b, a * b + Num::rational(1, 1000000)));  // a difference doubles would round away is still seen
}

TEST_CASE("num: constants are exact fractions or dyadic values") {
  num::Lanes on({3});
  CHECK(same(Num(0.1), Num::rational(1, 10)));
  CHECK(same(Num(1.0 / 3.0), Num::rational(1, 3)));
  CHECK(same(Num(-2.5), Num::rational(-5, 2)));
  CHECK(same(Num(7.0), Num::rational(7, 1)));
  CHECK(same(Num(1e-5), Num::rational(1, 100000)));
  CHECK(same(Num(0.1) * Num(10.0), Num(1.0)));
  double r2 = 1 / std::sqrt(2.0);  // irrational: its exact dyadic value
  CHECK(same(Num(r2) * Num(std::ldexp(1.0, 60)), Num(std::ldexp(r2, 60))));
  CHECK(same(Num(std::ldexp(1.0, 70)) * Num(std::ldexp(1.0, -70)), Num(1.0)));
}

TEST_CASE("num: a constant's lanes are its conversion, through the cache of recent constants and across guards") {
  std::vector<double> xs;
  std::uint64_t h = 0x243f6a8885a308d3ULL;
  for (int i = 0; i < 500; ++i) {  // many more constants than cache slots, each used twice (a hit, or a collision)
    h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    xs.push_back(std::ldexp(static_cast<double>(h >> 11), -50) - 4.0);
  }
  xs.push_back(-0.0), xs.push_back(0.0), xs.push_back(0.1), xs.push_back(-0.1);
  auto check_all = [&] {
    for (int pass = 0; pass < 2; ++pass)
      for (double x : xs) {
        Num c(x);
        for (int l = 0; l < kLanes; ++l) CHECK(c.f[l] == num::from_double(x, l));
        CHECK(c.deg == 0);
      }
  };
  Fp outer;
  {
    num::Lanes on({5});
    check_all();
    outer = Num(0.1).f[0];
    {
      num::Lanes inner({6});  // other primes: no constant of the outer guard is reused
      check_all();
      CHECK(Num(0.1).f[0] != outer);
    }
    CHECK(Num(0.1).f[0] == outer);  // the outer guard's primes (and its cache) are back
    check_all();
  }
}

TEST_CASE("num: the log part: exp(log y) = y, exp(a - log b) = exp(a) / b, log x + log y = log(x y)") {
  num::Lanes on({11});
  Num a = draw(20), x = draw(21), y = draw(22);
  CHECK(same(exp(log(x)), x));
  CHECK(same(exp(a - log(x)), exp(a) / x));
  CHECK(same(exp(log(x) + log(y)), x * y));
  CHECK(same(exp(a + log(x) - log(y)), exp(a) * x / y));
  CHECK(same(exp(-log(x)), Num(1.0) / x));
  CHECK(same(exp(Num(0.0)), Num(1.0)));
  CHECK(same(exp(Num(-INFINITY)), Num(0.0)));
  CHECK(!same(exp(a), a));
  CHECK(!same(exp(a + x), exp(a) * exp(x)));  // not an identity the model has: E is a random function
  CHECK(!num::trial_failed());
}

TEST_CASE("num: sqrt, rsqrt, cos and sin share one meaning") {
  num::Lanes on({5});
  Num a = draw(30), b = draw(31);
  CHECK(same(rsqrt(a), Num(1.0) / sqrt(a)));
  CHECK(same(cos(a) * cos(a) + sin(a) * sin(a), Num(1.0)));
  CHECK(same(cos(-a), cos(a)));
  CHECK(same(sin(-a), -sin(a)));
  CHECK(!same(cos(a), cos(b)));
  CHECK(same(silu(a), a / (Num(1.0) + exp(-a))));
  CHECK(!same(relu(a), a));
  Num u = uf(num::key_of("f"), 0.0, a), v = uf(num::key_of("g"), 0.0, a);
  CHECK(!same(u, v));
  CHECK(same(u, uf(num::key_of("f"), 0.0, a)));
}

TEST_CASE("num: max2 is symmetric, pick_max picks one element whatever the fold order") {
  num::Lanes on({9});
  Num a = draw(40), b = draw(41), c = draw(42);
  CHECK(same(max2(a, b), max2(b, a)));
  CHECK(same(min2(a, b), min2(b, a)));
  CHECK(!same(max2(a, b), min2(a, b)));
  CHECK(same(max2(a, a), a));
  Num left = pick_max(pick_max(a, b), c), right = pick_max(a, pick_max(c, b));
  CHECK(same(left, right));
  CHECK(left.d == std::max({a.d, b.d, c.d}));
}

TEST_CASE("num: a field division by zero fails the trial, never crashes") {
  num::Lanes on({13});
  Num a = draw(50);
  CHECK(!num::trial_failed());
  Num z = a / (a - a);
  (void)z;
  CHECK(num::trial_failed());
  num::clear_failed();
  CHECK(!num::trial_failed());
}

TEST_CASE("num: lanes are deterministic given the seed and restored after the guard") {
  Fp p0, x0;
  {
    num::Lanes on({77});
    p0 = num::prime(0);
    x0 = exp(draw(60) * draw(61)).pure(1);
    CHECK(num::uf_evaluations() > 0);
  }
  CHECK(!num::on());
  {
    num::Lanes on({77});
    CHECK(num::prime(0) == p0);
    CHECK(exp(draw(60) * draw(61)).pure(1) == x0);
    {
      num::Lanes inner({78});
      CHECK(num::prime(0) != p0);
    }
    CHECK(num::prime(0) == p0);
  }
}

TEST_CASE("num: softmax is shift-invariant in the field lanes (blockwise with other shifts)") {
  num::Lanes on({17});
  std::vector<Num> x;
  for (std::uint64_t i = 0; i < 6; ++i) x.push_back(draw(70 + i));
  auto max_of = [](const std::vector<Num>& v, std::size_t lo, std::size_t hi) {
    double m = -INFINITY;
    for (std::size_t i = lo; i < hi; ++i) m = std::max(m, v[i].d);
    return Num::stabilizer(m);
  };
  Num M = max_of(x, 0, 6), m1 = max_of(x, 0, 3), m2 = max_of(x, 3, 6);
  Num z = 0.0, z1 = 0.0, z2 = 0.0;
  for (std::size_t i = 0; i < 6; ++i) z += exp(x[i] - M);
  for (std::size_t i = 0; i < 3; ++i) z1 += exp(x[i] - m1);
  for (std::size_t i = 3; i < 6; ++i) z2 += exp(x[i] - m2);
  Num zb = z1 * exp(m1 - M) + z2 * exp(m2 - M);
  for (std::size_t i = 0; i < 6; ++i) {
    Num full = exp(x[i] - M) / z;
    Num block = exp(x[i] - (i < 3 ? m1 : m2)) * exp((i < 3 ? m1 : m2) - M) / zb;
    CHECK(same(full, block));
    CHECK(full.d == doctest::Approx(block.d));
  }
  // log-sum-exp: M + log(z) equals m1 + log(z1 + z2 exp(m2 - m1))
  CHECK(same(M + log(z), m1 + log(z1 + z2 * exp(m2 - m1))));
}

TEST_CASE("num: ring attention's log-sum-exp merge equals full attention in the field lanes") {
  num::Lanes on({23});
  for (bool causal : {false, true}) {
    // BHSD: batch 1, 2 heads, 3 queries, head dim 2; 4 keys in two blocks of 2
    Tensor q = random_tensor({1, 2, 3, 2}, 1), k = random_tensor({1, 2, 4, 2}, 2), v = random_tensor({1, 2, 4, 2}, 3);
    std::vector<std::int64_t> qpos{1, 2, 3}, kpos{0, 1, 2, 3};
    Tensor full, full_lse;
    attend_kernel(AttnLayout::BHSD, causal, "test", q, k, v, qpos, kpos, full, &full_lse);
    Tensor O, L, o, l;
    attend_kernel(AttnLayout::BHSD, causal, "test", q, slice(k, 2, 0, 2), slice(v, 2, 0, 2), qpos, {0, 1}, O, &L);
    attend_kernel(AttnLayout::BHSD, causal, "test", q, slice(k, 2, 2, 4), slice(v, 2, 2, 4), qpos, {2, 3}, o, &l);
    lse_merge(O, L, o, l);
    REQUIRE(o.shape == full.shape);
    for (std::size_t i = 0; i < o.data.size(); ++i) {
      CHECK(same(o.data[i], full.data[i]));
      CHECK(o.data[i].d == doctest::Approx(full.data[i].d));
    }
    for (std::size_t i = 0; i < l.data.size(); ++i) CHECK(same(l.data[i], full_lse.data[i]));
    // without the rescale (a plain sum of the partial outputs) the lanes see the bug
    Tensor o2, l2, O2, L2;
    attend_kernel(AttnLayout::BHSD, causal, "test", q, slice(k, 2, 0, 2), slice(v, 2, 0, 2), qpos, {0, 1}, O2, &L2);
    attend_kernel(AttnLayout::BHSD, causal, "test", q, slice(k, 2, 2, 4), slice(v, 2, 2, 4), qpos, {2, 3}, o2, &l2);
    CHECK(!same(O2.data[4] + o2.data[4], full.data[4]));  // the last query sees both blocks
  }
  CHECK(!num::trial_failed());
}

TEST_CASE("num: a mean of per-group means of log-sum-exps equals the mean over all (the log part's coefficient)") {
  num::Lanes on({29});
  std::vector<Num> loss;
  for (std::uint64_t i = 0; i < 8; ++i) loss.push_back(log(exp(draw(80 + i)) + exp(draw(90 + i))) - draw(100 + i));
  Num all = 0.0, g1 = 0.0, g2 = 0.0;
  for (std::size_t i = 0; i < 8; ++i) (i < 4 ? g1 : g2) += loss[i], all += loss[i];
  Num mean_all = all / Num(8.0), mean_of_means = (g1 / Num(4.0) + g2 / Num(4.0)) / Num(2.0);
  CHECK(same(mean_all, mean_of_means));
  CHECK(same(Num(2.0) * (all * Num(0.5)), all));
  // the unweighted mean of unequal groups is another value (the gradient-accumulation normalization bug)
  Num g3 = 0.0, g4 = 0.0;
  for (std::size_t i = 0; i < 8; ++i) (i < 2 ? g3 : g4) += loss[i];
  CHECK(!same(mean_all, (g3 / Num(2.0) + g4 / Num(6.0)) / Num(2.0)));
  CHECK(same(mean_all, (g3 + g4) / Num(8.0)));
}

TEST_CASE("num: div_many gives every quotient as operator/ does, with one inverse for the plain ones") {
  num::Lanes on({77});
  std::vector<Num> a, b;
  for (std::uint64_t i = 0; i < 40; ++i) a.push_back(draw(i)), b.push_back(draw(i + 100) + Num(3.0));
  b[5] = Num(0.0);                  // a field zero: fails the trial, as operator/ does
  b[7] = log(draw(3) + Num(5.0));   // a log part: divided one by one
  a[9] = exp(draw(4) - log(b[2]));  // a dividend with a log part
  std::vector<Num> want(a.size()), got(a.size()), ones(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) want[i] = a[i] / b[i], ones[i] = Num(1.0) / b[i];
  num::clear_failed();
  div_many(a.data(), b.data(), got.data(), a.size());
  CHECK(num::trial_failed());
  auto bits_equal = [](const Num& x, const Num& y) {
    bool eq = (x.d == y.d || (std::isnan(x.d) && std::isnan(y.d))) && x.deg == y.deg && x.tag == y.tag;
    for (int l = 0; l < kLanes; ++l) eq = eq && x.f[l] == y.f[l] && x.y[l] == y.y[l] && x.k[l] == y.k[l];
    return eq;
  };
  for (std::size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(bits_equal(got[i], want[i]), "quotient ", i);
  div_many(nullptr, b.data(), got.data(), b.size());  // the dividend 1
  for (std::size_t i = 0; i < b.size(); ++i) CHECK_MESSAGE(bits_equal(got[i], ones[i]), "reciprocal ", i);
  std::vector<Num> in_place = b;  // r may be b
  div_many(nullptr, in_place.data(), in_place.data(), in_place.size());
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(bits_equal(in_place[i], ones[i]));
}

TEST_CASE("num: matmul's lane products are the element loop's, with zero rows and values near the prime") {
  // -1 is p - 1 in a lane: 29 products of (p - 1)^2 pass 2^128 for about half the primes drawn, so the unreduced
  // 128-bit sums must be folded by the count of products taken, also where an element of a is zero (a zero at
  // k = 14 once skipped the fold there)
  for (std::uint64_t seed : {1, 2, 3, 4, 5, 6, 7, 8}) {
    CAPTURE(seed);
    num::Lanes on({seed});
    // the fold itself: any 128-bit value, the largest included
    std::uint64_t h = seed;
    for (int t = 0; t < 1000; ++t)
      for (int l = 0; l < kLanes; ++l) {
        h = mix(h);
        unsigned __int128 x = t == 0 ? ~static_cast<unsigned __int128>(0) : (static_cast<unsigned __int128>(h) << 64) | mix(h + 1);
        CHECK(num::fwide(x, l) == static_cast<Fp>(x % num::prime(l)));
      }
    const std::int64_t m = 4, k = 31, n = 5;
    Tensor a({m, k}), b({k, n});
    for (std::int64_t p = 0; p < k; ++p) {
      a.data[static_cast<std::size_t>(p)] = (p == 14 || p == 29) ? Num(0.0) : Num(-1.0);  // near p, zeros at the fold points
      a.data[static_cast<std::size_t>(k + p)] = draw(static_cast<std::uint64_t>(p));
      a.data[static_cast<std::size_t>(2 * k + p)] = Num(0.0);                              // an empty slot
      a.data[static_cast<std::size_t>(3 * k + p)] = p % 3 ? Num(-1.0) : Num(0.0);
      for (std::int64_t j = 0; j < n; ++j)
        b.data[static_cast<std::size_t>(p * n + j)] = j % 2 ? Num(-1.0) : draw(static_cast<std::uint64_t>(100 + p * n + j));
    }
    Tensor c = interp::matmul(a, b);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        CAPTURE(i);
        CAPTURE(j);
        Num want;
        for (std::int64_t p = 0; p < k; ++p) want += a.data[static_cast<std::size_t>(i * k + p)] * b.data[static_cast<std::size_t>(p * n + j)];
        const Num& got = c.data[static_cast<std::size_t>(i * n + j)];
        CHECK(same(got, want));
        CHECK(got.d == want.d);
        CHECK(got.deg == want.deg);
      }
  }
}

TEST_CASE("num: a batched matmul, a transpose and a sum are the element loops' (b broadcast over trailing batch dims)") {
  // matmul folds the trailing batch dims over which b is broadcast into the rows of one product, transpose copies a
  // row at a time and reduce folds a run of the last dim at a time: each element must be what the plain loops give
  auto bits_equal = [](const Num& x, const Num& y) {
    bool eq = x.d == y.d && x.deg == y.deg && x.tag == y.tag;
    for (int l = 0; l < kLanes; ++l) eq = eq && x.f[l] == y.f[l] && x.y[l] == y.y[l] && x.k[l] == y.k[l];
    return eq;
  };
  auto filled = [](Shape s, std::uint64_t from) {
    Tensor t(std::move(s));
    for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = i % 5 == 3 ? Num(0.0) : draw(from + i);
    return t;
  };
  for (std::uint64_t seed : {1, 2, 3}) {
    CAPTURE(seed);
    num::Lanes on({seed});
    const std::int64_t m = 3, k = 4, n = 5;
    // a [2, 3, m, k] with b [k, n] (both batch dims folded), [3, k, n] (none: b varies), [2, 1, k, n] (the last)
    // and a [1, 3, m, k] broadcast over the first batch dim of b [2, 1, k, n]
    struct Case {
      Shape as, bs;
    };
    for (const Case& cs : {Case{{2, 3, m, k}, {k, n}}, Case{{2, 3, m, k}, {3, k, n}}, Case{{2, 3, m, k}, {2, 1, k, n}},
                           Case{{1, 3, m, k}, {2, 1, k, n}}, Case{{2, 1, m, k}, {3, k, n}}}) {
      Tensor a = filled(cs.as, 10 * seed), b = filled(cs.bs, 1000 + 10 * seed);
      Tensor c = interp::matmul(a, b);
      REQUIRE(c.shape == Shape{2, 3, m, n});
      for (std::int64_t x = 0; x < 2; ++x)
        for (std::int64_t y = 0; y < 3; ++y) {
          auto at = [&](const Tensor& t, std::int64_t rows, std::int64_t cols) {  // the [rows, cols] block at (x, y)
            std::int64_t bx = t.rank() == 4 && t.shape[0] > 1 ? x : 0;
            std::int64_t by = t.rank() >= 3 && t.shape[static_cast<std::size_t>(t.rank() - 3)] > 1 ? y : 0;
            std::int64_t ny = t.rank() >= 3 ? t.shape[static_cast<std::size_t>(t.rank() - 3)] : 1;
            return t.data.data() + (bx * ny + by) * rows * cols;
          };
          const Num *pa = at(a, m, k), *pb = at(b, k, n), *pc = c.data.data() + (x * 3 + y) * m * n;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              Num want;
              for (std::int64_t p = 0; p < k; ++p) want += pa[i * k + p] * pb[p * n + j];
              CHECK(same(pc[i * n + j], want));
              CHECK(pc[i * n + j].d == want.d);
              CHECK(pc[i * n + j].deg == want.deg);
            }
        }
    }
    Tensor t = filled({2, 3, 4, 5}, 77 * seed);
    auto flat = [&](std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) { return t.data[static_cast<std::size_t>(((i0 * 3 + i1) * 4 + i2) * 5 + i3)]; };
    for (auto [d0, d1] : {std::pair{2, 3}, std::pair{0, 3}, std::pair{1, 2}, std::pair{0, 0}}) {
      Tensor u = transpose(t, d0, d1);
      std::int64_t idx[4];
      for (idx[0] = 0; idx[0] < 2; ++idx[0])
        for (idx[1] = 0; idx[1] < 3; ++idx[1])
          for (idx[2] = 0; idx[2] < 4; ++idx[2])
            for (idx[3] = 0; idx[3] < 5; ++idx[3]) {
              std::int64_t o[4] = {idx[0], idx[1], idx[2], idx[3]};
              std::swap(o[d0], o[d1]);
              std::int64_t off = 0;
              for (int q = 0; q < 4; ++q) off = off * u.shape[static_cast<std::size_t>(q)] + o[q];
              CHECK(bits_equal(u.data[static_cast<std::size_t>(off)], flat(idx[0], idx[1], idx[2], idx[3])));
            }
    }
    auto add = [](const Num& x, const Num& y) { return x + y; };
    for (const std::vector<int>& dims : {std::vector<int>{0}, {0, 1}, {1}, {3}, {1, 3}, {0, 1, 2, 3}}) {
      CAPTURE(dims.size());
      for (bool keep : {false, true}) {
        Tensor s = reduce(t, dims, keep, 0.0, add);
        // each output folds its elements in input order, from 0
        std::vector<Num> want(static_cast<std::size_t>(s.numel()), Num(0.0));
        std::int64_t i[4];
        for (i[0] = 0; i[0] < 2; ++i[0])
          for (i[1] = 0; i[1] < 3; ++i[1])
            for (i[2] = 0; i[2] < 4; ++i[2])
              for (i[3] = 0; i[3] < 5; ++i[3]) {
                std::int64_t off = 0;
                const std::int64_t ext[4] = {2, 3, 4, 5};
                for (int q = 0; q < 4; ++q)
                  if (std::find(dims.begin(), dims.end(), q) == dims.end()) off = off * ext[q] + i[q];
                auto& w = want[static_cast<std::size_t>(off)];
                w = add(w, flat(i[0], i[1], i[2], i[3]));
              }
        REQUIRE(s.data.size() == want.size());
        for (std::size_t q = 0; q < want.size(); ++q) CHECK(bits_equal(s.data[q], want[q]));
      }
    }
  }
}
