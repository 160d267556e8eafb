// interp/tensor.cpp - dense tensors of Num: slicing, concatenation, broadcasting, reductions, matmul.
#include "interp/tensor.h"

#include <malloc.h>

#include <algorithm>
#include <bit>

namespace spmd::interp {

namespace {

constexpr std::size_t kCacheCap = std::size_t{128} << 20;  // at most 128 MiB of freed buffers kept per thread

// Freed element buffers by size class (four classes per power of two, from 64 bytes): a run frees and allocates
// tensors of a few sizes over and over, and reusing a block skips malloc's bins and the kernel's page faults.
struct BufferCache {
  std::vector<void*> free[256];
  std::size_t bytes = 0;
  ~BufferCache() {
    for (auto& list : free)
      for (void* p : list) ::operator delete(p);
  }
};
thread_local BufferCache cache;

// The class of a block of `bytes`: its index and its size (bytes rounded up to a quarter of their power of two).
std::size_t size_class(std::size_t bytes, std::size_t& index) {
  bytes = std::max<std::size_t>(bytes, 64);
  int e = std::bit_width(bytes) - 1;  // 2^e <= bytes < 2^(e+1)
  std::size_t step = std::size_t{1} << (e - 2), c = (bytes + step - 1) / step * step;
  index = static_cast<std::size_t>(e) * 4 + (c >> (e - 2)) - 4;  // c / step is 4..8 (8: the next power of two)
  return c;
}

}  // namespace

void tune_heap() {
  // A run allocates many short-lived tensors of a few hundred KB: keep freed memory in the heap instead of returning
  // it to the kernel after every op (glibc's defaults mmap and trim each one, and the kernel zeroes every page again).
  static const bool tuned = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    // One arena for every thread: the value check runs the spec on a second thread, and what one thread frees the
    // other reuses. With an arena per thread each kept its own freed memory (the two held twice what they used, or
    // a trim after every run gave it back and the next run faulted every page in again: DeepSeek-V3-236B's step,
    // 1.5 million page faults and 3.6 GB resident, against 7,000 and 3.1 GB with one arena).
    mallopt(M_ARENA_MAX, 1);
    return true;
  }();
  (void)tuned;
}

void* buffer_alloc(std::size_t bytes) {
  std::size_t i, c = size_class(bytes, i);
  if (i < 256 && !cache.free[i].empty()) {
    void* p = cache.free[i].back();
    cache.free[i].pop_back();
    cache.bytes -= c;
    return p;
  }
  return ::operator new(c);
}

void buffer_free(void* p, std::size_t bytes) {
  std::size_t i, c = size_class(bytes, i);
  if (i >= 256 || cache.bytes + c > kCacheCap) return ::operator delete(p);
  cache.free[i].push_back(p);
  cache.bytes += c;
}

// ---- allocation limits and the element buffer ----------------------------------------------------------------

namespace {

thread_local AllocLimits limits;
thread_local ByteCount own_count;
thread_local ByteCount* count = nullptr;  // (null: own_count; a thread_local pointer needs no TLS wrapper call)

ByteCount& counted() { return count ? *count : own_count; }

}  // namespace

void set_alloc_limits(const AllocLimits& l) { limits = l; }
const AllocLimits& alloc_limits() { return limits; }
std::int64_t live_bytes() { return counted().live.load(std::memory_order_relaxed); }
std::int64_t peak_bytes() { return counted().peak.load(std::memory_order_relaxed); }
void reset_peak_bytes() { counted().peak.store(live_bytes(), std::memory_order_relaxed); }
ByteCount* byte_count() { return &counted(); }
void share_byte_count(ByteCount* c, const AllocLimits& l) { count = c, limits = l; }

namespace {

// 800 MiB, 256 KiB, 1000 bytes.
std::string bytes_text(std::int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1 << 10) && b % (1 << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " bytes";
}

}  // namespace

void throw_too_large(const Shape& s, std::int64_t limit) {
  throw BudgetError("a tensor of shape " + shape_text(s) + " is too large for the interpreter (more than its limit of " + std::to_string(limit) + " elements)");
}

void throw_over_work(std::int64_t limit) {
  throw BudgetError("the run exceeds the interpreter's work limit (" + std::to_string(limit) + " element operations)");
}

void check_elements(const Shape& s) {
  if (numel_of(s) > limits.max_elements) throw_too_large(s, limits.max_elements);
}

void NumBuffer::allocate(std::size_t n) {
  if (n == 0) return;
  if (n > static_cast<std::size_t>(limits.max_elements))
    throw BudgetError("a tensor of " + std::to_string(n) + " elements is too large for the interpreter (more than its limit of " +
                      std::to_string(limits.max_elements) + " elements)");
  auto bytes = static_cast<std::int64_t>(sizeof(Header) + n * sizeof(Num));
  ByteCount& c = counted();
  if (c.live.load(std::memory_order_relaxed) + bytes > limits.max_bytes)
    throw BudgetError("the run is too large for the interpreter: it would hold more than " + bytes_text(limits.max_bytes) + " of tensor values at once", true);
  h_ = ::new (buffer_alloc(static_cast<std::size_t>(bytes))) Header{{1}, n};
  const std::int64_t now = c.live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  for (std::int64_t p = c.peak.load(std::memory_order_relaxed); now > p && !c.peak.compare_exchange_weak(p, now, std::memory_order_relaxed);) {
  }
}

NumBuffer::NumBuffer(std::size_t n, const Num& fill) {
  allocate(n);
  if (h_) std::uninitialized_fill_n(elems(), n, fill);
}

NumBuffer::NumBuffer(std::size_t n, Uninit) { allocate(n); }

void NumBuffer::unshare() {
  NumBuffer copy(size(), Uninit{});
  std::uninitialized_copy_n(elems(), size(), copy.elems());
  std::swap(h_, copy.h_);
}

void NumBuffer::destroy() {
  auto bytes = sizeof(Header) + h_->n * sizeof(Num);
  counted().live.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  h_->~Header();
  buffer_free(h_, bytes);
  h_ = nullptr;
}

Tensor::Tensor(Shape s, const Num& fill) : shape(std::move(s)) {
  check_elements(shape);
  data = NumBuffer(static_cast<std::size_t>(numel_of(shape)), fill);
}

Tensor Tensor::uninit(Shape s) {
  check_elements(s);
  Tensor t;
  t.data = NumBuffer(static_cast<std::size_t>(numel_of(s)), NumBuffer::Uninit{});
  t.shape = std::move(s);
  return t;
}

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d <= 0) return 0;
    if (n > INT64_MAX / d) n = INT64_MAX;
    else n *= d;
  }
  return n;
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[static_cast<std::size_t>(i)] = st[static_cast<std::size_t>(i) + 1] * s[static_cast<std::size_t>(i) + 1];
  return st;
}

namespace {

// outer = product of dims before d, inner = product after d.
void split_at(const Shape& s, int d, std::int64_t& outer, std::int64_t& inner) {
  outer = inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[static_cast<std::size_t>(i)];
  for (int i = d + 1; i < static_cast<int>(s.size()); ++i) inner *= s[static_cast<std::size_t>(i)];
}

}  // namespace

Tensor slice(const Tensor& t, int d, std::int64_t lo, std::int64_t hi) {
  if (d < 0 || d >= t.rank() || lo < 0 || hi < lo || hi > t.shape[static_cast<std::size_t>(d)])
    throw InterpError("cannot take [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of dim " + std::to_string(d) + " of a tensor of shape " +
                      shape_text(t.shape));
  Shape s = t.shape;
  std::int64_t n = s[static_cast<std::size_t>(d)];
  if (lo == 0 && hi == n) return t;  // the whole dim: the same buffer
  s[static_cast<std::size_t>(d)] = hi - lo;
  Tensor out = Tensor::uninit(s);
  std::int64_t outer, inner;
  split_at(t.shape, d, outer, inner);
  std::size_t w = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = lo; i < hi; ++i)
      for (std::int64_t k = 0; k < inner; ++k) out.data[w++] = t.data[static_cast<std::size_t>((o * n + i) * inner + k)];
  return out;
}

Tensor concat(const std::vector<Tensor>& parts, int d) {
  if (parts.empty()) throw InterpError("nothing to concatenate");
  Shape s = parts[0].shape;
  if (d < 0 || d >= static_cast<int>(s.size())) throw InterpError("cannot concatenate along dim " + std::to_string(d) + " of shape " + shape_text(s));
  std::int64_t total = 0;
  for (const auto& p : parts) {
    Shape a = p.shape, b = s;
    if (a.size() != b.size()) throw InterpError("cannot concatenate shapes " + shape_text(p.shape) + " and " + shape_text(s));
    a[static_cast<std::size_t>(d)] = b[static_cast<std::size_t>(d)] = 0;
    if (a != b) throw InterpError("cannot concatenate shapes " + shape_text(p.shape) + " and " + shape_text(s) + " along dim " + std::to_string(d));
    total += p.shape[static_cast<std::size_t>(d)];
  }
  if (parts.size() == 1) return parts[0];  // the same buffer
  s[static_cast<std::size_t>(d)] = total;
  Tensor out = Tensor::uninit(s);
  std::int64_t outer, inner;
  split_at(s, d, outer, inner);
  std::size_t w = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& p : parts) {
      std::int64_t n = p.shape[static_cast<std::size_t>(d)] * inner;
      std::copy_n(p.data.begin() + static_cast<std::ptrdiff_t>(o * n), n, out.data.begin() + static_cast<std::ptrdiff_t>(w));
      w += static_cast<std::size_t>(n);
    }
  return out;
}

Tensor transpose(const Tensor& t, int d0, int d1) {
  if (d0 < 0 || d1 < 0 || d0 >= t.rank() || d1 >= t.rank()) throw InterpError("transpose dims out of range for " + shape_text(t.shape));
  Shape s = t.shape;
  std::swap(s[static_cast<std::size_t>(d0)], s[static_cast<std::size_t>(d1)]);
  Tensor out = Tensor::uninit(s);
  if (out.data.size() == 0) return out;
  Shape in_st = strides_of(t.shape);
  std::swap(in_st[static_cast<std::size_t>(d0)], in_st[static_cast<std::size_t>(d1)]);
  // The output in order, a row (its last dim) at a time; the input offset follows the index.
  const std::size_t last = s.size() - 1;
  const std::int64_t row = s[last], step = in_st[last];
  Shape idx(s.size(), 0);
  std::int64_t off = 0;
  const Num* in = t.data.data();
  Num* o = out.data.data();
  for (std::size_t w = 0; w < out.data.size(); w += static_cast<std::size_t>(row)) {
    for (std::int64_t j = 0; j < row; ++j) o[w + static_cast<std::size_t>(j)] = in[off + j * step];
    for (int k = static_cast<int>(last) - 1; k >= 0; --k) {
      auto uk = static_cast<std::size_t>(k);
      off += in_st[uk];
      if (++idx[uk] < s[uk]) break;
      off -= in_st[uk] * s[uk];
      idx[uk] = 0;
    }
  }
  return out;
}

Tensor reshape(const Tensor& t, const Shape& s) {
  if (numel_of(s) != t.numel()) throw InterpError("cannot reshape " + shape_text(t.shape) + " (" + std::to_string(t.numel()) + " elements) to " + shape_text(s));
  Tensor out = t;
  out.shape = s;
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  std::size_t r = std::max(a.size(), b.size());
  Shape s(r);
  for (std::size_t k = 0; k < r; ++k) {
    std::int64_t x = k + a.size() >= r ? a[k + a.size() - r] : 1;
    std::int64_t y = k + b.size() >= r ? b[k + b.size() - r] : 1;
    if (x != y && x != 1 && y != 1) throw InterpError("shapes " + shape_text(a) + " and " + shape_text(b) + " do not broadcast");
    s[k] = x == 1 ? y : x;
  }
  return s;
}

Shape broadcast_strides(const Shape& s, const Shape& out) {
  Shape st = strides_of(s), r(out.size(), 0);
  for (std::size_t k = 0; k < s.size(); ++k) {
    std::size_t o = k + out.size() - s.size();
    r[o] = s[k] == 1 ? 0 : st[k];
  }
  return r;
}

void reduce_layout(const Tensor& t, const std::vector<int>& dims, bool keepdim, Shape& keep, Shape& st_out) {
  keep.clear();
  for (int d = 0; d < t.rank(); ++d) {
    bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!red) keep.push_back(t.shape[static_cast<std::size_t>(d)]);
    else if (keepdim) keep.push_back(1);
  }
  st_out.assign(t.shape.size(), 0);
  Shape os = strides_of(keep);
  std::size_t k = 0;
  for (int d = 0; d < t.rank(); ++d) {
    bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (red && !keepdim) continue;
    st_out[static_cast<std::size_t>(d)] = red ? 0 : os[k];
    ++k;
  }
}

void group_layout(const Shape& s, const std::vector<int>& dims, std::vector<std::int64_t>& bases, std::vector<std::int64_t>& offs) {
  Shape st = strides_of(s);
  offs.assign(1, 0);
  for (int d : dims) {
    std::vector<std::int64_t> next;
    for (auto o : offs)
      for (std::int64_t i = 0; i < s[static_cast<std::size_t>(d)]; ++i) next.push_back(o + i * st[static_cast<std::size_t>(d)]);
    offs = std::move(next);
  }
  std::vector<int> rest;
  for (int d = 0; d < static_cast<int>(s.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) rest.push_back(d);
  bases.assign(1, 0);
  for (int d : rest) {
    std::vector<std::int64_t> next;
    for (auto b : bases)
      for (std::int64_t i = 0; i < s[static_cast<std::size_t>(d)]; ++i) next.push_back(b + i * st[static_cast<std::size_t>(d)]);
    bases = std::move(next);
  }
  if (numel_of(s) == 0) bases.clear();
}

namespace {

// The products' scratch is kept per thread between calls (a run makes many small products); a large one is given
// back after its call (it is not charged to the byte budget: packed b is at most 24 of each element's 64 bytes).
template <class... V>
void release_if_large(V&... v) {
  if ((... + (v.capacity() * sizeof(typename V::value_type))) > (std::size_t{1} << 20)) (..., std::vector<typename V::value_type>().swap(v));
}

// po[m, n] += pa[m, k] x pb[k, n] in doubles, in the order the oracle always used (i, p, j): each output element
// adds its products in the order of p. b's doubles are packed once and a row of the output accumulates apart (a Num
// is 64 bytes: the doubles alone are read 8 to a cache line).
void real_product(const Num* pa, const Num* pb, Num* po, std::int64_t m, std::int64_t k, std::int64_t n) {
  const auto nu = static_cast<std::size_t>(n);
  thread_local std::vector<double> bd, accd;
  bd.resize(static_cast<std::size_t>(k) * nu), accd.resize(nu);
  for (std::size_t q = 0; q < bd.size(); ++q) bd[q] = pb[q].d;
  for (std::int64_t i = 0; i < m; ++i) {
    Num* out = po + i * n;
    for (std::size_t j = 0; j < nu; ++j) accd[j] = out[j].d;
    for (std::int64_t p = 0; p < k; ++p) {
      const double x = pa[i * k + p].d;
      const double* rd = bd.data() + static_cast<std::size_t>(p) * nu;
      for (std::size_t j = 0; j < nu; ++j) accd[j] += x * rd[j];
    }
    for (std::size_t j = 0; j < nu; ++j) out[j].d = accd[j];
  }
  release_if_large(bd, accd);
}

// The same product when no operand has a log part (po starts as zeros): the doubles as real_product with its zero
// rows skipped (the same order, so the same roundings), and the field lanes as the element loop `po += x * y` gives
// them (field sums of products, the degree max_p(deg a + deg b), the largest tag), without forming a Num per
// product. b is packed once: its doubles by rows (the doubles accumulate along a row of the output, as in
// real_product) and each lane by columns, so an output element's lane sum runs in registers over a row of a and a
// column of b, kept unreduced in 128 bits and folded every 15 products (fwide: a product of residues is below 2^124,
// so 15 of them and a residue stay below 2^128; the fold counts products, a zero element of a included).
void lane_product(const Num* pa, const Num* pb, Num* po, std::int64_t m, std::int64_t k, std::int64_t n) {
  if (k == 0) return;
  const auto nu = static_cast<std::size_t>(n);
  const auto ku = static_cast<std::size_t>(k);
  // scratch (release_if_large): b's doubles [k][n], b's lanes [lane][n][k], a row of a
  thread_local std::vector<double> bd, ad, accd;
  thread_local std::vector<Fp> bf, af;
  thread_local std::vector<std::uint32_t> col_tag, col_deg;
  col_tag.assign(nu, 0), col_deg.assign(nu, 0);
  bd.resize(ku * nu), bf.resize(kLanes * nu * ku), ad.resize(ku), af.resize(kLanes * ku), accd.resize(nu);
  for (std::size_t p = 0; p < ku; ++p)
    for (std::size_t j = 0; j < nu; ++j) {
      const Num& y = pb[p * nu + j];
      col_tag[j] = std::max(col_tag[j], y.tag), col_deg[j] = std::max(col_deg[j], y.deg);
      bd[p * nu + j] = y.d;
      for (std::size_t l = 0; l < kLanes; ++l) bf[(l * nu + j) * ku + p] = y.f[l];
    }
  for (std::int64_t i = 0; i < m; ++i) {
    const Num* row_a = pa + i * k;
    std::uint32_t row_tag = 0;
    bool uniform = true, lanes_zero = true;
    for (std::size_t p = 0; p < ku; ++p) {
      const Num& x = row_a[p];
      row_tag = std::max(row_tag, x.tag), uniform &= x.deg == row_a[0].deg;
      ad[p] = x.d;
      for (std::size_t l = 0; l < kLanes; ++l) af[l * ku + p] = x.f[l], lanes_zero &= x.f[l] == 0;
    }
    Num* out = po + i * n;
    for (std::size_t j = 0; j < nu; ++j) accd[j] = out[j].d;
    for (std::size_t p = 0; p < ku; ++p)
      if (const double xd = ad[p]; xd != 0.0) {
        const double* rd = bd.data() + p * nu;
        for (std::size_t j = 0; j < nu; ++j) accd[j] += xd * rd[j];
      }
    for (std::size_t j = 0; j < nu; ++j) {
      out[j].d = accd[j];
      for (std::size_t l = 0; l < kLanes; ++l) {
        const Fp* xa = af.data() + l * ku;
        const Fp* yb = bf.data() + (l * nu + j) * ku;
        unsigned __int128 acc = 0;
        for (std::size_t p0 = 0; p0 < ku && !lanes_zero; p0 += 15) {  // (lanes_zero: an empty slot of a dispatch buffer)
          const std::size_t p1 = std::min(ku, p0 + 15);
          for (std::size_t p = p0; p < p1; ++p) acc += static_cast<unsigned __int128>(xa[p]) * yb[p];
          acc = num::fwide(acc, static_cast<int>(l));
        }
        out[j].f[l] = static_cast<Fp>(acc);
      }
      out[j].tag = std::max(row_tag, col_tag[j]);
      if (uniform) {
        out[j].deg = num::deg_mul(row_a[0].deg, col_deg[j]);
      } else {
        std::uint32_t d = 0;
        for (std::int64_t p = 0; p < k; ++p) d = std::max(d, num::deg_mul(row_a[p].deg, pb[p * n + static_cast<std::int64_t>(j)].deg));
        out[j].deg = d;
      }
    }
  }
  release_if_large(bd, ad, accd, bf, af, col_tag, col_deg);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.rank() < 2 || b.rank() < 2) throw InterpError("matmul needs rank >= 2, got " + shape_text(a.shape) + " and " + shape_text(b.shape));
  std::int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), k2 = b.shape[b.shape.size() - 2], n = b.shape.back();
  if (k != k2) throw InterpError("matmul contracts " + std::to_string(k) + " with " + std::to_string(k2) + " (shapes " + shape_text(a.shape) + " and " + shape_text(b.shape) + ")");
  Shape ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes(ab, bb);
  Shape os = batch;
  os.push_back(m);
  os.push_back(n);
  Tensor out(os);
  Shape sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
  // Trailing batch dims over which b is broadcast and a is whole are rows of one product (x [B, S, H] @ w [H, F] is
  // one [B*S, H] @ [H, F]): each output row is computed as in its own product (the same order, so the same values),
  // and b is packed once for all of them.
  const Shape cs = strides_of(batch);
  std::size_t outer = batch.size();
  std::int64_t rows = m;
  while (outer > 0 && (batch[outer - 1] == 1 || (sb[outer - 1] == 0 && sa[outer - 1] == cs[outer - 1]))) rows *= batch[--outer];
  batch.resize(outer);
  std::int64_t nb = numel_of(batch);
  Shape idx(batch.size(), 0);
  for (std::int64_t bi = 0; bi < nb; ++bi) {
    std::int64_t oa = 0, ob = 0;
    for (std::size_t q = 0; q < batch.size(); ++q) oa += idx[q] * sa[q], ob += idx[q] * sb[q];
    const Num* pa = a.data.data() + oa * m * k;
    const Num* pb = b.data.data() + ob * k * n;
    Num* po = out.data.data() + bi * rows * n;
    const bool b_plain = num::on() && std::all_of(pb, pb + k * n, num::plain);
    if (!num::on()) {  // the oracle's path: the real values only
      real_product(pa, pb, po, rows, k, n);
    } else if (b_plain && std::all_of(pa, pa + rows * k, num::plain)) {
      lane_product(pa, pb, po, rows, k, n);
    } else {
      // each folded product as its own: the plain ones by lane_product (which skips a's zeros in the doubles, as the
      // element loop does not: 0 x inf), the others by the element loop
      for (std::int64_t f = 0; f < rows; f += m) {
        const Num* fa = pa + f * k;
        Num* fo = po + f * n;
        if (b_plain && std::all_of(fa, fa + m * k, num::plain)) {
          lane_product(fa, pb, fo, m, k, n);
          continue;
        }
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t p = 0; p < k; ++p) {
            const Num& x = fa[i * k + p];
            for (std::int64_t j = 0; j < n; ++j) fo[i * n + j] += x * pb[p * n + j];
          }
      }
    }
    for (int q = static_cast<int>(batch.size()) - 1; q >= 0; --q) {
      if (++idx[static_cast<std::size_t>(q)] < batch[static_cast<std::size_t>(q)]) break;
      idx[static_cast<std::size_t>(q)] = 0;
    }
  }
  return out;
}

}  // namespace spmd::interp
